"""Traces: the routing decisions a planner is fed, and where they come from.

- ``trace``: the ``Trace`` object (top-k ids per token, optional gate weights) and the checks
  every reader applies;
- ``formats``: one layer's trace files (plain text, ``.npz``, SGLang dumps), load histograms,
  recorded trace folders;
- ``sampling``: batches sampled from a window, per-rank and per-node demand;
- ``layer_history``: every MoE layer's history (tokens or load histograms) as placement input;
- ``synthetic``: built-in synthetic traces for every preset, fitted to the recorded ones
  (``synthetic_fit``: the fit, for ``benchmarks/fit/fit_synth.py``); ``trace_stats``: the
  statistics a trace is judged on (skew, distinct nodes, merge savings, drift, pair concentration);
- ``topics``: prompts grouped into topics by expert usage (recorded and synthetic);
- ``schedules``: demand schedules (``SCHEDULES``): a run's history and batches drifting between topics.

Code outside the package imports these names from ``zepp.traces``.
"""

from zepp.traces.formats import load_model_traces, read_load_histogram, read_trace
from zepp.traces.layer_history import LayerHistory, history_from_traces
from zepp.traces.sampling import node_demand, rank_demand, sample_batches
from zepp.traces.schedules import DEFAULT_SCHEDULE, SCHEDULES, DriftWorkload, drift_workload
from zepp.traces.topics import Topics, model_topics
from zepp.traces.trace import Trace

__all__ = ["Trace", "read_trace", "read_load_histogram", "sample_batches", "node_demand", "rank_demand",
           "load_model_traces", "LayerHistory", "history_from_traces", "SCHEDULES", "DEFAULT_SCHEDULE", "DriftWorkload",
           "drift_workload", "Topics", "model_topics"]
