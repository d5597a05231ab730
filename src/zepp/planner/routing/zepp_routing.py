"""``zepp``: rotation water-fill under relaxed replica-load bounds, then the vacate pass that cuts
the number of distinct remote nodes per token (PAPER.md section 2.2; the pass is
``zepp_vacate``).

The decisions are made on counts: the water-fill runs on the batch's demand per (source rank,
expert) as vectorised numpy over ``[R, M, C]`` arrays (``M`` experts with several replicas, ``C``
the most replicas of any expert; loops run over sweeps and visit steps only), and its counts
are turned into every entry's replica in one pass (``zepp_assign``).
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.zepp_assign import assign_entries, entry_keys
from zepp.planner.routing.zepp_tables import zepp_tables
from zepp.planner.routing.zepp_vacate import vacate
from zepp.planner.types import Placement, PlanInvariantError, Routing, expert_load_bounds

_NO_BOUND = 1 << 62


def route_zepp(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    """The water-fill, then ``vacate_rounds`` rounds of the vacate pass; the Routing carries C so
    ``validate()`` checks the replica-load bounds ``[floor((1-C) q), ceil((1+C) q)]``."""
    filled = _Filled(topk_ids, placement, relaxation)
    slot = vacate(topk_ids, filled.slot, placement, relaxation, vacate_rounds, filled.slot_counts, filled.node)
    return Routing(topk_ids, slot.reshape(topk_ids.shape), placement, relaxation=relaxation)


def water_fill(topk_ids: np.ndarray, placement: Placement, relaxation: float) -> np.ndarray:
    """Rotation water-fill. Returns ``slot [R, T, k]`` int32 (``-1`` for a missing entry).

    Per expert with several replicas, every source rank visits the replicas in its rotation order
    (own GPU, the other GPUs of its node, then remote nodes in rotation) and at each visit assigns
    as much of its remaining demand as the replica's upper bound allows, while keeping enough
    unassigned demand to lift every replica to its lower bound. All sources take their ``v``-th
    visit together (a step), and where several reach one replica in a step, lower ranks are served
    first (prefix sums); so a plan is a few vectorised steps over ``[R, M, C]`` arrays, not a loop
    over ranks, and maps onto a GPU as a handful of kernels. The entries of (rank ``r``, expert
    ``e``) then fill ``r``'s counts in batch order (``zepp_assign.assign_entries``).

    Invariant kept by every step: unassigned demand >= the summed lower-bound deficits, and no
    replica exceeds its upper bound. Each sweep over the ``C`` visit steps places demand while any
    remains (a deficit is always reachable), so the sweeps end with everything placed.
    """
    return _Filled(topk_ids, placement, relaxation).slot.reshape(topk_ids.shape)


class _Filled:
    """The water-fill of a batch on counts, then its entries assigned: ``slot`` and ``node
    [R, T*k]`` (each entry's replica and its node; home where missing) and, where any expert has
    several replicas, ``slot_counts = (load, lower, upper)``, each ``[R*S]`` int64: the loads and
    bounds of those experts' slots (``None`` otherwise); the other slots, which no vacate move
    enters or leaves, get load 0 and no bounds."""

    def __init__(self, topk_ids: np.ndarray, placement: Placement, relaxation: float):
        tables = zepp_tables(placement)
        keys = entry_keys(topk_ids, placement.num_experts)
        multi = tables.multi
        self.slot_counts = fill = None
        if multi.size:
            fill = _WaterFill(keys.demand[:, multi], placement, relaxation, multi)
            fill.run()
        self.slot, self.node = assign_entries(keys, None if fill is None else fill.assigned, tables, with_node=True)
        if fill is not None:
            slots = tables.multi_slots
            valid = slots >= 0
            out = np.zeros((3, placement.slot_expert.size), np.int64)
            out[1], out[2] = -_NO_BOUND, _NO_BOUND
            for row, per_expert in zip(out, (fill.load, fill.lower[:, None], fill.upper[:, None])):
                row[slots[valid]] = np.broadcast_to(per_expert, slots.shape)[valid]
            self.slot_counts = tuple(out)


def visit_order(placement: Placement, multi: np.ndarray) -> np.ndarray:
    """``[R, M, C]`` replica index (into ``placement.replicas[multi]``) of each source rank's v-th
    visit to each expert of ``multi [M]``: own GPU, then the other GPUs of the node, then remote
    nodes in rotation (n+1, n+2, ...), inside a node by local index rotated from the source's;
    padding replicas last."""
    ranks, L, S = placement.ranks, placement.gpus_per_node, placement.slots_per_rank
    reps = placement.replicas[multi]  # [M, C] global slots, -1 padded
    valid = reps >= 0
    r = np.arange(ranks)[:, None]
    q = np.arange(ranks)[None, :]
    priority = ((q // L - r // L) % (ranks // L)) * L + (q % L - r % L) % L  # [R, R], 0 = visited first
    big = np.iinfo(np.int64).max // 4
    priority = np.where(valid[None], priority[:, np.where(valid, reps // S, 0)], big)
    return np.argsort(priority, axis=2, kind="stable")


class _WaterFill:
    """The sweeps' state over the experts ``multi [M]`` with several replicas, from the demand
    ``remaining [R, M]`` int64 of each source rank (entries of a batch, or the routing table's
    expected demand in integer units: ``zepp.planner.routing.table_routing``).

    ``multi [M]``: the experts; ``remaining [R, M]``: demand of each source not placed yet; ``assigned [R, M, C]``: placed per
    source and replica; ``load [M, C]`` per replica; ``unassigned [M]`` per expert; bounds
    ``lower`` / ``upper [M]``; ``visit [R, M, C]`` (``visit_order``); ``valid [M, C]``.
    """

    def __init__(self, remaining: np.ndarray, placement: Placement, relaxation: float, multi: np.ndarray):
        self.multi = multi
        self.remaining = np.asarray(remaining, np.int64).copy()  # [R, M]
        total = self.remaining.sum(0)
        self.lower, self.upper = expert_load_bounds(total, placement.replica_count.astype(np.int64)[multi], relaxation)
        self.valid = placement.replicas[multi] >= 0
        M, cmax = self.valid.shape
        self.cmax = cmax
        self.visit = visit_order(placement, multi)
        self.load = np.zeros((M, cmax), np.int64)
        self.unassigned = total.copy()
        self.assigned = np.zeros((placement.ranks, M, cmax), np.int64)
        self.experts = np.arange(M)[None, :]

    def run(self) -> None:
        """Sweeps of ``C`` visit steps until every entry is placed (``4C + 4`` sweeps at most)."""
        for _ in range(4 * self.cmax + 4):  # sweeps; each one places demand while any remains
            if not self.remaining.any():
                break
            for v in range(self.cmax):
                if not self.remaining.any():
                    break
                self.step(self.visit[:, :, v])
        if self.remaining.any():  # cannot happen while the bounds are consistent; kept as a proof point
            r, m = np.argwhere(self.remaining)[0]
            raise PlanInvariantError(f"water-fill left demand of expert {self.multi[m]} on rank {r} unplaced")

    def step(self, target: np.ndarray) -> None:
        """Every source assigns what it may to replica ``target [R, M]`` of each expert."""
        experts, valid, load = self.experts, self.valid, self.load
        want = np.where(valid[experts, target], self.remaining, 0)
        held = load[experts, target]
        deficit = np.where(valid, np.maximum(self.lower[:, None] - load, 0), 0)  # [M, C]
        # Upper bound: sources reaching one replica are served in rank order.
        rank_order = _RankOrder(target)
        take = np.minimum(want, np.maximum(self.upper[None, :] - held - rank_order.before(want), 0))
        # Filling a lower-bound deficit is always allowed; the rest spends the expert's slack
        # (unassigned - deficits), again in rank order.
        to_deficit = np.clip(deficit[experts, target] - rank_order.before(take), 0, take)
        surplus = take - to_deficit
        slack = self.unassigned - deficit.sum(1)
        take = to_deficit + np.clip(slack[None, :] - (np.cumsum(surplus, axis=0) - surplus), 0, surplus)
        placed = np.zeros(self.assigned.shape, np.int64)
        np.put_along_axis(placed, target[:, :, None], take[:, :, None], axis=2)
        self.assigned += placed
        self.load += placed.sum(0)
        self.remaining -= take
        self.unassigned -= take.sum(0)


class _RankOrder:
    """Per expert, the sources of a step grouped by the replica they reach, in rank order.

    ``target [R, M]``: replica index each source reaches for each expert. ``before(amount)``
    gives, per (rank, expert), the sum of ``amount [R, M]`` over lower ranks that reach the same
    replica of the same expert (an exclusive segmented prefix sum down each expert's column).
    """

    def __init__(self, target: np.ndarray):
        self.order = np.argsort(target, axis=0, kind="stable")  # [R, M], grouped by replica, ranks ascending
        grouped = np.take_along_axis(target, self.order, axis=0)
        first = np.ones(target.shape, bool)
        first[1:] = grouped[1:] != grouped[:-1]
        rows = np.arange(target.shape[0])[:, None]
        self.start = np.maximum.accumulate(np.where(first, rows, 0), axis=0)  # row where each group starts

    def before(self, amount: np.ndarray) -> np.ndarray:
        grouped = np.take_along_axis(amount, self.order, axis=0)
        exclusive = np.cumsum(grouped, axis=0) - grouped
        exclusive -= np.take_along_axis(exclusive, self.start, axis=0)
        out = np.empty_like(exclusive)
        np.put_along_axis(out, self.order, exclusive, axis=0)
        return out
