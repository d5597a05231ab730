"""The simulated executor: the same FlowPlans as the runtime, on clusters we do not have.

- ``task_graph``: a graph of tasks and dependencies (``TaskGraph``); ``link_sharing``: the
  cluster's links, shared max-min fairly; ``engine``: the event-driven engine that runs a graph
  (``simulate``, ``Timeline``; its loop also in C, ``_engine.c``).
- ``layer``: one MoE layer's task graph from a FlowPlan (``LayerWork``, ``build_layer``), with
  ``layer_builder``'s primitives (transfers, stage order, GEMM tasks) and ``joins``' integer key
  joins.
- ``mechanics``: how each system issues puts, synchronises and splits its GEMMs (``Net``).
- ``collectives``: the rule for executors that run each stage as one all-to-all call per rank.
- ``phases``: the baselines' special phases, one module per baseline (COMET's all-gather and
  ring combine, FAST's rounds, MoonEP's weight pulls).
- ``planning_cost``: the deterministic planning-cost model of every system's planner.
- ``calibrate`` / ``measured``: the network figures (fitted, or DeepEP's published ones) and
  the paper's measured tables.
- ``run``: a registry row, batch by batch (``Config``, ``run_system``), and one FlowPlan on one
  cluster (``simulate_flowplan``).
- ``bench_table``: the benchmark table's run and JSON file (``zepp bench``, ``zepp timeline``), from
  ``bench_jobs`` (configurations), ``bench_units`` (units of work), ``bench_pool`` (worker processes) and
  ``bench_rows`` (rows, speedups, the Markdown table); ``plots``: its figures.
"""

from zepp.sim.engine import Timeline, simulate
from zepp.sim.run import Config, Shared, SystemResult, run_system, simulate_flowplan
from zepp.sim.task_graph import SimulationError, TaskGraph

__all__ = ["SimulationError", "TaskGraph", "Timeline", "simulate", "Config", "Shared", "SystemResult", "run_system",
           "simulate_flowplan"]
