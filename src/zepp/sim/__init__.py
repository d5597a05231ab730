"""The simulated executor: the same FlowPlans as the runtime, on clusters we do not have.

- ``engine``: the event-driven engine (``TaskGraph``, ``simulate``, ``Timeline``).
- ``layer``: one MoE layer's task graph from a FlowPlan (``LayerPlan``, ``build_layer``).
- ``mechanics``: how each system issues puts, synchronises and splits its GEMMs (``Net``).
- ``collectives``: the rule for executors that run each stage as one all-to-all call per rank.
- ``plugins``: COMET's all-gather, FAST's rounds, MoonEP's weight pulls.
- ``planning``: deterministic planning-cost models.
- ``run``: a registry row, batch by batch (``Config``, ``run_system``).
"""

from zepp.sim.engine import SimulationError, TaskGraph, Timeline, simulate
from zepp.sim.run import Config, Shared, SystemResult, run_system

__all__ = ["SimulationError", "TaskGraph", "Timeline", "simulate", "Config", "Shared", "SystemResult", "run_system"]
