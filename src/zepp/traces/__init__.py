"""Traces: the routing decisions a planner is fed, and where they come from.

- ``trace``: the ``Trace`` object (top-k ids per token, optional gate weights) and its checks;
- ``formats``: one layer's trace files (plain text, ``.npz``, ``.pt``, SGLang dumps);
- ``sampling``: batches sampled from a window, per-rank and per-node demand, recorded trace folders;
- ``synthetic``: built-in synthetic traces for every preset, fitted to the recorded ones.
"""

from zepp.traces.formats import read_load_histogram, read_trace
from zepp.traces.sampling import load_model_traces, node_demand, rank_demand, sample_batches
from zepp.traces.trace import Trace

__all__ = ["Trace", "read_trace", "read_load_histogram", "sample_batches", "node_demand", "rank_demand",
           "load_model_traces"]
