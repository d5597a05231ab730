"""One entry point per stage, choosing the planner by the input's type or by ``backend``."""

from __future__ import annotations

import numpy as np
import torch

from zepp.errors import ZeppInputError
from zepp.planner.types import FlowPlan, Placement, Routing
from zepp.planner.torch import flows as _tflows
from zepp.planner.torch import routing as _trouting
from zepp.planner.torch.tables import IncompletePlan, TorchFlowPlan, TorchRouting

BACKENDS = ("numpy", "torch")


def _backend(backend: str | None, obj) -> str:
    if backend is None:
        return "torch" if isinstance(obj, (torch.Tensor, TorchRouting)) else "numpy"
    if backend not in BACKENDS:
        raise ZeppInputError(f"unknown planner backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def route(name: str, topk_ids, placement: Placement, relaxation: float = 0.25, vacate_rounds: int = 3, *,
          backend: str | None = None, device=None, sync: bool | None = None,
          sweeps: int | None = None) -> Routing | TorchRouting:
    """``zepp.planner.routing.route`` on either planner. ``backend=None``: a ``torch.Tensor`` plans in
    torch on its device (returns ``TorchRouting``), anything else with numpy (``Routing``).
    ``backend="torch"`` on a numpy batch moves it to ``device`` (default CPU) first. ``sync``,
    ``sweeps``: see ``zepp.planner.torch.routing.route`` (torch only)."""
    b = _backend(backend, topk_ids)
    if b == "numpy":
        from zepp.planner.routing import route as np_route

        ids = topk_ids.cpu().numpy() if isinstance(topk_ids, torch.Tensor) else topk_ids
        return np_route(name, ids, placement, relaxation, vacate_rounds)
    if not isinstance(topk_ids, torch.Tensor):
        arr = np.asarray(topk_ids)
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise ZeppInputError(f"batch topk_ids must be integers, got dtype {arr.dtype}")
        topk_ids = torch.as_tensor(arr.astype(np.int64), device=device)
    elif device is not None:
        topk_ids = topk_ids.to(device)
    return _trouting.route(name, topk_ids, placement, relaxation, vacate_rounds, sync=sync, sweeps=sweeps)


def build_flows(routing, dispatch: str, row_bytes: int, combine: str | None = None, coalesce: bool = True, *,
                backend: str | None = None, sync: bool | None = None) -> FlowPlan | TorchFlowPlan:
    """``zepp.planner.flows.build_flows`` on either planner, chosen by the routing's type (or ``backend``)."""
    b = _backend(backend, routing)
    if b == "numpy":
        from zepp.planner.flows import build_flows as np_build

        r = routing.to_numpy() if isinstance(routing, TorchRouting) else routing
        return np_build(r, dispatch, row_bytes, combine, coalesce)
    if isinstance(routing, Routing):
        routing = route_to_torch(routing)
    return _tflows.build_flows(routing, dispatch, row_bytes, combine, coalesce, sync=sync)


def route_to_torch(routing: Routing, device=None) -> TorchRouting:
    """A numpy ``Routing`` as a ``TorchRouting`` on ``device`` (a copy)."""
    return TorchRouting(torch.as_tensor(routing.topk_ids, device=device),
                        torch.as_tensor(routing.slot.astype(np.int32), device=device),
                        routing.placement, routing.relaxation)


def plan_batch(topk_ids_all: torch.Tensor, placement: Placement, routing: str, relaxation: float, dispatch: str,
               combine: str | None, row_bytes: int, *, vacate_rounds: int = 3, coalesce: bool = True,
               sync: bool | None = None, sweeps: int | None = None) -> TorchFlowPlan:
    """Route ``topk_ids_all [R, T, k]`` (the all-gathered ids, ``-1`` padded, on any device)
    and build its flows, all on the ids' device.

    Returns a ``TorchFlowPlan`` whose hop tables stay on the device (``TorchHops``);
    ``.to_numpy()`` gives the ``zepp.planner.types.FlowPlan`` the numpy planner builds, element for
    element, with one host read (the table sizes) and the copies. ``sync`` and ``sweeps`` as in
    ``zepp.planner.torch.routing.route``: with ``sync=False`` nothing is read back, so the call can be
    captured in a CUDA graph for a fixed ``[R, T, k]``."""
    if not isinstance(topk_ids_all, torch.Tensor):
        raise ZeppInputError(f"plan_batch takes the ids as a torch tensor, got {type(topk_ids_all).__name__}")
    r = _trouting.route(routing, topk_ids_all, placement, relaxation, vacate_rounds, sync=sync, sweeps=sweeps)
    return _tflows.build_flows(r, dispatch, row_bytes, combine, coalesce, sync=sync)


def plan_batch_numpy(topk_ids_all: torch.Tensor, placement: Placement, routing: str, relaxation: float,
                     dispatch: str, combine: str | None, row_bytes: int, *, sweeps: int | None = None,
                     **kw) -> FlowPlan:
    """``plan_batch(...).to_numpy()``: plan on the ids' device, hand back the numpy FlowPlan the
    runtime compiles (``zepp.runtime.program``). With ``sweeps`` (fewer water-fill sweeps than the
    bound), an incomplete plan is re-planned once with the full bound, so the result is always
    the numpy planner's."""
    try:
        return plan_batch(topk_ids_all, placement, routing, relaxation, dispatch, combine, row_bytes,
                          sweeps=sweeps, **kw).to_numpy()
    except IncompletePlan:
        if sweeps is None:
            raise
        return plan_batch(topk_ids_all, placement, routing, relaxation, dispatch, combine, row_bytes, **kw).to_numpy()
