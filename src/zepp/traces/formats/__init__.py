"""Trace file formats: readers of one layer's expert choices and of load histograms.

A trace is ``topk_ids [N, k]`` (:class:`zepp.traces.trace.Trace`).

- :mod:`~zepp.traces.formats.trace_files`: :func:`read_trace`, the reader of each suffix
  (``.txt``, ``.npz``, ``.pt``) in one table;
- :mod:`~zepp.traces.formats.text`: the text format of ``../shared/traces`` (one token per
  line, ``k`` ids), streamed;
- :mod:`~zepp.traces.formats.sglang_dumps`: SGLang's expert-distribution dumps, one layer
  (``per_token`` ids, ``stat`` load histograms: :func:`read_load_histogram`);
- :mod:`~zepp.traces.formats.folders`: recorded trace folders ``<dir>/<model>/{pool,eval}.txt``;
- :mod:`~zepp.traces.formats.arrays`: the strict conversion every array passes.

Multi-layer engine histories (SGLang, TensorRT-LLM, vLLM, zepp's recorder) are read by
:func:`zepp.interop.history.read_history`. Every problem is one
:class:`~zepp.errors.ZeppInputError` naming the file, row and field, raised before any
planning starts; no value is ever silently changed.
"""

from zepp.traces.formats.folders import load_model_traces
from zepp.traces.formats.sglang_dumps import read_load_histogram, sglang_topk
from zepp.traces.formats.trace_files import read_trace

__all__ = ["read_trace", "read_load_histogram", "sglang_topk", "load_model_traces"]
