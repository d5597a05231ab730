"""SGLang's ``--ep-dispatch-algorithm lp`` (DeepSeek's LPLB as SGLang 0.5.23 runs it), our own numpy.

What SGLang 0.5.23 does (read in its wheel: ``sglang/srt/eplb/lplb_solver.py``,
``sglang/srt/eplb/expert_location_dispatch.py``, ``sglang/kernels/ops/lplb/torch_solver.py``,
``sglang/kernels/jit/csrc/lplb/{lp_prep,ipm,lp_post,dispatch_probability}.cuh``):

1. Every rank counts its entries per logical expert; an all-reduce gives the global counts
   ``D [E]``, normalised to fractions of the batch (every rank then solves the same LP).
2. The LP, over the EPLB placement (each rank owns a contiguous block of physical slots): an
   expert with one copy keeps its load on that copy's GPU; an expert with several copies splits
   its load over them, ``x_p >= 0`` per copy with ``sum_p x_p = D_e``; minimise ``M`` with every
   GPU's load ``<= M`` (a slack per GPU). Standard form ``A z = b, z >= 0`` with
   ``z = [x, slacks, M, artificial]``; the artificial column is ``b - A 1`` (so ``z = 1`` is
   feasible) and costs 1000, ``M`` costs 1.
3. A barrier (affine-scaling) interior-point method on one SM, 5 iterations from ``z = 1``:
   per iteration ``w = (A Z^2 A^T)^-1 A Z^2 c``, ``d = z (c - A^T w)``,
   ``z <- z (1 - 0.999 d / max(d))``. Accepted when ``max(d) < 0.1``, the artificial
   variable lies in ``[0, 1e-4)`` and ``|A z - b|_inf < 0.05``; otherwise every ``z`` is 0.5
   (every copy of an expert equally likely).
4. Each entry picks a copy of its expert at random with probability ``x_p / sum x`` (uniform
   over the copies where all are 0): a multinomial draw per entry, no locality.

Here: the same LP and the same iteration in float64 numpy (SGLang: float32 on the GPU), and the
per-entry draw with the routing's integer entry hash in place of ``torch.rand`` (every rank
draws the same). ``lp_shares`` exposes the solve (``tests/planner`` checks its max load
against the LP optimum on small cases).
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.base_routing import HASH_MOD, entry_hash, slot_routing
from zepp.planner.types import Placement, Routing

IPM_ITERS = 5  # SGLang's solve_ipm default
STEP = 0.999
ARTIFICIAL_COST = 1000.0


def lp_matrices(placement: Placement, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The LP in standard form for normalised ``counts [E]``: ``(A [NC, NV], b [NC], c [NV],
    copy_slot [P])`` with ``NC = replicated experts + R`` rows and ``NV = P + R + 2`` columns
    (``P`` copies of replicated experts, in global slot order, then slacks, ``M``, artificial)."""
    R, S = placement.slot_expert.shape
    flat = placement.slot_expert.ravel()
    cnt = placement.replica_count
    used = np.flatnonzero(flat >= 0)
    rep = used[cnt[flat[used]] > 1]  # global slots of copies of replicated experts
    single = used[cnt[flat[used]] == 1]
    red_log = np.flatnonzero(cnt > 1)
    row_of = np.full(placement.num_experts, -1, np.int64)
    row_of[red_log] = np.arange(red_log.size)
    nr, P = red_log.size, rep.size
    A = np.zeros((nr + R, P + R + 1))
    A[row_of[flat[rep]], np.arange(P)] = 1.0
    A[nr + rep // S, np.arange(P)] = 1.0
    A[nr + np.arange(R), P + np.arange(R)] = 1.0
    A[nr:, P + R] = -1.0
    single_load = np.bincount(single // S, weights=counts[flat[single]], minlength=R)
    b = np.concatenate([counts[red_log], -single_load])
    A = np.hstack([A, (b - A.sum(1))[:, None]])
    c = np.zeros(P + R + 2)
    c[-2], c[-1] = 1.0, ARTIFICIAL_COST
    return A, b, c, rep


def affine_scaling(A: np.ndarray, b: np.ndarray, c: np.ndarray, iters: int = IPM_ITERS) -> tuple[np.ndarray, bool]:
    """SGLang's barrier iterations from ``z = 1``; returns ``(z [NV], accepted)``."""
    z = np.ones(A.shape[1])
    dmax = np.inf
    for _ in range(iters):
        az2 = A * (z * z)
        w = np.linalg.solve(az2 @ A.T, az2 @ c)
        d = z * (c - A.T @ w)
        dmax = float(d.max())
        z = z * (1.0 - (STEP / dmax if dmax > 1e-9 else 1.0) * d)
    ok = dmax < 0.1 and 0.0 <= z[-1] < 1e-4 and float(np.abs(A @ z - b).max()) < 0.05
    return z, ok


def lp_shares(topk_ids: np.ndarray, placement: Placement, iters: int = IPM_ITERS) -> tuple[np.ndarray, bool]:
    """``(share [R * S], accepted)``: each global slot's expected fraction of the batch's entries
    after SGLang's LP (a single copy: its expert's whole count; a replicated expert's copy: its
    ``x_p``, or an equal split where the solve was not accepted)."""
    ids = topk_ids.ravel()
    counts = np.bincount(ids[ids >= 0], minlength=placement.num_experts).astype(float)
    counts /= max(counts.sum(), 1.0)
    A, b, c, rep = lp_matrices(placement, counts)
    flat = placement.slot_expert.ravel()
    share = np.where(flat >= 0, counts[np.maximum(flat, 0)], 0.0)
    if rep.size == 0:
        return share, True
    z, ok = affine_scaling(A, b, c, iters)
    x = np.maximum(z[:rep.size], 0.0) if ok else np.full(rep.size, 0.5)
    total = np.bincount(flat[rep], weights=x, minlength=placement.num_experts)[flat[rep]]
    share[rep] = np.where(total > 0, x / np.where(total > 0, total, 1.0), 1.0 / placement.replica_count[flat[rep]])
    share[rep] *= counts[flat[rep]]
    return share, ok


def share_draw(share: np.ndarray, cands: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Per entry, a copy drawn with the copies' shares: ``cands [K, C]`` global slots (-1 padded)
    of ``K`` candidate lists, ``row [n]`` each entry's list (uniform over a list whose shares are
    all 0). The draw's weights are laid out once per list (each copy's share, their running sums
    and total) and entry ``i`` draws with the integer hash of ``i``. Returns ``slot [n]``."""
    p = np.where(cands >= 0, share[np.maximum(cands, 0)], 0.0)
    p = np.where(p.sum(1, keepdims=True) > 0, p, (cands >= 0).astype(float))
    total, ends, last = p.sum(1), np.cumsum(p, 1), (cands >= 0).sum(1) - 1
    u = entry_hash(np.arange(row.size, dtype=np.int64)) / HASH_MOD * total[row]
    col = np.zeros(row.size, np.int64)
    for c in range(cands.shape[1]):  # copies whose running share the draw has passed
        col += ends[:, c][row] <= u
    return cands[row, np.minimum(col, last[row])]


def route_lp(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    """SGLang's ``lp`` dispatch: per entry, a copy drawn with the LP's shares (``lp_shares``)
    over its expert's copies (``share_draw``, one candidate list per expert)."""
    share, _ = lp_shares(topk_ids, placement)
    e = np.maximum(topk_ids.ravel(), 0).astype(np.int64)
    return slot_routing(topk_ids, share_draw(share, placement.replicas, e).reshape(topk_ids.shape), placement)
