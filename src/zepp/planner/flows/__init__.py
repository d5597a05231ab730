"""Flows: the dispatch and combine hop tables of a routing, one transport per phase.

``DISPATCHES`` and ``COMBINES`` below hold one record per transport (function, one-line meaning,
flags: ``zepp.planner.choices``; the registry's and ``zepp systems``' tables; a dispatch names its
natural combine); ``build_flows`` builds a pair by name from the routing's ``EntryView``
(``entry_view``: its entries and their per-token deduplications). ``direct_flows`` holds the
one-stage transports (``a2av``, ``dedup``, ``allgather``), ``gateway_flows`` the ones through a
gateway GPU of each destination node (dispatch ``relay``, ``zepp``; combine ``reduce``,
``reduce-direct``) and ``nic_split``, the zepp dispatch's NIC balance; ``call_scopes`` says
which process group carries each collective call of a plan (the rail-aligned hierarchy both
executors follow). See ``zepp.planner.types.Hops`` for what a hop means and the stage rules.

Missing entries (id ``-1``, slot ``-1``) move nothing. Everything is vectorised numpy over rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from zepp.errors import ZeppInputError
from zepp.planner.choices import Choice, ChoiceTable
from typing import Callable, NamedTuple

from zepp.planner.flows import direct_volumes as dv
from zepp.planner.flows import gateway_volumes as gv
from zepp.planner.flows.direct_flows import (a2av_combine, a2av_dispatch, allgather_dispatch, dedup_combine,
                                             dedup_dispatch)
from zepp.planner.flows.entry_view import EntryView
from zepp.planner.flows.gateway_flows import (nic_split, reduce_combine, reduce_direct_combine, relay_dispatch,
                                              zepp_dispatch)
from zepp.planner.flows.token_counts import TokenCounts
from zepp.planner.types import FlowPlan, Hops, Routing
from zepp.planner.volumes import PlanVolumes

__all__ = ["build_flows", "build_hops", "build_volumes", "VolumeState", "check_transports", "transport_pairs", "nic_split",
           "DISPATCHES", "COMBINES", "DispatchChoice", "CombineChoice"]


@dataclass(frozen=True)
class DispatchChoice(Choice):
    """A dispatch transport: ``function(x: EntryView, coalesce) -> (Hops, RemoteRows | None)``
    builds its hop table, ``volumes(tc: TokenCounts, coalesce) -> (Volumes, Gateways | None)`` its
    volumes. ``natural_combine``: the combine ``build_flows`` pairs it with by default. Flags:
    ``gatewayed`` (its rows land on gateways, what the reducing combines need), ``has_hops`` (it
    has a hop table at all: a real executor can run it), ``nic_balanced`` (each node-to-node
    stream balanced over the node's NICs; ``zepp.planner.validation`` checks the caps)."""

    volumes: Callable | None = None
    natural_combine: str = "a2av"
    gatewayed: bool = False
    has_hops: bool = True
    nic_balanced: bool = False


@dataclass(frozen=True)
class CombineChoice(Choice):
    """A combine transport: ``function(x: EntryView, remote_rows) -> Hops`` builds its hop table,
    ``volumes(tc: TokenCounts, gateways) -> Volumes`` its volumes. ``reduces``: it pre-reduces on
    the dispatch's gateways (then it needs a gatewayed dispatch); ``via_carrier``: the pre-reduced
    rows cross back to the dispatch's carrier, which forwards them to the owner."""

    volumes: Callable | None = None
    reduces: bool = False
    via_carrier: bool = False


DISPATCHES: ChoiceTable[DispatchChoice] = ChoiceTable("dispatch transport", (
    DispatchChoice("a2av", "one row per entry, owner -> computing GPU", a2av_dispatch, True, dv.a2av_dispatch,
                   natural_combine="a2av"),
    DispatchChoice("dedup", "one row per (token, computing GPU), owner -> computing GPU", dedup_dispatch, True,
                   dv.dedup_dispatch, natural_combine="dedup"),
    DispatchChoice("relay", "one NIC crossing per (token, node) to the same local index, then NVLink fan-out",
                   relay_dispatch, True, gv.relay_dispatch, natural_combine="dedup", gatewayed=True),
    DispatchChoice("zepp", "relay + NIC-balanced minimal-move split + coalescing (PAPER.md 2.4)", zepp_dispatch, True,
                   gv.zepp_dispatch, natural_combine="reduce", gatewayed=True, nic_balanced=True),
    DispatchChoice("allgather", "COMET: every GPU receives every other GPU's whole shard (routing-oblivious)",
                   allgather_dispatch, True, dv.allgather_dispatch, natural_combine="dedup", has_hops=False),
))

COMBINES: ChoiceTable[CombineChoice] = ChoiceTable("combine transport", (
    CombineChoice("a2av", "one row per entry, computing GPU -> owner", a2av_combine, True, dv.a2av_combine),
    CombineChoice("dedup", "one row per (token, computing GPU), summed there, straight to the owner", dedup_combine,
                  True, dv.dedup_combine),
    CombineChoice("reduce", "pre-reduced on the computing node's gateway, NIC once, back through the dispatch carrier",
                  reduce_combine, True, gv.reduce_combine, reduces=True, via_carrier=True),
    CombineChoice("reduce-direct", "pre-reduced on the computing node's gateway, NIC once, straight to the owner",
                  reduce_direct_combine, True, gv.reduce_direct_combine, reduces=True),
))


def check_transports(dispatch: str, combine: str | None) -> tuple[str, str]:
    """Validate a (dispatch, combine) pair; ``combine=None`` takes the dispatch's natural one."""
    d = DISPATCHES.choice(dispatch)
    combine = d.natural_combine if combine is None else combine
    if COMBINES.choice(combine).reduces and not d.gatewayed:
        raise ZeppInputError(f"combine {combine!r} pre-reduces on the dispatch's gateways; it needs a "
                             f"{' or '.join(DISPATCHES.having('gatewayed'))} dispatch, not {dispatch!r}")
    return dispatch, combine


def transport_pairs(with_hops: bool = True) -> list[tuple[str, str]]:
    """Every valid (dispatch, combine) pair; ``with_hops`` leaves out dispatches without a hop
    table (``allgather``: no real executor runs it)."""
    return [(d, c) for d, dt in DISPATCHES.items() if dt.has_hops or not with_hops
            for c, ct in COMBINES.items() if not ct.reduces or dt.gatewayed]


def build_flows(routing: Routing, dispatch: str, row_bytes: int, combine: str | None = None,
                coalesce: bool = True) -> FlowPlan:
    """The FlowPlan of ``routing`` with ``dispatch`` and ``combine`` transports (``combine``
    defaults to the dispatch's natural one, ``DISPATCHES[dispatch].natural_combine``). ``row_bytes``:
    bytes of one hidden row. Its volumes and hop tables are built on first use (``build_volumes``,
    ``build_hops``).

    ``coalesce`` (``zepp`` dispatch only): pieces one NIC carries to one node travel as one
    message; without it, each piece keeps its own message (for ablation).
    """
    dispatch, combine = check_transports(dispatch, combine)
    return FlowPlan(routing, routing.placement.gpus_per_node, int(row_bytes), dispatch, combine, coalesce)


class VolumeState(NamedTuple):
    """What a plan's volumes are built from and with: the routing's ``TokenCounts``, the
    dispatch's ``Gateways`` (``None`` for the direct transports) and the ``PlanVolumes``."""

    counts: TokenCounts
    gateways: object
    volumes: PlanVolumes


def build_volumes(routing: Routing, dispatch: str, combine: str, coalesce: bool = True) -> VolumeState:
    """The ``VolumeState`` of a (checked) transport pair: its volumes from the routing's counts."""
    tc = TokenCounts(routing)
    d, gateways = DISPATCHES[dispatch].volumes(tc, coalesce)
    return VolumeState(tc, gateways, PlanVolumes(d, COMBINES[combine].volumes(tc, gateways)))


def build_hops(routing: Routing, dispatch: str, combine: str, coalesce: bool = True) -> tuple[Hops, Hops]:
    """The ``(dispatch, combine)`` hop tables of a (checked) transport pair, from the routing's
    ``EntryView``: one hop per row moved (what an executor runs)."""
    x = EntryView(routing)
    d, remote_rows = DISPATCHES[dispatch].function(x, coalesce)
    return d, COMBINES[combine].function(x, remote_rows)
