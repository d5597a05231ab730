"""FAST's phases (``fast-rounds``): Birkhoff-von Neumann rounds of whole-node transfers.

The node-level byte matrix of each phase is decomposed Birkhoff-von Neumann style (padded to
equal line sums, then bottleneck perfect matchings) into one-to-one inter-node rounds; before
the rounds each node evens out its GPUs' outgoing bytes over NVLink, in a round every node
sends to its partner spread evenly over its ``L`` NICs, and after the rounds the receiving GPUs
forward rows to their GPUs over NVLink. Rounds are synchronous and host driven: each ends in a
world barrier. Replaces both phases. Simplified: padding slack moves no bytes; the unexplained
175-200 ms at 16 nodes is not modelled beyond the rounds.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.types import Hops
from zepp.sim.phases.inputs import BatchInputs


def use_rounds(ctx: BatchInputs) -> None:
    """``fast-rounds``: dispatch and combine each become ``FastRounds``."""
    R, rb = ctx.cluster.ranks, ctx.spec.row_bytes
    dispatch = FastRounds(ctx.cluster, _pair_bytes(ctx.plan.dispatch, R, rb), "dispatch")
    combine = FastRounds(ctx.cluster, _pair_bytes(ctx.plan.combine, R, rb), "combine")
    ctx.custom_dispatch, ctx.custom_combine = dispatch.as_dispatch, combine


def _pair_bytes(h: Hops, R: int, row_bytes: int) -> np.ndarray:
    return (np.bincount(h.src.astype(np.int64) * R + h.dst, minlength=R * R) * float(row_bytes)).reshape(R, R)


# ----------------------------------------------------------------------------- the rounds


def _perfect_matching(support: np.ndarray) -> np.ndarray | None:
    """A perfect matching (``match[row] = col``) in a square boolean bipartite ``support``."""
    n = support.shape[0]
    match_col = np.full(n, -1)
    rows, cols = np.nonzero(support)  # row-major: each row's columns in ascending order
    ends = np.searchsorted(rows, np.arange(n + 1)).tolist()
    cols = cols.tolist()
    adj = [cols[ends[i]:ends[i + 1]] for i in range(n)]

    def augment(i, seen):
        for j in adj[i]:
            if not seen[j]:
                seen[j] = True
                if match_col[j] < 0 or augment(match_col[j], seen):
                    match_col[j] = i
                    return True
        return False

    for i in range(n):
        if not augment(i, [False] * n):
            return None
    out = np.empty(n, np.int64)
    out[match_col] = np.arange(n)
    return out


def _padded(M: np.ndarray) -> tuple[np.ndarray, float]:
    """``M`` padded to equal row and column sums (north-west corner fill of the deficits), and
    that sum."""
    N = M.shape[0]
    target = max(M.sum(1).max(), M.sum(0).max())
    pad = np.zeros_like(M)
    rdef, cdef = target - M.sum(1), target - M.sum(0)
    for i in range(N):
        for j in range(N):
            a = min(rdef[i], cdef[j])
            if a > 0:
                pad[i, j] += a
                rdef[i] -= a
                cdef[j] -= a
    return M + pad, target


def _bottleneck_matching(W: np.ndarray, tol: float) -> np.ndarray | None:
    """The perfect matching on the support of ``W`` whose smallest entry is largest."""
    vals = np.unique(W[W > tol])
    lo, hi, best = 0, vals.size - 1, None
    while lo <= hi:  # largest threshold that still has a perfect matching
        mid = (lo + hi) // 2
        m = _perfect_matching(W >= vals[mid] - tol)
        if m is not None:
            best, lo = m, mid + 1
        else:
            hi = mid - 1
    return best


def bvn_rounds(matrix: np.ndarray, max_rounds: int = 10_000) -> list[tuple[np.ndarray, float, np.ndarray]]:
    """Birkhoff-von Neumann decomposition of a non-negative ``[N, N]`` byte matrix (zero
    diagonal) into ``(perm [N], amount, real [N])`` rounds: node ``n`` sends ``real[n] <=
    amount`` bytes to ``perm[n]`` in the round (``perm[n] == n`` or padding moves nothing). The
    matrix is first padded to equal row and column sums; each round is the perfect matching on
    the support whose smallest entry is largest (bottleneck matching)."""
    M = np.asarray(matrix, float).copy()
    N = M.shape[0]
    if N == 1 or M.sum() == 0:
        return []
    W, target = _padded(M)
    rounds = []
    tol = target * 1e-9
    while W.max() > tol and len(rounds) < max_rounds:
        best = _bottleneck_matching(W, tol)
        if best is None:
            break
        amt = W[np.arange(N), best].min()
        real = np.minimum(M[np.arange(N), best], amt)
        rounds.append((best, float(amt), real))
        W[np.arange(N), best] -= amt
        M[np.arange(N), best] -= real
    return rounds


# ----------------------------------------------------------------------------- the tasks


class FastRounds:
    """FAST's phase as custom tasks (``build_layer``'s ``custom_combine``; ``as_dispatch`` for
    the dispatch): ``bytes_rr [R, R]`` GPU-to-GPU bytes of the phase; called with the layer
    builder and the tasks after which each rank may start, returns the task that ends the phase."""

    def __init__(self, cluster, bytes_rr: np.ndarray, kind: str):
        R, L, N = cluster.ranks, cluster.gpus_per_node, cluster.nodes
        self.R, self.L, self.N, self.kind = R, L, N, kind
        self.bytes_rr = bytes_rr
        self.node = node = np.arange(R) // L
        nb = np.zeros((N, N))
        np.add.at(nb, (node[:, None].repeat(R, 1), node[None, :].repeat(R, 0)), bytes_rr)
        np.fill_diagonal(nb, 0)
        self.rounds = bvn_rounds(nb)

    def as_dispatch(self, b, pro_tasks) -> tuple[np.ndarray, np.ndarray]:
        """The phase as ``custom_dispatch``: every rank's local and remote rows are in once it ends."""
        done = self(b, pro_tasks)
        arr = np.full(self.R, done, np.int64)
        return arr, arr

    def __call__(self, b, start):
        start = np.broadcast_to(np.atleast_1d(start), (self.R,))
        prev = self._intra_node(b, start)
        prev = self._rounds(b, prev)
        return self._forward(b, prev)

    def _intra_node(self, b, start: np.ndarray) -> int:
        """Intra-node traffic and the even-out of each GPU's outgoing bytes over NVLink; returns
        the task the rounds start after."""
        g, L, bytes_rr = b.g, self.L, self.bytes_rr
        intra = [], [], []
        out_b = np.where(self.node[:, None] != self.node[None, :], bytes_rr, 0).sum(1)
        for n in range(self.N):
            mine = np.arange(n * L, (n + 1) * L)
            for i in mine:
                for j in mine:
                    if i != j and bytes_rr[i, j] > 0:
                        intra[0].append(i), intra[1].append(j), intra[2].append(bytes_rr[i, j])
            excess = out_b[mine] - out_b[mine].mean()
            donors, takers = mine[excess > 0], mine[excess < 0]
            for i in donors:
                for j in takers:
                    share = excess[i - n * L] * (-excess[j - n * L]) / (-excess[excess < 0].sum())
                    intra[0].append(i), intra[1].append(j), intra[2].append(share)
        prev = g.add_fixed(0, 0.0, kind="barrier", stream=None, label="rounds start")
        g.after(start, prev)
        if intra[0]:
            s = np.asarray(intra[0])
            e, x = b.transfers(s, np.asarray(intra[1]), np.asarray(intra[2]), "concurrent", self.kind, "intra-node")
            g.after(start[s], e)
            g.after(x, prev)
        return prev

    def _rounds(self, b, prev: int) -> int:
        """One world-synchronised round per matching: node ``n`` sends to ``perm[n]`` over its
        ``L`` NICs (serial puts); returns the last round's barrier."""
        g, L, N = b.g, self.L, self.N
        for perm, amount, real in self.rounds:
            moving = np.flatnonzero((perm != np.arange(N)) & (real > 0))
            bar = g.add_fixed(0, b.net.barrier(self.R), kind="barrier", stream=None, label="round sync")
            if moving.size:
                src = (moving[:, None] * L + np.arange(L)).ravel()
                dst = (perm[moving][:, None] * L + np.arange(L)).ravel()
                nbytes = np.repeat(real[moving] / L, L)
                e, x = b.transfers(src, dst, nbytes, "serial", self.kind, "round")
                g.after(prev, e)
                g.after(x, bar)
            else:
                g.after(prev, bar)
            prev = bar
        return prev

    def _forward(self, b, prev: int) -> int:
        """Receivers forward ``(L-1)/L`` of what they got to the right GPU of their node."""
        g, L = b.g, self.L
        recv_b = np.where(self.node[:, None] != self.node[None, :], self.bytes_rr, 0).sum(0)
        fwd = [], [], []
        for n in range(self.N):
            mine = np.arange(n * L, (n + 1) * L)
            tot = recv_b[mine].sum()
            for i in mine:
                for j in mine:
                    if i != j and tot > 0:
                        fwd[0].append(i), fwd[1].append(j), fwd[2].append(recv_b[j] / L)
        done = g.add_fixed(0, 0.0, kind="barrier", stream=None, label="phase done")
        if fwd[0]:
            e, x = b.transfers(np.asarray(fwd[0]), np.asarray(fwd[1]), np.asarray(fwd[2]), "concurrent", self.kind,
                               "forward")
            g.after(prev, e)
            g.after(x, done)
        g.after(prev, done)
        return done
