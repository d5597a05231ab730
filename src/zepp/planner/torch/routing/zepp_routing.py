"""``zepp`` in torch: the rotation water-fill of ``zepp.planner.routing.zepp_routing``, element for
element, then the vacate pass (``zepp_vacate``).

Fixed shapes and integer arithmetic; loop trip counts depend only on the placement and the
shapes (``(4C + 4) * C`` visit steps). With ``sync`` the sweeps stop as soon as the numpy
planner's would (a few host reads); without, every step runs (a step after the demand is placed
takes nothing). The replica-load bounds are the numpy planner's ``expert_load_bounds``.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I64, arange, counts, sort_order
from zepp.planner.torch.routing.base_routing import slot_routing
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.torch.routing.zepp_vacate import vacate
from zepp.planner.torch.types import TorchRouting
from zepp.planner.types import PlanInvariantError, expert_load_bounds


def route_zepp(ids: torch.Tensor, dp: DevicePlacement, relaxation: float, vacate_rounds: int, sync: bool,
               sweeps: int | None) -> TorchRouting:
    """The water-fill, then ``vacate_rounds`` rounds of the vacate pass; the routing carries C and
    the water-fill's ``unplaced`` flag (0 unless ``sweeps`` cut it short)."""
    slot, unplaced = water_fill(ids, dp, relaxation, sync, sweeps)
    return slot_routing(ids, vacate(ids, slot, dp, relaxation, vacate_rounds, sync), dp, relaxation, unplaced)


def water_fill(ids: torch.Tensor, dp: DevicePlacement, relaxation: float, sync: bool, sweeps: int | None = None):
    """Rotation water-fill (``zepp.planner.routing.zepp_routing.water_fill``). Returns ``(slot
    [R, T, k] int64, unplaced 0-d int64)``. ``(4C+4) * C`` fixed visit steps over ``[R, M]``
    tensors; the segmented prefix sums of the numpy planner (sources reaching one replica, in rank
    order) are exclusive cumulative sums down the rank axis of a ``[R, M*C]`` scatter of the amounts."""
    slot = dp.replicas[ids.clamp_min(0), 0]
    if dp.M == 0:
        return slot, torch.zeros((), dtype=I64, device=ids.device)
    fill = _WaterFill(ids, dp, relaxation)
    bound = 4 * dp.C + 4
    fill.run(bound if sweeps is None else max(0, min(int(sweeps), bound)), sync)
    unplaced = fill.remaining.sum()
    if sync and sweeps is None and int(unplaced):
        r, m = (int(v) for v in torch.nonzero(fill.remaining)[0])
        raise PlanInvariantError(f"water-fill left demand of expert {int(dp.multi[m])} on rank {r} unplaced")
    return _entries_to_replicas(ids, slot, dp, fill.assigned), unplaced


class _WaterFill:
    """The sweeps' state: ``remaining [R, M]``, ``assigned [R, M*C]``, ``load [M*C]``,
    ``unassigned [M]``; bounds ``lower_flat [M*C]`` and ``upper [1, M]``; ``scratch [R, M*C]``
    for the segmented prefix sums."""

    def __init__(self, ids: torch.Tensor, dp: DevicePlacement, relaxation: float):
        R, dev = ids.shape[0], ids.device
        M, C = dp.M, dp.C
        self.dp = dp
        self.remaining = _rank_demand(ids, dp.E)[:, dp.multi]  # [R, M]
        total = self.remaining.sum(0)
        lower, upper = expert_load_bounds(total, dp.count[dp.multi], relaxation)
        self.valid = dp.valid_multi.reshape(-1)  # [M*C]
        self.lower_flat = lower[:, None].expand(M, C).reshape(-1)  # [M*C]
        self.upper = upper[None, :]
        self.load = torch.zeros(M * C, dtype=I64, device=dev)
        self.unassigned = total.clone()
        self.assigned = torch.zeros(R, M * C, dtype=I64, device=dev)
        self.scratch = torch.zeros(R, M * C, dtype=I64, device=dev)

    def run(self, sweeps: int, sync: bool) -> None:
        for _ in range(sweeps):
            if sync and not bool(self.remaining.any()):
                break
            for v in range(self.dp.C):
                if sync and not bool(self.remaining.any()):
                    break
                self.step(self.dp.visit_flat[:, :, v])  # [R, M] flat replica index of this visit

    def before(self, amount: torch.Tensor, tf: torch.Tensor) -> torch.Tensor:
        """Per (r, m): sum of ``amount`` over lower ranks reaching the same replica this step."""
        self.scratch.zero_()
        self.scratch.scatter_(1, tf, amount)
        return (torch.cumsum(self.scratch, 0) - self.scratch).gather(1, tf)

    def step(self, tf: torch.Tensor) -> None:
        M, C = self.dp.M, self.dp.C
        want = torch.where(self.valid[tf], self.remaining, 0)
        held = self.load[tf]
        deficit = torch.where(self.valid, (self.lower_flat - self.load).clamp_min(0), 0)  # [M*C]
        take = torch.minimum(want, (self.upper - held - self.before(want, tf)).clamp_min(0))
        to_deficit = torch.minimum((deficit[tf] - self.before(take, tf)).clamp_min(0), take)
        surplus = take - to_deficit
        slack = self.unassigned - deficit.reshape(M, C).sum(1)
        spent = torch.cumsum(surplus, 0) - surplus
        take = to_deficit + torch.minimum((slack[None, :] - spent).clamp_min(0), surplus)
        self.assigned.scatter_add_(1, tf, take)
        self.load.scatter_add_(0, tf.reshape(-1), take.reshape(-1))
        self.remaining = self.remaining - take
        self.unassigned = self.unassigned - take.sum(0)


def _entries_to_replicas(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement,
                         assigned: torch.Tensor) -> torch.Tensor:
    """Entries of (rank r, expert m), in batch order, fill r's ``assigned [R, M*C]`` in replica
    order; entries of single-replica experts keep ``slot``. Returns ``[R, T, k]``."""
    R, dev = ids.shape[0], ids.device
    M, C = dp.M, dp.C
    flat = ids.reshape(R, -1)
    mi = dp.multi_index[torch.where(flat >= 0, flat, dp.E)]  # [R, T*k]
    is_multi = mi >= 0
    group = torch.where(is_multi, arange(R, dev)[:, None] * M + mi, R * M).reshape(-1)
    order = sort_order(group, R * M)
    # The assignments laid end to end (the numpy planner's np.repeat), padded by one group for
    # the entries of single-replica experts (sorted last) so the output size is static.
    n = group.shape[0]
    reps_ext = torch.cat([assigned.reshape(-1), (n - assigned.sum()).reshape(1)])
    which = torch.cat([arange(R * M * C, dev) % C, torch.zeros(1, dtype=I64, device=dev)])
    rep_sorted = torch.repeat_interleave(which, reps_ext, output_size=n)
    rep_idx = torch.empty_like(rep_sorted)
    rep_idx[order] = rep_sorted
    mslot = dp.reps_multi[mi.clamp_min(0).reshape(-1), rep_idx]
    out = torch.where(is_multi.reshape(-1), mslot, slot.reshape(-1))
    return out.reshape(ids.shape)


def _rank_demand(ids: torch.Tensor, E: int) -> torch.Tensor:
    """``[R, E]`` int64 entries per (rank, expert), missing entries left out."""
    R = ids.shape[0]
    key = arange(R, ids.device)[:, None, None] * (E + 1) + torch.where(ids >= 0, ids, E)
    return counts(key.reshape(-1), R * (E + 1)).reshape(R, E + 1)[:, :E]
