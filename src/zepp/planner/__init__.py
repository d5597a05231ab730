"""The planner: which GPU serves each entry of a batch and which rows move where.

One batch flows through it in three steps, each a package with one entrance and one
``{name: function}`` table of choices that owns the choices' names and one-line meanings (the
registry reads them from here):

- ``placement/``: ``make_placement(name, hist, E, ranks, gpus_per_node)`` -> ``Placement`` (once,
  from history); ``PLACEMENTS``; one ``<name>_placement.py`` per choice, ``base_placement``;
- ``routing/``: ``route(name, topk_ids [R, T, k], placement)`` -> ``Routing`` (``slot [R, T, k]``);
  ``ROUTINGS``; ``simple_routing``, ``zepp_routing`` + ``zepp_vacate``, ``moonep_routing``,
  ``base_routing``;
- ``flows/``: ``build_flows(routing, dispatch, row_bytes, combine)`` -> ``FlowPlan`` (hop tables);
  ``DISPATCH_TRANSPORTS``, ``COMBINE_TRANSPORTS``, ``DEFAULT_COMBINE``; ``direct_flows``,
  ``gateway_flows``.

``plan_batch`` below is routing + flows by a system's stage names. ``types`` holds the shapes
(``Placement``, ``Routing``, ``Hops``, ``FlowPlan``) and the routing's invariants, ``validation``
the FlowPlan's; ``grouping`` and ``granularity`` cut a FlowPlan into dispatch groups and combine
waves for the executors (``grouping.OVERLAPS`` names the overlap choices); ``swaps`` plans
intra-node swaps when demand drifts (``swaps.ADAPTATIONS``); ``intsort`` sorts integer keys;
``torch/`` is the same planner on torch tensors of any device. The planner imports only
``zepp.errors``, ``zepp.model``, ``zepp.cluster`` and itself; nothing here knows an executor.
"""

from zepp.planner.flows import build_flows
from zepp.planner.placement import make_placement, rebalance_experts
from zepp.planner.routing import route
from zepp.planner.types import FlowPlan, Hops, LinkStats, Placement, Routing

__all__ = ["make_placement", "rebalance_experts", "route", "build_flows", "plan_batch", "Placement", "Routing",
           "Hops", "FlowPlan", "LinkStats"]


def plan_batch(topk_ids, placement: Placement, system, row_bytes: int, relaxation: float = 0.25) -> FlowPlan:
    """The one entrance for a batch: route ``topk_ids [R, T, k]`` over ``placement`` and build the flows.

    ``system``: any object with ``routing``, ``dispatch`` and ``combine`` stage names (a
    ``zepp.registry.System`` row); ``row_bytes``: one row on the wire (``hidden * dtype_bytes``).
    The result is the same on every rank that calls it with the same arguments (integer planner).
    """
    routing = route(system.routing, topk_ids, placement, relaxation)
    return build_flows(routing, system.dispatch, row_bytes, system.combine)
