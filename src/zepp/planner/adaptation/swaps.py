"""Intra-node expert swaps when demand drifts (PAPER.md section 2, item 6).

A node is *out of band* when its busiest GPU's load exceeds ``(1 + C)`` times the node's mean
GPU load. For such a node, per round: sort its GPUs by load, pair the k-th heaviest with the
k-th lightest, and for each pair pick, among the ``candidates`` heaviest slots of the heavy GPU
and the ``candidates`` lightest slots of the light GPU, the exchange that most lowers the
pair's maximum load. Swaps stay inside a node, so the node's expert multiset never changes and
weights only move over NVLink.

Choices where the paper is silent (written down here):

- A slot's load travels with its expert: after exchanging slots ``a`` and ``b`` their loads
  are exchanged too (the per-slot loads describe the demand the replica will keep serving).
- Candidates on the light side are its lightest slots, empty slots (``-1``, load 0) included:
  exchanging a replica with an empty slot is a move.
- Ties between exchanges with the same new pair maximum: smaller ``|load_a - load_b|``
  moved (less disturbance), then lower heavy slot, then lower light slot. GPU ties: lower rank.
- Each pair makes at most one exchange per round; pairs of a round are handled heaviest first.
- "At most ``max_changes_per_gpu`` changed slots per GPU": a slot counts once however often it
  changes; an exchange is skipped if it would push either GPU over the limit.
- A node stops when it is back in band, no pair finds an exchange, or after ``max_rounds``.
- ``copies`` are derived from the old and new placement: every slot whose expert changed to
  ``x >= 0`` copies ``x`` from a slot of the same node holding ``x`` in the *old* placement,
  preferring one whose content does not change (lowest id), else the lowest such slot. Copies
  read old weights, so an executor stages them (double buffer) before overwriting a source.

``gate_swaps`` is the cost gate the simulator's ``zepp-swap`` runs on top (``zepp.sim.run``):
Zepp's routing already keeps replica loads within ``(1 + C)``, so the band test at ``C`` on
routed loads almost never fires; swaps are planned with ``C = 0`` and a node keeps them only
where its busiest GPU's GEMM time drops by more than the copies' exposed time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.types import Placement, relaxation_fraction

@dataclass(frozen=True)
class SwapPlan:
    """Result of ``plan_swaps``.

    ``placement``: the new placement (same shape; each node keeps its expert multiset).
    ``copies [M, 3]`` int64: ``(src_global_slot, dst_global_slot, expert)`` weight copies, src
    and dst always on one node, src holding ``expert`` in the old placement.
    ``slot_load [R * S]`` int64: the input loads permuted with their experts.
    """

    placement: Placement
    copies: np.ndarray
    slot_load: np.ndarray

    @property
    def num_swapped_slots(self) -> int:
        return int(self.copies.shape[0])


def gpu_loads(slot_load: np.ndarray, ranks: int) -> np.ndarray:
    """``[R]`` load per GPU from ``slot_load [R * S]``."""
    return slot_load.reshape(ranks, -1).sum(axis=1)


def out_of_band(gpu_load: np.ndarray, gpus_per_node: int, relaxation: float) -> np.ndarray:
    """``[N]`` bool: node's busiest GPU load ``> (1 + C) * mean`` (exact integer test)."""
    num, den = relaxation_fraction(relaxation)
    per_node = gpu_load.reshape(-1, gpus_per_node).astype(np.int64)
    return per_node.max(axis=1) * gpus_per_node * den > (den + num) * per_node.sum(axis=1)


