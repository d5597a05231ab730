"""The device planner's plan objects: routings and hop tables as tensors (the torch twins of
``zepp.planner.types``' ``Routing``, ``Hops`` and ``FlowPlan``).

A hop table's length depends on the data, so on the device it lives in a *fixed-capacity*
buffer: every column ``[capacity]`` with the first ``count`` elements valid (``count`` is a 0-d
int64 tensor on the same device) and the rest zero. The capacity is known from the batch shape
alone (``R*T*k`` per hop group), so building a table never reads a value back to the host.
``to_numpy()`` turns it into the numpy planner's ``zepp.planner.types.Hops`` with exactly one host read
(the count) plus the copy. The replica-load bounds are ``zepp.planner.types.expert_load_bounds``
itself (its operators hold for tensors). ``zepp.planner.torch.flows.hop_parts`` fills the tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from zepp.planner.types import HOP_COLUMNS, FlowPlan, FlowPlanFields, Hops, PlanInvariantError, Placement, Routing


class IncompletePlan(PlanInvariantError):
    """A routing planned with ``sweeps`` (the short, capturable bounds) fell short: the water-fill
    left entries unplaced or the vacate pass's move lists overflowed. Re-plan with the default
    ``sweeps=None``."""


_COLS = tuple(HOP_COLUMNS)
_NP_DTYPES = HOP_COLUMNS
# ``HOP_COLUMNS`` with torch dtypes: ``{column: dtype}``
HOP_TENSOR_DTYPES = {c: {np.int8: torch.int8, np.int32: torch.int32}[dtype] for c, dtype in HOP_COLUMNS.items()}


@dataclass(frozen=True)
class TorchRouting:
    """``slot [R, T, k]`` int32 tensor (global slot per entry, ``-1`` for a missing entry) of
    ``topk_ids [R, T, k]`` on ``placement``; ``unplaced``: 0-d int64 tensor, entries the
    water-fill could not place (always 0 for a consistent placement; ``None`` for routings
    without a water-fill); ``overflow``: 0-d bool tensor, True where the vacate pass's
    fixed-capacity move lists (planned with ``sweeps``) were too short, so ``slot`` is not the
    numpy planner's (``None`` where the lists cannot overflow); ``short``: planned with
    ``sweeps`` (the short capturable bounds), which the flows built without ``sync`` follow
    (``zepp.planner.torch.flows.gateway_volumes``); ``columns``: ``slot`` column by column,
    ``[k, R*T]`` int32, where the router has it (the token counts read it). Same meaning as
    ``zepp.planner.types.Routing``."""

    topk_ids: torch.Tensor
    slot: torch.Tensor
    placement: Placement
    relaxation: float | None = None
    unplaced: torch.Tensor | None = None
    overflow: torch.Tensor | None = None
    short: bool = False
    columns: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def shortfall(self) -> torch.Tensor:
        """0-d int64 on the device: entries left unplaced, plus 1 where the vacate lists
        overflowed (0: the routing is the numpy planner's). No host read."""
        out = torch.zeros((), dtype=torch.int64, device=self.slot.device)
        if self.unplaced is not None:
            out = out + self.unplaced
        if self.overflow is not None:
            out = out + self.overflow.to(torch.int64)
        return out

    @property
    def compute_rank(self) -> torch.Tensor:
        """``[R, T, k]`` int64 rank computing each entry (``-1`` for a missing entry)."""
        s = self.slot.to(torch.int64)
        return torch.where(s >= 0, s // self.placement.slots_per_rank, -1)

    def to_numpy(self, shortfall: int | None = None) -> Routing:
        """The numpy ``Routing`` (one device-to-host copy of ``topk_ids`` and ``slot``).
        Raises ``IncompletePlan`` when the water-fill left entries unplaced or the vacate
        pass's lists overflowed (``shortfall``: ``shortfall()`` when read already)."""
        if shortfall is None and (self.unplaced is not None or self.overflow is not None):
            shortfall = int(self.shortfall())
        if shortfall:
            raise IncompletePlan(f"the routing planned with short bounds fell short ({shortfall}: entries the "
                                 "water-fill left unplaced, +1 where the vacate lists overflowed); re-plan")
        return Routing(self.topk_ids.cpu().numpy().astype(np.int32), self.slot.cpu().numpy().astype(np.int32),
                       self.placement, relaxation=self.relaxation)


def route_to_torch(routing: Routing, device=None) -> TorchRouting:
    """A numpy ``Routing`` as a ``TorchRouting`` on ``device`` (a copy)."""
    return TorchRouting(torch.as_tensor(routing.topk_ids, device=device),
                        torch.as_tensor(routing.slot.astype(np.int32), device=device),
                        routing.placement, routing.relaxation)


@dataclass(frozen=True)
class TorchHops:
    """One phase's hop table in a fixed-capacity buffer (see module docstring).

    Columns ``[capacity]``: ``stage`` int8, ``src``/``dst``/``owner``/``token``/``msg`` int32,
    ``entry`` int8, meaning exactly what ``zepp.planner.types.Hops`` says; ``count``: 0-d int64 tensor.
    """

    stage: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    owner: torch.Tensor
    token: torch.Tensor
    msg: torch.Tensor
    entry: torch.Tensor
    count: torch.Tensor

    @property
    def capacity(self) -> int:
        return int(self.src.shape[0])

    def to_numpy(self, count: int | None = None) -> Hops:
        """``zepp.planner.types.Hops`` of the first ``count`` rows (one host read: the count, unless given)."""
        n = int(self.count) if count is None else int(count)
        if self.src.device.type == "cpu":
            return Hops(**{c: getattr(self, c)[:n].numpy().astype(_NP_DTYPES[c], copy=False) for c in _COLS})
        # one device-to-host copy of all seven columns
        host = torch.stack([getattr(self, c)[:n].to(torch.int32) for c in _COLS]).cpu().numpy()
        return Hops(**{c: host[i].astype(_NP_DTYPES[c]) for i, c in enumerate(_COLS)})

    def trimmed(self) -> dict:
        """``{column: tensor [count]}`` on the device (one host read: the count)."""
        n = int(self.count)
        return {c: getattr(self, c)[:n] for c in _COLS}


@dataclass(frozen=True)
class TorchFlowPlan(FlowPlanFields[TorchRouting, TorchHops]):
    """A FlowPlan on a device (fields: ``zepp.planner.types.FlowPlanFields``): its ``volumes``
    (``PlanVolumes`` of ``zepp.planner.torch.volumes.TorchVolumes``) and ``TorchHops`` tables built
    on first use; ``exact``: hop tables of exactly ``count`` rows and volumes built with host
    reads (else fixed-capacity buffers and grids, capturable). ``to_numpy()`` gives the numpy
    planner's ``zepp.planner.types.FlowPlan``."""

    exact: bool = True

    def _build_hops(self) -> tuple:
        from zepp.planner.torch.flows import build_hops

        return build_hops(self.routing, self.dispatch_transport, self.combine_transport, self.coalesce, self.exact)

    def _build_volumes(self):
        from zepp.planner.torch.flows import build_volumes

        return build_volumes(self.routing, self.dispatch_transport, self.combine_transport, self.coalesce,
                             self.exact).volumes

    def sizes(self) -> tuple[int, int, int]:
        """``(dispatch hops, combine hops, the routing's shortfall)`` in one device-to-host read."""
        u = self.routing.shortfall()
        d, c, n = torch.stack([self.dispatch.count, self.combine.count, u]).tolist()
        return d, c, n

    def to_numpy(self) -> FlowPlan:
        """The numpy ``zepp.planner.types.FlowPlan`` (one host read of the sizes, then the copies);
        raises ``IncompletePlan`` when the water-fill left entries unplaced. Hop tables not built
        here are not built for it: the numpy plan builds its own, equal ones, where it needs them."""
        if "hop_tables" not in self.__dict__:
            return FlowPlan(self.routing.to_numpy(), self.gpus_per_node, self.row_bytes, self.dispatch_transport,
                            self.combine_transport, self.coalesce)
        d, c, unplaced = self.sizes()
        return FlowPlan(self.routing.to_numpy(unplaced), self.gpus_per_node, self.row_bytes, self.dispatch_transport,
                        self.combine_transport, self.coalesce, hops=(self.dispatch.to_numpy(d), self.combine.to_numpy(c)))
