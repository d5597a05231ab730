"""``moonep``: MoonEP's per-batch balance (PAPER.md section 7), a replicated integer planner that
gives every GPU exactly ``T * k`` rows using ``E/R`` prefetch slots per GPU.

The routing comes with its own placement: the given home placement plus the prefetch slots.
The simulator's ``moonep-pulls`` plug-in adds the weight pulls it implies. Loops run over ranks
and experts, never over entries.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.intsort import stable_argsort
from zepp.planner.types import Placement, Routing


def route_moonep(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    """``moonep_plan``'s routing of a batch without missing entries (``relaxation`` and
    ``vacate_rounds`` unused)."""
    if (topk_ids < 0).any():
        raise ZeppInputError("routing 'moonep' does not take missing entries (-1 ids)")
    return moonep_plan(topk_ids, placement.num_experts, placement.gpus_per_node)[0]


def moonep_plan(topk_ids: np.ndarray, num_experts: int, gpus_per_node: int) -> tuple[Routing, np.ndarray]:
    """MoonEP's per-batch balance: ``topk_ids [R, T, k]`` -> (Routing over home + ``E/R``
    prefetch slots per rank, ``pulls [M, 2]`` (home rank, puller rank) weight transfers).

    Every rank ends with exactly ``T*k`` rows when the prefetch slots suffice: excess entries
    of an overloaded home rank move, its hottest expert first, to the ranks with the largest
    deficit; each (expert, puller) pair takes one prefetch slot on the puller.
    """
    R, T, k = topk_ids.shape
    epr = num_experts // R
    demand = np.bincount(topk_ids.ravel(), minlength=num_experts).astype(np.int64)
    moves = _Prefetch(demand, R, epr, T * k)
    moves.plan()
    placement = Placement(moves.slot_expert, num_experts, gpus_per_node)
    slot = _entry_slots(topk_ids, demand, epr, moves.keep_home, moves.quota)
    routing = Routing(topk_ids, slot.reshape(R, T, k).astype(np.int32), placement)
    return routing, np.asarray(moves.pulls, np.int64).reshape(-1, 2)


class _Prefetch:
    """Which excess entries move where. Per expert ``demand [E]`` and ``keep_home [E]`` (entries
    that stay on the home rank); per rank ``load [R]``, ``deficit [R]`` below the target ``T*k``,
    ``used [R]`` prefetch slots; ``slot_expert [R, 2 E/R]`` (home slots, then prefetch slots);
    ``quota``: expert -> ``[(rank, local slot, rows)]``; ``pulls``: ``(home rank, puller)`` pairs."""

    def __init__(self, demand: np.ndarray, ranks: int, epr: int, target: int):
        E = demand.size
        self.R, self.epr, self.target = ranks, epr, target
        self.demand = demand
        home = np.arange(E) // epr
        self.load = np.bincount(home, weights=demand, minlength=ranks).astype(np.int64)
        self.slot_expert = np.full((ranks, 2 * epr), -1, np.int32)
        self.slot_expert[:, :epr] = np.arange(E).reshape(ranks, epr)
        self.used = np.zeros(ranks, np.int64)
        self.quota: dict[int, list] = {}
        self.keep_home = demand.copy()
        self.deficit = target - self.load
        self.pulls: list[tuple[int, int]] = []

    def plan(self) -> None:
        """Overloaded ranks, most loaded first, hand their excess away, hottest expert first."""
        epr = self.epr
        for r in np.argsort(-self.load, kind="stable").tolist():
            excess = int(self.load[r] - self.target)
            if excess <= 0:
                break
            exps = r * epr + np.argsort(-self.demand[r * epr:(r + 1) * epr], kind="stable")
            for e in exps.tolist():
                excess = self._move_out(r, e, excess)
                if excess <= 0:
                    break

    def _move_out(self, r: int, e: int, excess: int) -> int:
        """Move entries of expert ``e`` off its home rank ``r`` to the ranks of largest deficit
        (one prefetch slot each) while ``r`` has excess; returns the excess left."""
        while excess > 0 and self.keep_home[e] > 0:
            cand = np.flatnonzero((self.deficit > 0) & (self.used < self.epr) & (np.arange(self.R) != r))
            if cand.size == 0:
                break
            d = int(cand[np.argmax(self.deficit[cand])])
            amount = int(min(excess, self.keep_home[e], self.deficit[d]))
            self.slot_expert[d, self.epr + self.used[d]] = e
            self.quota.setdefault(e, []).append((d, self.epr + int(self.used[d]), amount))
            self.used[d] += 1
            self.deficit[d] -= amount
            self.keep_home[e] -= amount
            excess -= amount
            self.pulls.append((r, d))
        return excess


def _entry_slots(topk_ids: np.ndarray, demand: np.ndarray, epr: int, keep_home: np.ndarray,
                 quota: dict[int, list]) -> np.ndarray:
    """``[R*T*k]`` int64 global slot of each entry: the first ``keep_home[e]`` entries of expert
    ``e`` (batch order) stay home, the rest fill its quotas in order."""
    S = 2 * epr
    flat = topk_ids.ravel().astype(np.int64)
    home = np.arange(demand.size) // epr
    slot = (home[flat] * S + flat % epr).astype(np.int64)
    order = stable_argsort(flat)  # entries grouped by expert, each group in batch order
    starts = np.concatenate(([0], np.cumsum(demand)[:-1]))
    for e, parts in quota.items():
        bounds = keep_home[e] + np.cumsum([p[2] for p in parts])
        mine = order[starts[e]:starts[e] + demand[e]]
        p = np.arange(mine.size)  # each entry's position among its expert's entries
        moved = p >= keep_home[e]
        which = np.searchsorted(bounds, p[moved], side="right")
        tgt = np.array([p_[0] * S + p_[1] for p_ in parts], np.int64)
        slot[mine[moved]] = tgt[which]
    return slot
