"""Flows in torch: the numpy planner's hop tables (``zepp.planner.flows.build_flows``), element for element.

The tree mirrors the numpy one module for module and name for name: ``entry_view`` (the routing
as fixed grids: ``EntryView``), ``direct_flows`` (``a2av``, ``dedup``, ``allgather``),
``gateway_flows`` (``relay``, ``zepp``, ``reduce``, ``reduce-direct``, ``nic_split``);
``hop_parts`` (torch only) fills a hop table. ``build_flows`` runs a pair by name: the numpy
records' ``twin()`` (``zepp.planner.choices``), so there is no second table of names; a transport
whose record has no torch twin is refused.

``HopParts.pack`` concatenates a phase's hop groups in the numpy planner's order and compacts
the kept rows to the front of a fixed-capacity buffer (a prefix sum and a scatter), so a whole
phase is built without any value read back to the host; only the row count of each table is
data-dependent (``TorchHops.count``, a device scalar).
"""

from __future__ import annotations

from zepp.errors import ZeppInputError
from zepp.planner.choices import twin_of
from zepp.planner.flows import COMBINES, DISPATCHES, VolumeState
from zepp.planner.flows import check_transports as numpy_check_transports
from zepp.planner.torch.flows.entry_view import EntryView
from zepp.planner.torch.flows.token_counts import TokenCounts
from zepp.planner.torch.routing.base_routing import default_sync
from zepp.planner.torch.types import TorchFlowPlan, TorchRouting
from zepp.planner.volumes import PlanVolumes

__all__ = ["build_flows", "build_hops", "build_volumes", "check_transports"]


def check_transports(dispatch: str, combine: str | None) -> tuple[str, str]:
    """Validate a (dispatch, combine) pair as ``zepp.planner.flows`` does; ``None`` takes the natural
    combine; refuse a transport whose record has no torch twin."""
    dispatch, combine = numpy_check_transports(dispatch, combine)
    if not (DISPATCHES[dispatch].torch_twin and COMBINES[combine].torch_twin):
        raise ZeppInputError(f"transport {dispatch}/{combine} has no torch planner; the torch planner has "
                             f"dispatch {', '.join(DISPATCHES.having('torch_twin'))} and combine "
                             f"{', '.join(COMBINES.having('torch_twin'))} (use the numpy planner)")
    return dispatch, combine


def build_flows(routing: TorchRouting, dispatch: str, row_bytes: int, combine: str | None = None,
                coalesce: bool = True, *, sync: bool | None = None) -> TorchFlowPlan:
    """The device FlowPlan of ``routing`` (see ``zepp.planner.flows.build_flows``), equal after
    ``to_numpy()`` to the numpy planner's: its volumes (``build_volumes``) and hop tables
    (``build_hops``) built on first use. ``sync=False`` (default while a CUDA graph is being
    captured): hop tables in fixed-capacity buffers, no host read (capturable); ``sync=True``: tables
    of exactly ``count`` rows (``nonzero``; its output size is a host read), and the volumes list
    the few rows a GPU hands another NIC (one more ``nonzero``) where ``sync=False`` marks them on
    fixed grids, or, for a ``short`` routing (planned with ``sweeps``), lists them in a short
    fixed-capacity list (``TorchVolumes.overflow`` flags one too short)."""
    dispatch, combine = check_transports(dispatch, combine)
    exact = default_sync(routing.slot) if sync is None else bool(sync)
    return TorchFlowPlan(routing, routing.placement.gpus_per_node, int(row_bytes), dispatch, combine, coalesce,
                         exact=exact)


def build_volumes(routing: TorchRouting, dispatch: str, combine: str, coalesce: bool = True,
                  sync: bool = False) -> VolumeState:
    """``zepp.planner.flows.build_volumes`` in torch: its ``volumes`` are ``TorchVolumes``; with
    ``sync`` the few rows a GPU hands another NIC are listed (``nonzero``), else marked on grids
    (or listed in a short fixed-capacity list where the routing is ``short``)."""
    tc = TokenCounts(routing, sync)
    d, gateways = twin_of(DISPATCHES[dispatch].volumes)(tc, coalesce)
    return VolumeState(tc, gateways, PlanVolumes(d, twin_of(COMBINES[combine].volumes)(tc, gateways)))


def build_hops(routing: TorchRouting, dispatch: str, combine: str, coalesce: bool = True, exact: bool = True):
    """``zepp.planner.flows.build_hops`` in torch: ``(dispatch, combine)`` ``TorchHops``."""
    x = EntryView(routing)
    d, remote_rows = DISPATCHES[dispatch].twin()(x, coalesce)
    c = COMBINES[combine].twin()(x, remote_rows)
    return d.pack(exact), c.pack(exact)
