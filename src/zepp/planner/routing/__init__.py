"""Routing: which replica serves each entry of a batch.

The model's expert choices never change; routing only picks, per entry, one slot holding a
replica of the entry's expert. ``ROUTINGS`` below names the choices with their one-line meanings
(the registry's and ``zepp systems``' table); ``route`` runs one by name. One module per family:
``simple_routing`` (``home``, ``replica-rr``, ``locality``, ``fixed``, ``dynamic``, ``random``:
a replica from the placement alone), ``zepp_routing`` and ``zepp_vacate`` (Zepp's water-fill
and vacate pass), ``lp_routing`` (SGLang's ``lp`` dispatch, DeepSeek's LPLB), ``moonep_routing``
(MoonEP's per-batch balance, with its own placement); ``table_routing`` (``zepp-table``: Zepp's
water-fill run once per placement over the history's expected demand, a batch routed by table
lookup); ``base_routing`` holds the batch check and what they share.

An id of ``-1`` is a missing entry (padding); it gets slot ``-1`` and counts for no load. All
choices are vectorised numpy over entries; loops run over ranks, replicas or rounds only.
Integer arithmetic throughout, so every rank computes the same routing bit for bit.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.routing.base_routing import check_batch, entry_hash, position_in_group
from zepp.planner.routing.lp_routing import route_lp
from zepp.planner.routing.moonep_routing import moonep_plan, route_moonep
from zepp.planner.routing.simple_routing import (route_dynamic, route_fixed, route_home, route_locality, route_random,
                                                 route_replica_rr)
from zepp.planner.routing.table_routing import (RoutingTable, build_routing_table, demand_per_gpu, rank_slots,
                                                route_by_table)
from zepp.planner.routing.zepp_routing import route_zepp
from zepp.planner.types import Placement, Routing

__all__ = ["ROUTINGS", "ROUTING_NAMES", "route", "check_batch", "position_in_group", "entry_hash", "moonep_plan",
           "RoutingTable", "build_routing_table", "demand_per_gpu", "route_by_table", "rank_slots", "TABLE_ROUTING", "LEAN_TABLE_ROUTING",
           "TABLE_ROUTINGS"]

TABLE_ROUTING = "zepp-table"  # the routings that need a RoutingTable (route(..., table=...))
LEAN_TABLE_ROUTING = "zepp-table-lean"
TABLE_ROUTINGS = (TABLE_ROUTING, LEAN_TABLE_ROUTING)


class _Choice(NamedTuple):
    """One routing: ``route(topk_ids [R, T, k] int32 (checked), placement, relaxation,
    vacate_rounds) -> Routing`` and its one-line meaning."""

    route: Callable[[np.ndarray, Placement, float, int], Routing] | None  # None: zepp-table (needs its table)
    meaning: str


_CHOICES = {
    "home": _Choice(route_home, "replica 0 of each expert (its first slot)"),
    "replica-rr": _Choice(route_replica_rr,
                          "an expert's entries go to its replicas in turn (EPLB, TensorRT-LLM round-robin)"),
    "locality": _Choice(route_locality, "SGLang static: a fixed replica per source GPU, on the source GPU if any, "
                                        "else on its node, else any"),
    "fixed": _Choice(route_fixed, "EPIC: all of a source's entries of an expert go to replica (source rank mod "
                                  "replica count)"),
    "dynamic": _Choice(route_dynamic, "SGLang dynamic: per token, a replica on the source GPU, else on its node, "
                                      "else a hashed one"),
    "random": _Choice(route_random, "vLLM: a pseudo-random replica per entry (integer hash, the same on every rank)"),
    "zepp": _Choice(route_zepp, "rotation water-fill under relaxed replica-load bounds, then the vacate pass "
                                "(PAPER.md 2.2)"),
    "moonep": _Choice(route_moonep, "MoonEP: per batch, every GPU computes T*k rows using E/R prefetch slots"),
    "lp": _Choice(route_lp, "SGLang lp (DeepSeek LPLB): per batch an LP splits each replicated expert's global "
                            "count over its copies to minimise the busiest GPU; each entry draws a copy with "
                            "those shares"),
    TABLE_ROUTING: _Choice(None, "Zepp's water-fill run once per placement over the history's expected demand; "
                                 "a batch routes by table lookup (replica shares per source GPU and expert)"),
    LEAN_TABLE_ROUTING: _Choice(None, "zepp-table over the fewest replicas that leave every GPU the fewest slots with "
                                      "work (decode: a GEMM reads the weights of every slot it serves)"),
}

ROUTINGS: dict[str, str] = {name: c.meaning for name, c in _CHOICES.items()}
ROUTING_NAMES = tuple(ROUTINGS)


def route(name: str, topk_ids: np.ndarray, placement: Placement, relaxation: float = 0.25,
          vacate_rounds: int = 3, table: RoutingTable | None = None) -> Routing:
    """Route a batch ``topk_ids [R, T, k]`` onto ``placement`` with routing choice ``name``.

    ``relaxation`` (C) only matters for ``zepp``; its Routing carries C so ``validate()`` checks
    the replica-load bounds ``[floor((1-C) q), ceil((1+C) q)]``. ``vacate_rounds``: rounds of
    Zepp's vacate pass. ``table``: the ``RoutingTable`` that ``zepp-table`` routes by (built once
    per placement with ``build_routing_table`` from the history; required for it, unused otherwise).
    """
    choice = _CHOICES.get(name)
    if choice is None:
        raise ZeppInputError(f"unknown routing {name!r}; choose one of {', '.join(ROUTING_NAMES)}")
    if name in TABLE_ROUTINGS:
        if table is None:
            raise ZeppInputError(f"routing {name!r} needs a routing table built from the history "
                                 "(zepp.planner.routing.build_routing_table); pass table=")
        if table.placement is not placement and not np.array_equal(table.placement.slot_expert, placement.slot_expert):
            raise ZeppInputError(f"routing {name!r}: the routing table was built for another placement; rebuild it")
        return route_by_table(check_batch(topk_ids, placement), table)
    return choice.route(check_batch(topk_ids, placement), placement, relaxation, vacate_rounds)
