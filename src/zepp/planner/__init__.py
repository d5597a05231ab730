"""The planner: which GPU serves each entry of a batch and which rows move where.

One batch flows through it in three steps, each with one entrance and one ``{name: function}``
table of choices (the registry's stage names):

- ``placement``: ``make_placement(name, hist, E, ranks, gpus_per_node)`` -> ``Placement`` (once, from history);
- ``routing``: ``route(name, topk_ids [R, T, k], placement)`` -> ``Routing`` (``slot [R, T, k]``);
- ``flows``: ``build_flows(routing, dispatch, row_bytes, combine)`` -> ``FlowPlan`` (hop tables).

``types`` holds the shapes (``Placement``, ``Routing``, ``Hops``, ``FlowPlan``) and their
invariants; ``grouping`` and ``granularity`` cut a FlowPlan into dispatch groups and combine
waves for the executors; ``swaps`` plans intra-node swaps when demand drifts; ``torch`` is the same
planner on torch tensors of any device. Nothing here knows an executor.
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
