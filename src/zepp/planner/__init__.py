"""The planner: which GPU serves each entry of a batch and which rows move where.

A batch flows through its stages, each a package with one entrance and one ``ChoiceTable`` of
records (``choices``: per choice its function, one-line meaning, capability flags and whether
the torch planner has its twin; the registry composes systems of them):

- ``placement/``: ``make_placement(name, hist, E, ranks, gpus_per_node)`` -> ``Placement`` (once,
  from history); ``PLACEMENTS``; one ``<name>_placement.py`` per choice, ``base_placement``;
- ``routing/``: ``route(name, topk_ids [R, T, k], placement)`` -> ``Routing`` (``slot [R, T, k]``);
  ``ROUTINGS``; ``simple_routing``, ``zepp_routing`` + ``zepp_vacate``, ``lp_routing``,
  ``moonep_routing``, ``table_routing`` + ``decode_path``, ``base_routing`` (with
  ``default_relaxation``, the one rule for Zepp's C);
- ``flows/``: ``build_flows(routing, dispatch, row_bytes, combine)`` -> ``FlowPlan`` (hop tables);
  ``DISPATCHES``, ``COMBINES``; ``direct_flows``, ``gateway_flows``, ``call_scopes``;
- ``overlap/``: ``OVERLAPS`` (and ``OVERLAP_COMMS``); ``grouping`` (dispatch groups, combine waves,
  messages for both executors), ``granularity`` (``zepp-auto``'s per-batch choice);
- ``adaptation/``: ``ADAPTATIONS``; ``swaps`` (intra-node swaps when demand drifts).

``plan_batch`` (``batch``) is the one way to plan a batch (routing + flows, numpy or torch).
``types`` holds the shapes (``Placement``, ``Routing``, ``Hops``, ``FlowPlan``) and the routing's
invariants, ``validation`` the FlowPlan's; ``intsort`` sorts integer keys; ``torch/`` is the same
planner on torch tensors of any device. The planner imports only ``zepp.errors``, ``zepp.model``,
``zepp.cluster`` and itself; nothing here knows an executor.
"""

from zepp.planner.batch import BACKENDS, Stages, plan_batch
from zepp.planner.flows import build_flows
from zepp.planner.placement import make_placement, rebalance_experts
from zepp.planner.routing import default_relaxation, route
from zepp.planner.types import FlowPlan, Hops, Placement, Routing
from zepp.planner.volumes import LinkStats

__all__ = ["make_placement", "rebalance_experts", "route", "build_flows", "plan_batch", "Stages", "BACKENDS",
           "default_relaxation", "Placement", "Routing", "Hops", "FlowPlan", "LinkStats"]
