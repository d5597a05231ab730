"""``zepp`` in torch: the rotation water-fill of ``zepp.planner.routing.zepp_routing``, element for
element, then the vacate pass (``zepp_vacate``).

Fixed shapes and integer arithmetic; loop trip counts depend only on the placement and the
shapes (``(4C + 4) * C`` visit steps). With ``sync`` the sweeps stop as soon as the numpy
planner's would (a few host reads); without, every step runs (a step after the demand is placed
takes nothing). The replica-load bounds are the numpy planner's ``expert_load_bounds``.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I64
from zepp.planner.torch.routing.base_routing import slot_routing
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.torch.routing.zepp_assign import assign_entries, entry_keys
from zepp.planner.torch.routing.zepp_vacate import vacate
from zepp.planner.torch.types import TorchRouting
from zepp.planner.types import PlanInvariantError, expert_load_bounds

_NO_BOUND = 1 << 62


def route_zepp(ids: torch.Tensor, dp: DevicePlacement, relaxation: float, vacate_rounds: int, sync: bool,
               sweeps: int | None) -> TorchRouting:
    """The water-fill, then ``vacate_rounds`` rounds of the vacate pass; the routing carries C, the
    water-fill's ``unplaced`` (0 unless ``sweeps`` cut it short) and, with ``sweeps`` and without
    ``sync``, the vacate pass's ``overflow`` flag (its short move lists were too short)."""
    filled = _Filled(ids, dp, relaxation, sync, sweeps)
    columns, overflow = vacate(ids, filled.slot, dp, relaxation, vacate_rounds, sync, filled.slot_counts, filled.node,
                               bounded=sweeps is not None, expert=filled.ids)
    if filled.overflow is not None:
        overflow = filled.overflow if overflow is None else overflow | filled.overflow
    return slot_routing(ids, _batch_order(columns, ids.shape), dp, relaxation, filled.unplaced, overflow,
                        masked=True, columns=columns)  # a missing entry: -1 already


def _batch_order(columns: torch.Tensor, shape) -> torch.Tensor:
    """``[R, T, k]`` of a per-entry ``[k, G]`` array (one transpose)."""
    return columns.t().reshape(shape)


def water_fill(ids: torch.Tensor, dp: DevicePlacement, relaxation: float, sync: bool, sweeps: int | None = None):
    """Rotation water-fill (``zepp.planner.routing.zepp_routing.water_fill``). Returns ``(slot
    [R, T, k] int32, unplaced 0-d int64)``. ``(4C+4) * C`` fixed visit steps over ``[R, M]``
    tensors; the segmented prefix sums of the numpy planner (sources reaching one replica, in rank
    order) are exclusive cumulative sums down the rank axis of a ``[R, M*C]`` scatter of the amounts."""
    filled = _Filled(ids, dp, relaxation, sync, sweeps)
    return _batch_order(filled.slot, ids.shape), filled.unplaced


class _Filled:
    """The water-fill on counts, then the entries assigned (``zepp_routing._Filled``): ``slot``,
    ``node`` and the expert ``ids`` column by column ``[k, G]`` int32, ``unplaced``,
    ``overflow`` (the assignment's bounded list was too short; ``None`` where it cannot be) and
    ``slot_counts = (load, lower, upper) [R*S]`` (``None`` without several-replica experts)."""

    def __init__(self, ids: torch.Tensor, dp: DevicePlacement, relaxation: float, sync: bool, sweeps: int | None):
        keys = entry_keys(ids, dp)
        self.ids = keys.ids
        self.unplaced = torch.zeros((), dtype=I64, device=ids.device)
        self.slot_counts = fill = None
        if dp.M:
            fill = _WaterFill(keys.demand[:, dp.multi], dp, relaxation)
            bound = 4 * dp.C + 4
            fill.run(bound if sweeps is None else max(0, min(int(sweeps), bound)), sync)
            self.unplaced = fill.remaining.sum()
            if sync and sweeps is None and int(self.unplaced):
                r, m = (int(v) for v in torch.nonzero(fill.remaining)[0])
                raise PlanInvariantError(f"water-fill left demand of expert {int(dp.multi[m])} on rank {r} unplaced")
        self.slot, self.node, self.overflow = assign_entries(keys, None if fill is None else fill.assigned, dp, sync,
                                                             bounded=sweeps is not None)
        if fill is not None:
            n = dp.R * dp.S
            slots = torch.where(dp.reps_multi >= 0, dp.reps_multi, n).reshape(-1)  # padding: the spare cell n
            out = torch.zeros(3, n + 1, dtype=I64, device=ids.device)
            out[1].fill_(-_NO_BOUND)  # a fill, not an element assignment: nothing copied from the host
            out[2].fill_(_NO_BOUND)
            for row, value in zip(out, (fill.load, fill.lower_flat, fill.upper.reshape(-1, 1).expand(dp.M, dp.C))):
                row[slots] = value.reshape(-1)
            self.slot_counts = tuple(out[:, :n])


class _WaterFill:
    """The sweeps' state: ``remaining [R, M]``, ``assigned [R, M*C]``, ``load [M*C]``,
    ``unassigned [M]``; bounds ``lower_flat [M*C]`` and ``upper [1, M]``; ``scratch [R, M*C]``
    for the segmented prefix sums."""

    def __init__(self, demand: torch.Tensor, dp: DevicePlacement, relaxation: float):
        R, dev = demand.shape[0], demand.device
        M, C = dp.M, dp.C
        self.dp = dp
        self.remaining = demand.clone()  # [R, M]
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
