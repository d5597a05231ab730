"""The one way to plan a batch: routing, then flows, on the numpy planner or the torch planner.

Every caller plans through ``plan_batch``: the simulator, the runtime's Dispatcher, ``zepp plan``,
``zepp place``'s report, the emulated cluster's simcheck and the benchmarks. The numpy path never
imports torch; the torch path (``zepp.planner.torch``) runs on the ids' device.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from zepp.errors import ZeppInputError
from zepp.planner.flows import build_flows
from zepp.planner.routing import ROUTINGS, RoutingTable, default_relaxation, route
from zepp.planner.types import FlowPlan, Placement, Routing

__all__ = ["Stages", "plan_batch", "BACKENDS"]

BACKENDS = ("numpy", "torch")


class Stages(NamedTuple):
    """The stage names ``plan_batch`` reads (a ``zepp.registry.System`` row has the same fields)."""

    routing: str
    dispatch: str
    combine: str | None = None


def _is_tensor(obj) -> bool:
    """A torch tensor, told without importing torch."""
    return type(obj).__module__.split(".")[0] == "torch"


def _backend(backend: str | None, ids, routing) -> str:
    if backend is None:
        held = routing if routing is not None else ids
        return "torch" if _is_tensor(held) or type(held).__name__ == "TorchRouting" else "numpy"
    if backend not in BACKENDS:
        raise ZeppInputError(f"unknown planner backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def plan_batch(ids, placement: Placement, stages, row_bytes: int, relaxation: float | None = None,
               backend: str | None = None, *, table: RoutingTable | None = None, routing: Routing | None = None,
               vacate_rounds: int = 3, coalesce: bool = True, device=None, sync: bool | None = None,
               sweeps: int | None = None, host: bool = False, timings: dict | None = None):
    """Route ``ids [R, T, k]`` (``-1``: a missing entry) over ``placement`` and build the flows.

    ``stages``: the ``routing``, ``dispatch`` and ``combine`` names (a registry ``System`` or a
    ``Stages``); ``row_bytes``: one row on the wire; ``relaxation``: C (``None``: the default rule,
    ``default_relaxation(placement.nodes)``); ``backend``: ``"numpy"``, ``"torch"`` or ``None`` (a
    torch tensor plans in torch on its device, anything else in numpy); ``table``: the
    ``RoutingTable`` of the table routings; ``routing``: this batch's routing when the caller has
    it already (the simulator routes once for every transport of a placement and routing).

    Returns the numpy ``FlowPlan``, or with the torch backend a ``TorchFlowPlan`` whose hop tables
    stay on the device; ``host=True`` brings it back as the numpy ``FlowPlan`` (one read of the
    table sizes; with ``sweeps``, a batch the shortened water-fill left incomplete is planned again
    with the full bound, so the result always equals the numpy planner's). ``sync``, ``sweeps``,
    ``device``: see ``zepp.planner.torch`` (``sync=False`` reads nothing back, so the call can be
    captured in a CUDA graph). ``timings``: receives the seconds of ``routing`` and ``flows``.
    The result is the same on every rank that calls it with the same arguments.
    """
    C = default_relaxation(placement.nodes) if relaxation is None else relaxation
    if _backend(backend, ids, routing) == "numpy":
        return _plan_numpy(ids, placement, stages, row_bytes, C, table, routing, vacate_rounds, coalesce, timings)
    return _plan_torch(ids, placement, stages, row_bytes, C, routing, vacate_rounds, coalesce, device, sync, sweeps,
                       host, timings)


def _plan_numpy(ids, placement, stages, row_bytes, C, table, routing, vacate_rounds, coalesce, timings) -> FlowPlan:
    t0 = time.perf_counter()
    if routing is None:
        if _is_tensor(ids):
            ids = ids.cpu().numpy()
        routing = route(stages.routing, ids, placement, C, vacate_rounds, table=table)
    t1 = time.perf_counter()
    plan = build_flows(routing, stages.dispatch, row_bytes, stages.combine, coalesce)
    if timings is not None:
        timings.update(routing=t1 - t0, flows=time.perf_counter() - t1)
    return plan


def _plan_torch(ids, placement, stages, row_bytes, C, routing, vacate_rounds, coalesce, device, sync, sweeps, host,
                timings):
    from zepp.planner import torch as tp

    if not ROUTINGS.choice(stages.routing).torch_twin:
        raise ZeppInputError(f"routing {stages.routing!r} has no torch planner; plan it with backend='numpy'")
    t0 = time.perf_counter()
    if routing is None:
        routing = tp.route(stages.routing, tp.as_device_ids(ids, device), placement, C, vacate_rounds, sync=sync,
                           sweeps=sweeps)
    elif not isinstance(routing, tp.TorchRouting):
        routing = tp.route_to_torch(routing, device)
    t1 = time.perf_counter()
    try:
        plan = tp.build_flows(routing, stages.dispatch, row_bytes, stages.combine, coalesce, sync=sync)
        plan = plan.to_numpy() if host else plan
    except tp.IncompletePlan:
        if not host or sweeps is None:
            raise
        return _plan_torch(ids, placement, stages, row_bytes, C, None, vacate_rounds, coalesce, device, sync, None,
                           host, timings)
    if timings is not None:
        timings.update(routing=t1 - t0, flows=time.perf_counter() - t1)
    return plan
