"""Routing: which replica serves each entry of a batch.

The model's expert choices never change; routing only picks, per entry, one slot holding a
replica of the entry's expert. ``ROUTINGS`` below holds one record per choice (function, one-line
meaning, flags: ``zepp.planner.choices``; the registry's and ``zepp systems``' table); ``route``
runs one by name. One module per family:
``simple_routing`` (``home``, ``replica-rr``, ``locality``, ``fixed``, ``dynamic``, ``random``:
a replica from the placement alone), ``sglang_routing`` and ``vllm_routing`` (the engines'
replica choice exactly as SGLang 0.5.23 and vLLM 0.33.0 make it), ``zepp_routing`` and
``zepp_vacate`` (Zepp's water-fill and vacate pass), ``lp_routing`` (DeepSeek's LPLB over every
copy), ``moonep_routing`` (MoonEP's per-batch balance, with its own placement);
``table_routing`` (``zepp-table``: Zepp's water-fill run once per placement over the history's
expected demand, a batch routed by table lookup; ``decode_path`` says per step whether a decode
batch routes by that table or by a global plan), ``engine_tables`` (Zepp's routing in the
engines' own tables: SGLang's static dispatch map, vLLM's per-rank maps); ``base_routing`` holds
the default relaxation, the batch check and what they share.

An id of ``-1`` is a missing entry (padding); it gets slot ``-1`` and counts for no load. All
choices are vectorised numpy over entries; loops run over ranks, replicas, experts or rounds only.
Integer arithmetic throughout, so every rank computes the same routing bit for bit. A routing that
needs per-rank state (vLLM's token row) reads it from the batch layout ``[R, T, k]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.choices import Choice, ChoiceTable
from zepp.planner.routing.base_routing import check_batch, default_relaxation, entry_hash, position_in_group
from zepp.planner.routing.lp_routing import route_lp
from zepp.planner.routing.moonep_routing import moonep_plan, route_moonep
from zepp.planner.routing.engine_tables import (build_hash_table, build_prefill_hash_table, build_prefill_static_table,
                                                build_static_table, route_sglang_table, route_vllm_table)
from zepp.planner.routing.sglang_routing import route_sglang_dynamic, route_sglang_lp, route_sglang_static
from zepp.planner.routing.simple_routing import (route_dynamic, route_fixed, route_home, route_locality, route_random,
                                                 route_replica_rr)
from zepp.planner.routing.table_routing import (RoutingTable, build_lean_routing_table, build_routing_table,
                                                demand_per_gpu, rank_slots, route_by_table)
from zepp.planner.routing.vllm_routing import route_vllm_hash
from zepp.planner.routing.zepp_routing import route_zepp
from zepp.planner.types import Placement, Routing

__all__ = ["ROUTINGS", "RoutingChoice", "route", "check_batch", "position_in_group", "entry_hash", "moonep_plan",
           "RoutingTable", "build_routing_table", "demand_per_gpu", "route_by_table", "rank_slots", "default_relaxation",
           "build_static_table", "build_hash_table"]

@dataclass(frozen=True)
class RoutingChoice(Choice):
    """A routing: ``function(topk_ids [R, T, k] int32 (checked), placement, relaxation,
    vacate_rounds) -> Routing``, or for a table routing ``function(topk_ids, table) -> Routing``.
    Flags: ``needs_table`` routes by a table built once per placement from the history's expected
    demand by ``build_table(placement, demand [G, E], relaxation, gpus_per_node)``; ``table_path``: its
    decode batches may route by Zepp's routing table instead of a global plan
    (``zepp.planner.routing.decode_path``); ``own_slots``: it routes onto per-batch slots of its own
    (MoonEP's prefetch slots), which no placement file can hold; ``zepp_planner``: Zepp's per-batch
    planner decides it (a simulation charges Zepp's modelled planning for it)."""

    needs_table: bool = False
    build_table: Callable | None = None
    table_path: bool = False
    own_slots: bool = False
    zepp_planner: bool = False


ROUTINGS: ChoiceTable[RoutingChoice] = ChoiceTable("routing", (
    RoutingChoice("home", "replica 0 of each expert (its first slot)", route_home, torch_twin=True),
    RoutingChoice("replica-rr", "an expert's entries go to its replicas in turn (EPLB, TensorRT-LLM round-robin)",
                  route_replica_rr, torch_twin=True),
    RoutingChoice("locality", "a fixed replica per source GPU: on the source GPU if any, else on its node, else the "
                              "(source rank mod count)-th", route_locality, torch_twin=True),
    RoutingChoice("fixed", "EPIC: all of a source's entries of an expert go to replica (source rank mod replica "
                           "count)", route_fixed, torch_twin=True),
    RoutingChoice("dynamic", "per entry a replica on the source GPU, else on its node, else any, picked by an integer "
                             "hash of the entry", route_dynamic, torch_twin=True),
    RoutingChoice("random", "a pseudo-random replica per entry among all (integer hash of the entry's global index)",
                  route_random, torch_twin=True),
    RoutingChoice("sglang-static", "SGLang static dispatch: per source GPU one copy, the nearby one (own GPU, else own "
                                   "node where that excludes some), else SGLang's fair pick with random.Random(42)",
                  route_sglang_static, torch_twin=True),
    RoutingChoice("sglang-dynamic", "SGLang dynamic dispatch: per entry a uniform 16-bit draw mod the source's "
                                    "candidates (its nearby copy alone, else every copy)", route_sglang_dynamic),
    RoutingChoice("sglang-lp", "SGLang lp dispatch: LPLB's LP over every copy, each entry drawing among its source's "
                               "candidates with the LP's shares (its nearby copy alone, else every copy)",
                  route_sglang_lp),
    RoutingChoice("vllm-hash", "vLLM: copy ((t * 2654435769) mod 2^32) mod count in ascending slot order, t the "
                               "token's row in its rank's batch (the same on every rank)", route_vllm_hash,
                  torch_twin=True),
    RoutingChoice("zepp", "rotation water-fill under relaxed replica-load bounds, then the vacate pass (PAPER.md 2.2)",
                  route_zepp, torch_twin=True, table_path=True, zepp_planner=True),
    RoutingChoice("moonep", "MoonEP: per batch, every GPU computes T*k rows using E/R prefetch slots", route_moonep,
                  own_slots=True),
    RoutingChoice("lp", "DeepSeek LPLB (SGLang lp after an EPLB rebalance): per batch an LP splits each replicated "
                        "expert's global count over all its copies to minimise the busiest GPU; each entry draws a "
                        "copy with those shares", route_lp),
    RoutingChoice("zepp-table", "Zepp's water-fill run once per placement over the history's expected demand; a batch "
                                "routes by table lookup (replica shares per source GPU and expert)", route_by_table,
                  needs_table=True, build_table=build_routing_table),
    RoutingChoice("zepp-table-lean", "zepp-table over the fewest replicas that leave every GPU the fewest slots with "
                                     "work (decode: a GEMM reads the weights of every slot it serves)", route_by_table,
                  needs_table=True, build_table=build_lean_routing_table),
    RoutingChoice("sglang-table", "SGLang static dispatch over Zepp's table: per source GPU and expert one copy, "
                                  "planned from the history under Zepp's bounds with the busiest NIC in mind (decode)",
                  route_sglang_table, needs_table=True, build_table=build_static_table),
    RoutingChoice("sglang-table-prefill", "sglang-table with the busiest GPU's rows in mind instead (prefill)",
                  route_sglang_table, needs_table=True, build_table=build_prefill_static_table),
    RoutingChoice("vllm-table", "vLLM's hash over Zepp's per-rank maps: each copy listed in proportion to Zepp's "
                                "share of the source's demand, laid out so consecutive token rows follow the shares; "
                                "the busiest NIC in mind (decode)", route_vllm_table, needs_table=True,
                  build_table=build_hash_table),
    RoutingChoice("vllm-table-prefill", "vllm-table with the busiest GPU's rows in mind instead (prefill)",
                  route_vllm_table, needs_table=True, build_table=build_prefill_hash_table),
))


def route(name: str, topk_ids: np.ndarray, placement: Placement, relaxation: float = 0.25,
          vacate_rounds: int = 3, table: RoutingTable | None = None) -> Routing:
    """Route a batch ``topk_ids [R, T, k]`` onto ``placement`` with routing choice ``name``.

    ``relaxation`` (C) only matters for ``zepp``; its Routing carries C so ``validate()`` checks
    the replica-load bounds ``[floor((1-C) q), ceil((1+C) q)]``. ``vacate_rounds``: rounds of
    Zepp's vacate pass. ``table``: the table a ``needs_table`` routing routes by (built once per
    placement by its record's ``build_table`` from the history; required for it, unused otherwise).
    """
    choice = ROUTINGS.choice(name)
    if choice.needs_table:
        if table is None:
            raise ZeppInputError(f"routing {name!r} needs a routing table built from the history "
                                 "(ROUTINGS[name].build_table); pass table=")
        if table.placement is not placement and not np.array_equal(table.placement.slot_expert, placement.slot_expert):
            raise ZeppInputError(f"routing {name!r}: the routing table was built for another placement; rebuild it")
        return choice.function(check_batch(topk_ids, placement), table)
    return choice.function(check_batch(topk_ids, placement), placement, relaxation, vacate_rounds)
