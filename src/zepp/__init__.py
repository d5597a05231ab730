"""zepp: plan, simulate and execute distributed MoE layers under relaxed balance constraints.

The packages follow one batch through the pipeline: ``traces`` (what the router chose) ->
``planner`` (placement, routing, flow plan) -> ``sim`` (simulated executor) or ``runtime`` (real
executor on torch.distributed) -> ``serve`` (whole transformers models); ``interop`` (engines'
files), ``emulate`` (the emulated cluster), ``launch`` (spawning ranks) and ``cli`` (commands)
serve them. ``registry`` is the one table of systems.
"""

from zepp.cluster import Cluster, cluster_preset
from zepp.errors import ZeppInputError
from zepp.model import MoESpec, model_preset
from zepp.planner.types import FlowPlan, Hops, Placement, Routing
from zepp.planner.volumes import LinkStats


__all__ = [
    "Cluster", "cluster_preset", "MoESpec", "model_preset", "ZeppInputError",
    "Placement", "Routing", "FlowPlan", "Hops", "LinkStats",
]
__version__ = "0.1.0"
