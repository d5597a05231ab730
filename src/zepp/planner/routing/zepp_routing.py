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

from zepp.planner.placement_cache import PlacementCache
from zepp.planner.routing.zepp_assign import assign_entries, entry_keys
from zepp.planner.routing.zepp_tables import zepp_tables
from zepp.planner.routing.zepp_vacate import vacate
from zepp.planner.types import Placement, PlanInvariantError, Routing, expert_load_bounds

_NO_BOUND = 1 << 62


def route_zepp(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    """The water-fill, then ``vacate_rounds`` rounds of the vacate pass; the Routing carries C so
    ``validate()`` checks the replica-load bounds ``[floor((1-C) q), ceil((1+C) q)]``."""
    filled = _Filled(topk_ids, placement, relaxation)
    slot = vacate(topk_ids, filled.slot, placement, relaxation, vacate_rounds, filled.slot_counts, filled.node,
                  in_place=True)
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
    ``lower`` / ``upper [M]`` (and as read per step: ``lower_flat [M*C]`` per replica, 0 where none,
    ``upper_flat [R*M]`` per (rank, expert)); ``visit [R, M, C]`` (``visit_order``); ``valid [M, C]``.
    """

    def __init__(self, remaining: np.ndarray, placement: Placement, relaxation: float, multi: np.ndarray):
        self.multi = multi
        self.remaining = np.asarray(remaining, np.int64).copy()  # [R, M]
        total = self.remaining.sum(0)
        self.lower, self.upper = expert_load_bounds(total, placement.replica_count.astype(np.int64)[multi], relaxation)
        self.steps = _steps(placement, multi)
        self.valid, self.visit, self.valid_flat = self.steps.valid, self.steps.visit, self.steps.valid_flat
        M, cmax = self.valid.shape
        self.cmax = cmax
        self.load = np.zeros((M, cmax), np.int64)
        self.unassigned = total.copy()
        self.assigned = np.zeros((placement.ranks, M, cmax), np.int64)
        # per step: each replica's lower bound (0 where no replica) and each (rank, expert)'s upper
        self.lower_flat = np.where(self.valid_flat, np.repeat(self.lower, cmax), 0)
        self.upper_flat = np.tile(self.upper, placement.ranks)

    def run(self) -> None:
        """Sweeps of ``C`` visit steps until every entry is placed (``4C + 4`` sweeps at most)."""
        for _ in range(4 * self.cmax + 4):  # sweeps; each one places demand while any remains
            if not self.remaining.any():
                break
            for v in range(self.cmax):
                if not self.remaining.any():
                    break
                self.step(self.steps.at(v))
        if self.remaining.any():  # cannot happen while the bounds are consistent; kept as a proof point
            r, m = np.argwhere(self.remaining)[0]
            raise PlanInvariantError(f"water-fill left demand of expert {self.multi[m]} on rank {r} unplaced")

    def step(self, s: "_Step") -> None:
        """Every source assigns what it may to its replica of step ``s`` (``target [R, M]``) of
        each expert; ``[R, M]`` arrays flat, ``[M, C]`` ones flat as ``cell = m C + target``."""
        load = self.load.ravel()
        want = np.where(s.valid, self.remaining.ravel(), 0)
        deficit = np.maximum(self.lower_flat - load, 0)  # [M*C] (a missing replica has no load)
        # Upper bound: sources reaching one replica are served in rank order.
        take = np.minimum(want, np.maximum(self.upper_flat - load.take(s.cell) - s.before(want), 0))
        # Filling a lower-bound deficit is always allowed; the rest spends the expert's slack
        # (unassigned - deficits), again in rank order.
        to_deficit = np.clip(deficit.take(s.cell) - s.before(take), 0, take)
        surplus = (take - to_deficit).reshape(self.remaining.shape)
        slack = self.unassigned - deficit.reshape(self.load.shape).sum(1)
        take = to_deficit.reshape(surplus.shape) + np.clip(slack - (np.cumsum(surplus, axis=0) - surplus), 0, surplus)
        flat = take.ravel()
        self.assigned.ravel()[s.assigned_at] += flat
        np.add.at(load, s.cell, flat)
        self.remaining -= take
        self.unassigned -= take.sum(0)


class _Step:
    """One visit step of a placement's water-fill, static (``_steps`` caches them), over the
    ``[R, M]`` (rank, expert) pairs flat: ``cell`` the replica each reaches (``m C + target``),
    ``valid`` whether that replica exists, ``expert`` = ``m``, ``assigned_at`` the index into
    ``[R, M, C]``. ``before(amount)`` gives, per pair, the sum of ``amount [R*M]`` over lower ranks
    reaching the same replica (an exclusive segmented prefix sum, by one stable order of cells)."""

    def __init__(self, target: np.ndarray, valid: np.ndarray):
        R, M = target.shape
        C = valid.shape[1]
        self.expert = np.tile(np.arange(M), R)
        self.cell = (self.expert * C + target.ravel()).astype(np.int64)
        self.valid = valid.ravel()[self.cell]
        self.assigned_at = np.arange(R * M) * C + target.ravel()
        self.order = np.argsort(self.cell, kind="stable")  # grouped by cell, ranks ascending
        grouped = self.cell[self.order]
        first = np.ones(R * M, bool)
        first[1:] = grouped[1:] != grouped[:-1]
        self.start = np.maximum.accumulate(np.where(first, np.arange(R * M), 0))  # where each group starts

    def before(self, amount: np.ndarray) -> np.ndarray:
        grouped = amount.take(self.order)
        exclusive = np.cumsum(grouped) - grouped
        exclusive -= exclusive.take(self.start)
        out = np.empty_like(exclusive)
        out[self.order] = exclusive
        return out


class _Steps:
    """A placement's water-fill steps (``_Step`` per visit, built on first use), ``visit [R, M, C]``
    (``visit_order``), ``valid [M, C]`` and ``valid_flat [M*C]``."""

    def __init__(self, placement: Placement, multi: np.ndarray):
        self.visit = visit_order(placement, multi)
        self.valid = placement.replicas[multi] >= 0
        self.valid_flat = self.valid.ravel()
        self._steps: dict[int, _Step] = {}

    def at(self, v: int) -> _Step:
        if v not in self._steps:
            self._steps[v] = _Step(self.visit[:, :, v], self.valid)
        return self._steps[v]


_STEPS = PlacementCache()


def _steps(placement: Placement, multi: np.ndarray) -> _Steps:
    """The cached ``_Steps`` of (``placement``, ``multi``) (8 kept)."""
    return _STEPS.get(placement, lambda: _Steps(placement, multi), np.asarray(multi).tobytes())
