"""Named simulator plug-ins: what is special to COMET, FAST and MoonEP, beyond a FlowPlan.

A registry row names its plug-ins (``System.plugins``); ``apply(name, ctx)`` lets each one
change the batch's ``Batch`` context before the layer's task graph is built:

- ``comet-allgather`` (COMET, PAPER.md section 7): dispatch is a dense, routing-oblivious
  all-gather: each rank gets its same-index peer's whole shard from every remote node (``N-1``
  concurrent gets), a node barrier, then an NVLink fan-out of those shards to the node's other
  GPUs; the own node's shards arrive over NVLink at once; GEMM tiles wait on per-source flags
  (one 2 us signal wait per source rank before the local / remote rows). Replaces the dispatch
  phase; adds its bytes to the physical floor.
- ``comet-ring-combine`` (COMET, PAPER.md section 7: "GEMM 2 publishes per column-split barriers;
  partials reduce in a ring inside the owner node group and go out with put-with-signal"): the
  hidden columns are split into ``L`` column chunks (one per GPU of a node, as a ring
  reduce-scatter splits them); per node and chunk a node barrier after the node's GEMM 2, then
  ``L-1`` NVLink ring steps that sum the node's partials of the chunk (every token with an entry
  on the node) onto the chunk's GPU, which puts the chunk to every owner rank with a signal
  (concurrent proxy puts); each owner polls one flag per (node, chunk) it receives (2 us each,
  "a signal wait on the receiver costs about 2 us"). Replaces the combine; its NIC bytes replace
  the hop table's in the physical floor. With ``gemm2 = "columns"`` chunk ``c``'s barrier waits
  for GEMM 2's column split ``c`` only, so the ring overlaps the later splits.
- ``fast-rounds`` (FAST): the node-level byte matrix of each phase is decomposed Birkhoff-von
  Neumann style (padded to equal line sums, then bottleneck perfect matchings) into one-to-one
  inter-node rounds; before the rounds each node evens out its GPUs' outgoing bytes over NVLink,
  in a round every node sends to its partner spread evenly over its ``L`` NICs, and after the
  rounds the receiving GPUs forward rows to their GPUs over NVLink. Rounds are synchronous and
  host driven: each ends in a world barrier. Replaces both phases. Simplified: padding slack
  moves no bytes; the unexplained 175-200 ms at 16 nodes is not modelled beyond the rounds.
- ``moonep-pulls`` (MoonEP): every prefetched expert's weights (w1 + w2) are pulled from its home
  rank on the puller's copy stream before any of the puller's GEMMs (cross-node pulls share the
  home NIC).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.routing import moonep_plan
from zepp.planner.types import FlowPlan, Hops


@dataclass
class Batch:
    """One batch's simulation inputs, as the plug-ins see and change them.

    ``cfg``: the ``zepp.sim.run.Config``; ``plan``: its FlowPlan; ``custom_dispatch`` /
    ``custom_combine``: phase replacements (see ``zepp.sim.layer.build_layer``);
    ``weight_copies [M, 2]`` (src rank, dst rank) expert-weight transfers; ``copies_block_gemm``;
    ``extra_nic``: ``(send [R], recv [R])`` bytes outside the hop tables (for the floor).
    """

    cfg: object
    plan: FlowPlan
    custom_dispatch: object = None
    custom_combine: object = None
    weight_copies: np.ndarray | None = None
    copies_block_gemm: str = "swapped"
    extra_nic: tuple | None = None
    tokens_per_rank: int = field(init=False)

    def __post_init__(self):
        self.tokens_per_rank = int(self.plan.routing.topk_ids.shape[1])

    @property
    def cluster(self):
        return self.cfg.cluster

    @property
    def spec(self):
        return self.cfg.spec


def _comet(ctx: Batch) -> None:
    ctx.custom_dispatch = _comet_dispatch(ctx)
    ctx.extra_nic = _add_nic(ctx.extra_nic, _comet_extra_nic(ctx))


def _comet_ring(ctx: Batch) -> None:
    rows_no = comet_node_owner_rows(ctx.plan, ctx.cluster.gpus_per_node)
    ctx.custom_combine = _comet_ring_combine(ctx, rows_no)
    ctx.plan = replace(ctx.plan, combine=Hops.empty())  # the ring's bytes go to the floor as extra_nic
    ctx.extra_nic = _add_nic(ctx.extra_nic, _ring_nic(ctx, rows_no))


def _add_nic(a, b):
    return b if a is None else (a[0] + b[0], a[1] + b[1])


def _fast(ctx: Batch) -> None:
    R, rb = ctx.cluster.ranks, ctx.spec.row_bytes
    d_phase, _ = _fast_phase(ctx, _pair_bytes(ctx.plan.dispatch, R, rb), "dispatch")
    c_phase, _ = _fast_phase(ctx, _pair_bytes(ctx.plan.combine, R, rb), "combine")

    def dispatch(b, pro_tasks):
        done = d_phase(b, pro_tasks)
        arr = np.full(R, done, np.int64)
        return arr, arr

    ctx.custom_dispatch, ctx.custom_combine = dispatch, c_phase


def _moonep(ctx: Batch) -> None:
    pulls = moonep_pulls(ctx.plan)
    L = ctx.cluster.gpus_per_node
    R = ctx.cluster.ranks
    ctx.weight_copies = pulls
    ctx.copies_block_gemm = "all"
    cross = (pulls[:, 0] // L) != (pulls[:, 1] // L)
    wb = float(ctx.spec.expert_weight_bytes)
    ctx.extra_nic = (np.bincount(pulls[cross, 0], minlength=R) * wb, np.bincount(pulls[cross, 1], minlength=R) * wb)


def moonep_pulls(plan: FlowPlan) -> np.ndarray:
    """``[M, 2]`` (home rank, puller rank) of every prefetch slot a ``moonep`` routing filled
    (MoonEP's placement: ``E/R`` home slots, then ``E/R`` prefetch slots per rank)."""
    p = plan.routing.placement
    R = p.ranks
    epr = p.num_experts // R
    pre = p.slot_expert[:, epr:]
    r, s = np.nonzero(pre >= 0)
    return np.stack([pre[r, s] // epr, r], axis=1).astype(np.int64).reshape(-1, 2)


PLUGINS = {"comet-allgather": _comet, "comet-ring-combine": _comet_ring, "fast-rounds": _fast,
           "moonep-pulls": _moonep}


def apply(name: str, ctx: Batch) -> None:
    """Let plug-in ``name`` change ``ctx``."""
    if name not in PLUGINS:
        raise ZeppInputError(f"unknown simulator plug-in {name!r}; choose one of {', '.join(PLUGINS)}")
    PLUGINS[name](ctx)


# ----------------------------------------------------------------------------- COMET


def _comet_dispatch(cfg):
    """COMET's dense all-gather as custom dispatch tasks."""
    cl, spec = cfg.cluster, cfg.spec
    R, L, N = cl.ranks, cl.gpus_per_node, cl.nodes
    T = cfg.tokens_per_rank
    shard = T * float(spec.row_bytes)

    def build(b, pro):
        g = b.g
        r = np.arange(R)
        node, loc = r // L, r % L
        # own-node shards: (n, j) -> (n, i)
        s_, d_ = np.meshgrid(r, r, indexing="ij")
        same = (s_ // L == d_ // L) & (s_ != d_)
        ls, ld = s_[same], d_[same]
        _, lt = b.transfers(ls, ld, np.full(ls.size, shard), "concurrent", "dispatch", "own-node shard")
        g.after(pro[ls], lt)
        # gets from same-index peers of remote nodes
        peer = (node[:, None] != node[None, :]) & (loc[:, None] == loc[None, :])
        gs, gd = np.nonzero(peer)
        ge, gt = b.transfers(gs, gd, np.full(gs.size, shard), "concurrent", "dispatch", "remote shard get")
        g.after(pro[gd], ge)
        local_done = np.zeros(R, np.int64)
        remote_done = np.zeros(R, np.int64)
        for n in range(N):
            mine = np.arange(n * L, (n + 1) * L)
            bar = g.add_fixed(n * L, b.net.node_barrier(L), kind="barrier", stream=None, label="node barrier")
            if N > 1:
                g.after(gt[np.isin(gd, mine)], bar)
            # fan-out: (n, i) -> (n, j) of the N-1 remote shards it fetched
            fs, fd = np.meshgrid(mine, mine, indexing="ij")
            off = fs != fd
            fs, fd = fs[off], fd[off]
            if N > 1:
                fe, ft = b.transfers(fs, fd, np.full(fs.size, (N - 1) * shard), "concurrent", "dispatch", "fan-out")
                g.after(bar, fe)
            for i in mine.tolist():
                # GEMM tiles wait on per-source flags (PAPER.md section 7): one 2 us wait per source rank
                jl = g.add_fixed(i, (L - 1) * b.net.signal, kind="barrier", stream=None, label="local rows")
                g.after(lt[ld == i], jl)
                g.after(pro[i], jl)
                local_done[i] = jl
                jr = g.add_fixed(i, (R - L) * b.net.signal, kind="barrier", stream=None, label="remote rows")
                g.after(bar, jr)
                if N > 1:
                    g.after(ft[fd == i], jr)
                remote_done[i] = jr
        return local_done, remote_done

    return build


def _comet_extra_nic(cfg) -> tuple[np.ndarray, np.ndarray]:
    cl = cfg.cluster
    T = cfg.tokens_per_rank
    b = (cl.nodes - 1) * T * float(cfg.spec.row_bytes)
    return np.full(cl.ranks, b), np.full(cl.ranks, b)


def comet_node_owner_rows(plan: FlowPlan, L: int) -> np.ndarray:
    """``[N, R]`` rows of owner rank ``o``'s tokens with at least one entry computed on node
    ``n`` (the partial rows node ``n`` reduces and returns to ``o``)."""
    r = plan.routing
    R, T, k = r.topk_ids.shape
    N = R // L
    slot = r.slot.reshape(R, T * k).astype(np.int64)
    owner = np.repeat(np.arange(R), T * k).reshape(R, T * k)
    token = np.repeat(np.arange(T), k)[None, :].repeat(R, 0)
    ok = slot >= 0
    node = slot[ok] // r.placement.slots_per_rank // L
    key = (node * R + owner[ok]) * T + token[ok]
    if N * R * T <= 1 << 26:  # distinct keys by marking a dense table (linear, unlike a sort)
        seen = np.zeros(N * R * T, bool)
        seen[key] = True
        return seen.reshape(N * R, T).sum(1, dtype=np.int64).reshape(N, R).astype(float)
    u = np.unique(key)
    return np.bincount(u // T, minlength=N * R).reshape(N, R).astype(float)


def _ring_nic(cfg, rows_no: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NIC bytes of the ring combine: ``(send [R], recv [R])``."""
    cl = cfg.cluster
    R, L, N = cl.ranks, cl.gpus_per_node, cl.nodes
    rb = float(cfg.spec.row_bytes)
    remote = np.arange(N)[:, None] != (np.arange(R) // L)[None, :]  # [N, R]
    out_node = (rows_no * remote).sum(1) * rb  # [N] bytes leaving node n, spread over its L chunk GPUs
    send = np.repeat(out_node / L, L)
    recv = (rows_no * remote).sum(0) * rb
    return send, recv


def _comet_ring_combine(cfg, rows_no: np.ndarray):
    """COMET's combine as custom tasks: ``rows_no [N, R]`` (``comet_node_owner_rows``)."""
    cl = cfg.cluster
    R, L, N = cl.ranks, cl.gpus_per_node, cl.nodes
    rb = float(cfg.spec.row_bytes)

    def build(b, ready):
        g, net = b.g, b.net
        ready = np.asarray(ready, np.int64)
        n_idx, c_idx = np.divmod(np.arange(N * L), L)  # one (node, chunk) per entry; chunk c ends on GPU c
        home = n_idx * L + c_idx
        # per column-split barrier: the node's L GPUs have their partials of the chunk
        bar = g.add_fixed(home, np.full(N * L, net.node_barrier(L)), kind="barrier", stream=None,
                          label="column-split barrier")
        cols = b.column_splits  # [L, ncls, R] with gemm2 == "columns": chunk c waits for split c only
        for j in range(L):
            r = n_idx * L + j
            if cols is None:
                g.after(ready[r], bar)
                continue
            t = cols[c_idx, :, r]  # [N * L, ncls]
            for k in range(t.shape[1]):
                ok = t[:, k] >= 0
                g.after(t[ok, k], bar[ok])
            idle = ~(cols[:, :, r] >= 0).any(axis=(0, 1))  # a rank without GEMM 2 work: its ready task
            g.after(ready[r[idle]], bar[idle])
        chunk_bytes = rows_no.sum(1)[n_idx] * rb / L
        prev = bar
        for s in range(L - 1):  # ring reduce-scatter: chunk c starts on GPU c+1, ends on GPU c
            src = n_idx * L + (c_idx + 1 + s) % L
            dst = n_idx * L + (c_idx + 2 + s) % L
            e, x = b.transfers(src, dst, chunk_bytes, "concurrent", "combine", "ring step")
            g.after(prev, e)
            prev = x
        # put-with-signal of each reduced chunk to every owner rank that has rows in it
        nn, oo = np.nonzero(rows_no)
        cc = np.tile(np.arange(L), nn.size)
        nn, oo = np.repeat(nn, L), np.repeat(oo, L)
        src = nn * L + cc
        keep = src != oo
        src, nn, oo, cc = src[keep], nn[keep], oo[keep], cc[keep]
        e, x = b.transfers(src, oo, rows_no[nn, oo] * rb / L, "concurrent", "combine", "put-with-signal")
        g.after(prev[nn * L + cc], e)
        # owners poll one flag per incoming (node, chunk)
        flags = np.bincount(oo, minlength=R)
        poll = g.add_fixed(np.arange(R), flags * net.signal, kind="barrier", stream=None, label="flag polls")
        g.after(x, poll[oo])
        g.after(prev[np.arange(R)], poll)  # an owner's own chunk (chunk c of node n ends on rank n * L + c)
        done = g.add_fixed(0, 0.0, kind="barrier", stream=None, label="combine done")
        g.after(poll, done)
        return done

    return build


# ----------------------------------------------------------------------------- FAST


def _perfect_matching(support: np.ndarray) -> np.ndarray | None:
    """A perfect matching (``match[row] = col``) in a square boolean bipartite ``support``."""
    n = support.shape[0]
    match_col = np.full(n, -1)
    adj = [np.flatnonzero(support[i]).tolist() for i in range(n)]

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


def bvn_rounds(matrix: np.ndarray, max_rounds: int = 10_000) -> list[tuple[np.ndarray, float]]:
    """Birkhoff-von Neumann decomposition of a non-negative ``[N, N]`` byte matrix (zero
    diagonal) into ``(perm [N], amount)`` rounds: node ``n`` sends up to ``amount`` bytes to
    ``perm[n]`` in the round (``perm[n] == n`` or padding moves nothing). The matrix is first
    padded to equal row and column sums; each round is the perfect matching on the support
    whose smallest entry is largest (bottleneck matching)."""
    M = np.asarray(matrix, float).copy()
    N = M.shape[0]
    if N == 1 or M.sum() == 0:
        return []
    target = max(M.sum(1).max(), M.sum(0).max())
    pad = np.zeros_like(M)
    rdef, cdef = target - M.sum(1), target - M.sum(0)
    for i in range(N):  # north-west corner fill of the deficits
        for j in range(N):
            a = min(rdef[i], cdef[j])
            if a > 0:
                pad[i, j] += a
                rdef[i] -= a
                cdef[j] -= a
    W = M + pad
    rounds = []
    tol = target * 1e-9
    while W.max() > tol and len(rounds) < max_rounds:
        vals = np.unique(W[W > tol])
        lo, hi, best = 0, vals.size - 1, None
        while lo <= hi:  # largest threshold that still has a perfect matching
            mid = (lo + hi) // 2
            m = _perfect_matching(W >= vals[mid] - tol)
            if m is not None:
                best, lo = m, mid + 1
            else:
                hi = mid - 1
        if best is None:
            break
        amt = W[np.arange(N), best].min()
        real = np.minimum(M[np.arange(N), best], amt)
        rounds.append((best, float(amt), real))
        W[np.arange(N), best] -= amt
        M[np.arange(N), best] -= real
    return rounds


def _fast_phase(cfg, bytes_rr: np.ndarray, kind: str):
    """FAST's phase as custom tasks: ``bytes_rr [R, R]`` GPU-to-GPU bytes of the phase."""
    cl = cfg.cluster
    R, L, N = cl.ranks, cl.gpus_per_node, cl.nodes
    node = np.arange(R) // L
    nb = np.zeros((N, N))
    np.add.at(nb, (node[:, None].repeat(R, 1), node[None, :].repeat(R, 0)), bytes_rr)
    np.fill_diagonal(nb, 0)
    rounds = bvn_rounds(nb)

    def build(b, start):
        g, net = b.g, b.net
        start = np.broadcast_to(np.atleast_1d(start), (R,))
        # intra-node traffic and the even-out of each GPU's outgoing bytes (over NVLink)
        intra = [], [], []
        out_b = np.where(node[:, None] != node[None, :], bytes_rr, 0).sum(1)
        for n in range(N):
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
            e, x = b.transfers(s, np.asarray(intra[1]), np.asarray(intra[2]), "concurrent", kind, "intra-node")
            g.after(start[s], e)
            g.after(x, prev)
        for perm, amount, real in rounds:
            moving = np.flatnonzero((perm != np.arange(N)) & (real > 0))
            bar = g.add_fixed(0, net.barrier(R), kind="barrier", stream=None, label="round sync")
            if moving.size:
                src = (moving[:, None] * L + np.arange(L)).ravel()
                dst = (perm[moving][:, None] * L + np.arange(L)).ravel()
                nbytes = np.repeat(real[moving] / L, L)
                e, x = b.transfers(src, dst, nbytes, "serial", kind, "round")
                g.after(prev, e)
                g.after(x, bar)
            else:
                g.after(prev, bar)
            prev = bar
        # receivers forward (L-1)/L of what they got to the right GPU of their node
        recv_b = np.where(node[:, None] != node[None, :], bytes_rr, 0).sum(0)
        fwd = [], [], []
        for n in range(N):
            mine = np.arange(n * L, (n + 1) * L)
            tot = recv_b[mine].sum()
            for i in mine:
                for j in mine:
                    if i != j and tot > 0:
                        fwd[0].append(i), fwd[1].append(j), fwd[2].append(recv_b[j] / L)
        done = g.add_fixed(0, 0.0, kind="barrier", stream=None, label="phase done")
        if fwd[0]:
            e, x = b.transfers(np.asarray(fwd[0]), np.asarray(fwd[1]), np.asarray(fwd[2]), "concurrent", kind,
                               "forward")
            g.after(prev, e)
            g.after(x, done)
        g.after(prev, done)
        return done

    return build, len(rounds)


def _pair_bytes(h: Hops, R: int, row_bytes: int) -> np.ndarray:
    return (np.bincount(h.src.astype(np.int64) * R + h.dst, minlength=R * R) * float(row_bytes)).reshape(R, R)
