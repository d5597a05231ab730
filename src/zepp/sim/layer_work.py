"""What a simulated layer is built from: ``LayerWork``, a ``FlowPlan``'s entries and transfers
(hop tables, or the cells of its counts) with the iteration's weight copies and GEMM groups."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.overlap.granularity import Granularity
from zepp.planner.types import FlowPlan, Hops
from zepp.sim.cell_links import plan_cells
from zepp.sim.predispatch import single_copy_slots


@dataclass
class LayerWork:
    """What ``build_layer`` needs from a system's planner.

    ``owner, token, comp, slot, entry [n_entries]``: every entry's owner rank, token index,
    computing rank, global slot and index ``j < k``. ``dispatch`` / ``combine``: ``Hops``. Or,
    built from counts (``counted``): ``dispatch`` / ``combine`` are ``zepp.sim.cell_flows.CellFlows``
    and ``slot_entries [R, R*S]`` (entries per owner and slot) stands for the per-entry arrays
    (``None`` then).
    ``slots_per_rank``: ``S``. ``swapped [R * S]`` bool: slots whose weights arrive this
    iteration (their GEMMs wait for ``weight_copies``). ``weight_copies [M, 2]``: (src rank,
    dst rank) of each expert-weight transfer this iteration.
    """

    owner: np.ndarray
    token: np.ndarray
    comp: np.ndarray
    slot: np.ndarray
    entry: np.ndarray
    dispatch: Hops
    combine: Hops
    tokens_per_rank: int
    slots_per_rank: int
    swapped: np.ndarray | None = None
    weight_copies: np.ndarray | None = None
    copies_block_gemm: str = "swapped"  # "swapped": only swapped slots wait; "all": every GEMM of the rank
    granularity: Granularity | None = None  # coarse groups / waves (zepp.planner.overlap.granularity); None: per node
    single_slots: np.ndarray | None = None  # [R * S] slots of single-copy experts (Mechanics.predispatch)
    slot_entries: np.ndarray | None = None  # [R, R * S] entries per (owner, slot): the counted form

    @classmethod
    def of(cls, plan: FlowPlan, counted: bool = False, predispatch: bool = False, **kw) -> "LayerWork":
        """The layer plan of a ``FlowPlan``: its routing's entries and hop tables, or with
        ``counted`` its cells (``zepp.sim.cell_links.plan_cells``; free rows where
        ``predispatch``) and entries per (owner, slot)."""
        r = plan.routing
        kw.setdefault("single_slots", single_copy_slots(r.placement))
        T, S = r.topk_ids.shape[1], r.placement.slots_per_rank
        if counted:
            d, c = plan_cells(plan, kw["single_slots"] if predispatch else None)
            return cls(None, None, None, None, None, d, c, T, S, slot_entries=plan.volume_state.counts.slot_entries(),
                       **kw)
        owner, token, comp, slot, entry = entries_of(r)
        return cls(owner, token, comp, slot, entry, plan.dispatch, plan.combine, T, S, **kw)

    def gemm_entries(self):
        """``(owner, comp, slot, rows)`` ``[n]``: every entry (``rows`` None), or in the counted
        form every (owner, slot) with entries and their number."""
        if self.slot_entries is None:
            return self.owner, self.comp, self.slot, None
        owner, slot = np.nonzero(self.slot_entries)
        return owner, slot // self.slots_per_rank, slot, self.slot_entries[owner, slot]


def entries_of(routing) -> tuple[np.ndarray, ...]:
    """Flat per-entry arrays ``(owner, token, comp, slot, entry)`` of a ``Routing`` (missing
    entries left out)."""
    R, T, k = routing.topk_ids.shape
    slot = routing.slot.ravel().astype(np.int64)
    idx = np.flatnonzero(slot >= 0) if (slot < 0).any() else np.arange(R * T * k, dtype=np.int64)
    slot = slot[idx]
    return (idx // (T * k)), (idx // k) % T, slot // routing.placement.slots_per_rank, slot, idx % k