def _check(placement: Placement, slot_load, max_rounds, max_changes_per_gpu, candidates) -> np.ndarray:
    if not isinstance(placement, Placement):
        raise ZeppInputError(f"placement must be a zepp.planner.types.Placement, got {type(placement).__name__}")
    load = np.asarray(slot_load)
    size = placement.slot_expert.size
    if load.shape != (size,):
        raise ZeppInputError(
            f"slot_load must be [ranks * slots] = [{size}] (one load per global slot), got shape {load.shape}"
        )
    if size and not np.issubdtype(load.dtype, np.integer):
        raise ZeppInputError(f"slot_load must hold integer entry counts, got dtype {load.dtype}")
    if size and load.min() < 0:
        s = int(np.argmin(load))
        raise ZeppInputError(f"slot_load[{s}] = {load[s]} is negative; loads must be >= 0")
    empty_loaded = (placement.slot_expert.ravel() < 0) & (load > 0)
    if empty_loaded.any():
        s = int(np.flatnonzero(empty_loaded)[0])
        raise ZeppInputError(f"slot_load[{s}] = {load[s]} but slot {s} is empty; an empty slot serves nothing")
    for name, v in (("max_rounds", max_rounds), ("max_changes_per_gpu", max_changes_per_gpu),
                    ("candidates", candidates)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ZeppInputError(f"{name} must be an integer >= 0, got {v!r}")
    return load.astype(np.int64)


def plan_swaps(placement: Placement, slot_load, relaxation: float, max_rounds: int = 32,
               max_changes_per_gpu: int = 8, candidates: int = 8) -> SwapPlan:
    """Decide the intra-node swaps for ``placement`` under per-slot loads.

    ``slot_load [R * S]`` int: load (entries) of each global slot, e.g. ``Routing.slot_loads()``.
    ``relaxation`` is ``C``. Returns a ``SwapPlan``; an in-band cluster gives the same placement
    and no copies. Guarantees: each node's expert multiset is kept, no expert is put on a GPU
    already holding it, every exchange lowers its pair's maximum load by at least 1, so no
    node's maximum GPU load grows.
    """
    load = _check(placement, slot_load, max_rounds, max_changes_per_gpu, candidates)
    relaxation_fraction(relaxation)  # validates C
    L = placement.gpus_per_node
    R, S = placement.slot_expert.shape
    se = placement.slot_expert.astype(np.int64).copy()  # [R, S]
    ld = load.reshape(R, S).copy()
    changed = np.zeros((R, S), dtype=bool)
    old = placement.slot_expert.astype(np.int64)

    for node in range(placement.nodes):
        ranks = np.arange(node * L, (node + 1) * L)
        for _ in range(max_rounds):
            g_load = ld[ranks].sum(axis=1)
            if not out_of_band(g_load, L, relaxation)[0]:
                break
            order = ranks[np.lexsort((ranks, -g_load))]  # heaviest first, ties lower rank
            moved = False
            for k in range(L // 2):
                hv, lt = int(order[k]), int(order[L - 1 - k])
                if _exchange(se, ld, changed, hv, lt, max_changes_per_gpu, candidates):
                    moved = True
            if not moved:
                break

    new_flat = se.ravel()
    old_flat = old.ravel()
    dst = np.flatnonzero((new_flat != old_flat) & (new_flat >= 0))
    copies = np.zeros((dst.size, 3), dtype=np.int64)
    stable = new_flat == old_flat
    for i, d in enumerate(dst):
        x = new_flat[d]
        node = d // (L * S)
        lo, hi = node * L * S, (node + 1) * L * S
        holders = lo + np.flatnonzero(old_flat[lo:hi] == x)
        keep = holders[stable[holders]]
        src = keep[0] if keep.size else holders[0]
        copies[i] = (src, d, x)
    new_placement = Placement(se.astype(np.int32), placement.num_experts, L)
    return SwapPlan(new_placement, copies, ld.ravel())


def _exchange(se: np.ndarray, ld: np.ndarray, changed: np.ndarray, hv: int, lt: int, limit: int, cand: int) -> bool:
    """Best exchange between heavy GPU ``hv`` and light GPU ``lt`` (in place); False if none."""
    if cand == 0:
        return False
    h_tot, l_tot = int(ld[hv].sum()), int(ld[lt].sum())
    old_max = max(h_tot, l_tot)
    S = se.shape[1]
    a = np.lexsort((np.arange(S), -ld[hv]))[:cand]  # heavy side: heaviest slots
    b = np.lexsort((np.arange(S), ld[lt]))[:cand]  # light side: lightest slots
    la, lb = ld[hv, a][:, None], ld[lt, b][None, :]
    ea, eb = se[hv, a][:, None], se[lt, b][None, :]
    new_max = np.maximum(h_tot - la + lb, l_tot - lb + la)
    holds_h = np.isin(eb, se[hv]) & (eb >= 0)  # eb would duplicate on hv
    holds_l = np.isin(ea, se[lt]) & (ea >= 0)
    ok = (new_max <= old_max - 1) & ~holds_h & ~holds_l & (ea != eb)
    n_h = changed[hv].sum() + ~changed[hv, a][:, None]
    n_l = changed[lt].sum() + ~changed[lt, b][None, :]
    ok &= (n_h <= limit) & (n_l <= limit)
    if not ok.any():
        return False
    ia, ib = np.nonzero(ok)
    pick = np.lexsort((b[ib], a[ia], np.abs(la - lb)[ia, ib], new_max[ia, ib]))[0]
    sa, sb = int(a[ia[pick]]), int(b[ib[pick]])
    se[hv, sa], se[lt, sb] = se[lt, sb], se[hv, sa]
    ld[hv, sa], ld[lt, sb] = ld[lt, sb], ld[hv, sa]
    changed[hv, sa] = changed[lt, sb] = True
    return True



def gate_swaps(placement: Placement, plan: SwapPlan, slot_load, row_seconds: float, copy_seconds: float) -> SwapPlan:
    """Keep a node's swaps of ``plan`` (from ``plan_swaps(placement, slot_load, ...)``) only where
    they pay within one batch: the drop of the node's busiest GPU load times ``row_seconds`` (a
    row's GEMM seconds on one GPU) must exceed the node's largest *exposed* copy time. A GPU's
    copies (its incoming copies from other GPUs times ``copy_seconds``, one expert's weights over
    NVLink) start with the batch on their own stream and its swapped slots' GEMMs run last, so
    the GEMMs of its other slots (their loads times ``row_seconds``) hide them; only the excess
    is exposed (the dispatch time, which also hides them, is not counted). Nodes that fail keep
    their old slots and loads and get no copies. Returns a ``SwapPlan`` of the same form.
    """
    load = _check(placement, slot_load, 0, 0, 0)
    for name, v in (("row_seconds", row_seconds), ("copy_seconds", copy_seconds)):
        if not np.isfinite(v) or v < 0:
            raise ZeppInputError(f"{name} must be a finite number >= 0 (seconds), got {v!r}")
    L, (R, S) = placement.gpus_per_node, placement.slot_expert.shape
    old_max = gpu_loads(load, R).reshape(-1, L).max(axis=1)
    new_max = gpu_loads(plan.slot_load, R).reshape(-1, L).max(axis=1)
    src_gpu, dst_gpu = plan.copies[:, 0] // S, plan.copies[:, 1] // S
    fed = np.bincount(dst_gpu[src_gpu != dst_gpu], minlength=R)  # [R] copies each GPU waits for
    swapped = np.zeros(R * S, bool)
    swapped[plan.copies[:, 1]] = True
    others = gpu_loads(np.where(swapped, 0, plan.slot_load), R)  # [R] rows whose GEMMs run first
    exposed = np.maximum(fed * copy_seconds - others * row_seconds, 0.0)
    exposed = np.where(fed > 0, exposed, 0.0).reshape(-1, L).max(axis=1)  # [N]
    keep = (old_max - new_max) * row_seconds > exposed  # [N]
    slot_keep = np.repeat(keep, L * S)  # [R * S]
    se = np.where(slot_keep, plan.placement.slot_expert.ravel(), placement.slot_expert.ravel())
    ld = np.where(slot_keep, plan.slot_load, load)
    copies = plan.copies[keep[plan.copies[:, 1] // (L * S)]]
    return SwapPlan(Placement(se.reshape(R, S).astype(np.int32), placement.num_experts, L), copies, ld)
