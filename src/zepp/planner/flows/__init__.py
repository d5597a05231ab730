"""Flows: the dispatch and combine hop tables of a routing, one transport per phase.

``DISPATCH_TRANSPORTS`` and ``COMBINE_TRANSPORTS`` below name the transports with their one-line
meanings (the registry's and ``zepp systems``' tables); ``DEFAULT_COMBINE`` pairs each dispatch
with its natural combine; ``build_flows`` builds a pair by name. ``direct_flows`` holds the
one-stage transports (``a2av``, ``dedup``, ``allgather``), ``gateway_flows`` the ones through a
gateway GPU of each destination node (dispatch ``relay``, ``zepp``; combine ``reduce``,
``reduce-direct``). See ``zepp.planner.types.Hops`` for what a hop means and the stage rules.

Missing entries (id ``-1``, slot ``-1``) move nothing. Everything is vectorised numpy over rows.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from zepp.errors import ZeppInputError
from zepp.planner.flows.direct_flows import (a2av_combine, a2av_dispatch, allgather_dispatch, dedup_combine,
                                             dedup_dispatch)
from zepp.planner.flows.gateway_flows import (reduce_combine, reduce_direct_combine, relay_dispatch,
                                              zepp_dispatch)
from zepp.planner.types import EntryView, FlowPlan, Hops, Routing, nic_split

__all__ = ["build_flows", "check_transports", "transport_pairs", "nic_split", "DISPATCH_TRANSPORTS",
           "COMBINE_TRANSPORTS", "DEFAULT_COMBINE", "DISPATCHES", "COMBINES", "DispatchTransport", "CombineTransport"]


class DispatchTransport(NamedTuple):
    """A dispatch transport: ``build(x: EntryView, coalesce) -> (Hops, RemoteRows | None)``, its
    one-line meaning, its natural combine, whether its rows land on gateways (what the reducing
    combines need), whether it has a hop table at all and whether it balances each node-to-node
    stream over the node's NICs (``zepp.planner.validation`` checks the caps)."""

    build: Callable
    meaning: str
    natural_combine: str
    gatewayed: bool = False
    has_hops: bool = True
    nic_balanced: bool = False


class CombineTransport(NamedTuple):
    """A combine transport: ``build(x: EntryView, remote_rows) -> Hops``, its one-line meaning,
    whether it pre-reduces on the dispatch's gateways (then it needs a gatewayed dispatch)."""

    build: Callable
    meaning: str
    reduces: bool = False


DISPATCHES = {
    "a2av": DispatchTransport(a2av_dispatch, "one row per entry, owner -> computing GPU", "a2av"),
    "dedup": DispatchTransport(dedup_dispatch, "one row per (token, computing GPU), owner -> computing GPU", "dedup"),
    "relay": DispatchTransport(
        relay_dispatch, "one NIC crossing per (token, node) to the same local index, then NVLink fan-out", "dedup",
        gatewayed=True),
    "zepp": DispatchTransport(
        zepp_dispatch, "relay + NIC-balanced minimal-move split + coalescing (PAPER.md 2.4)", "reduce",
        gatewayed=True, nic_balanced=True),
    "allgather": DispatchTransport(
        allgather_dispatch, "COMET: every GPU receives every other GPU's whole shard (routing-oblivious)", "dedup",
        has_hops=False),
}

COMBINES = {
    "a2av": CombineTransport(a2av_combine, "one row per entry, computing GPU -> owner"),
    "dedup": CombineTransport(dedup_combine, "one row per (token, computing GPU), summed there, straight to the owner"),
    "reduce": CombineTransport(
        reduce_combine, "pre-reduced on the computing node's gateway, NIC once, back through the dispatch carrier",
        reduces=True),
    "reduce-direct": CombineTransport(
        reduce_direct_combine, "pre-reduced on the computing node's gateway, NIC once, straight to the owner",
        reduces=True),
}

DISPATCH_TRANSPORTS: dict[str, str] = {name: t.meaning for name, t in DISPATCHES.items()}
COMBINE_TRANSPORTS: dict[str, str] = {name: t.meaning for name, t in COMBINES.items()}
# Natural combine of each dispatch transport (what ``build_flows`` pairs it with by default).
DEFAULT_COMBINE: dict[str, str] = {name: t.natural_combine for name, t in DISPATCHES.items()}
_GATEWAYED = tuple(name for name, t in DISPATCHES.items() if t.gatewayed)


def check_transports(dispatch: str, combine: str | None) -> tuple[str, str]:
    """Validate a (dispatch, combine) pair; ``combine=None`` takes the dispatch's natural one."""
    if dispatch not in DISPATCHES:
        raise ZeppInputError(f"unknown dispatch transport {dispatch!r}; choose one of {', '.join(DISPATCH_TRANSPORTS)}")
    combine = DEFAULT_COMBINE[dispatch] if combine is None else combine
    if combine not in COMBINES:
        raise ZeppInputError(f"unknown combine transport {combine!r}; choose one of {', '.join(COMBINE_TRANSPORTS)}")
    if COMBINES[combine].reduces and not DISPATCHES[dispatch].gatewayed:
        raise ZeppInputError(f"combine {combine!r} pre-reduces on the dispatch's gateways; it needs a "
                             f"{' or '.join(_GATEWAYED)} dispatch, not {dispatch!r}")
    return dispatch, combine


def transport_pairs(with_hops: bool = True) -> list[tuple[str, str]]:
    """Every valid (dispatch, combine) pair; ``with_hops`` leaves out dispatches without a hop
    table (``allgather``: no real executor runs it)."""
    return [(d, c) for d, dt in DISPATCHES.items() if dt.has_hops or not with_hops
            for c, ct in COMBINES.items() if not ct.reduces or dt.gatewayed]


def build_flows(routing: Routing, dispatch: str, row_bytes: int, combine: str | None = None,
                coalesce: bool = True) -> FlowPlan:
    """The FlowPlan of ``routing`` with ``dispatch`` and ``combine`` transports (``combine``
    defaults to the dispatch's natural one, ``DEFAULT_COMBINE``). ``row_bytes``: bytes of one
    hidden row.

    ``coalesce`` (``zepp`` dispatch only): pieces one NIC carries to one node travel as one
    message; without it, each piece keeps its own message (for ablation).
    """
    dispatch, combine = check_transports(dispatch, combine)
    x = EntryView(routing)
    d, remote_rows = DISPATCHES[dispatch].build(x, coalesce)
    c: Hops = COMBINES[combine].build(x, remote_rows)
    return FlowPlan(routing, d, c, routing.placement.gpus_per_node, int(row_bytes), dispatch, combine)
