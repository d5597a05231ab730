"""zepp: plan, simulate and execute distributed MoE layers under relaxed balance constraints."""

from zepp.cluster import Cluster, cluster_preset
from zepp.errors import ZeppInputError
from zepp.model import MoESpec, model_preset
from zepp.plan import FlowPlan, Hops, LinkStats, Placement, Routing

__all__ = [
    "Cluster", "cluster_preset", "MoESpec", "model_preset", "ZeppInputError",
    "Placement", "Routing", "FlowPlan", "Hops", "LinkStats",
]
__version__ = "0.1.0"
