"""Serving engines' files: the placements they load, written and read back, and what they record.

One module per engine, each holding what the engine loads (``write_engine``, ``read_engine``,
``check_file_object``, ``load_hint``) and what it records (its history reader):

- :mod:`zepp.interop.sglang`: ``--init-expert-location`` (``physical_to_logical_map``); the
  expert distribution recorder's dumps;
- :mod:`zepp.interop.vllm`: the three EPLB maps (``.pt``) and the vLLM-Ascend JSON; the EPLB load window;
- :mod:`zepp.interop.trtllm`: the wide-EP load-balancer YAML; the expert statistics;
- :mod:`zepp.interop.zepp_format`: zepp's own JSON; zepp's recorder folder and text traces.

Shared: :mod:`zepp.interop.common` (rules every map obeys, file reading and writing),
:mod:`zepp.interop.base_history` (what every history reader shares),
:mod:`zepp.interop.layers` (every layer's placement, ``EnginePlacement``, ``plan_layers``),
:mod:`zepp.interop.history` (:func:`~zepp.interop.history.read_history`: which reader reads a path).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from zepp.errors import ZeppInputError

# {--format: the engine's module}; the order is the one `zepp place --help` lists.
FORMATS = {"sglang": "zepp.interop.sglang", "vllm": "zepp.interop.vllm", "trtllm": "zepp.interop.trtllm",
           "zepp": "zepp.interop.zepp_format"}
SUFFIXES = {"sglang": (".json", ".pt"), "vllm": (".pt", ".json"), "trtllm": (".yaml", ".yml"), "zepp": (".json",)}

__all__ = ["FORMATS", "SUFFIXES", "write_placement", "read_placement_file", "check_suffix", "load_hint"]


def _module(fmt: str):
    if fmt not in FORMATS:
        raise ZeppInputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return importlib.import_module(FORMATS[fmt])


def check_suffix(fmt: str, path) -> None:
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES[fmt] and not (fmt in ("sglang", "vllm") and suffix == ".pth"):
        raise ZeppInputError(f"--out {path}: --format {fmt} writes {' or '.join(SUFFIXES[fmt])} files")


def write_placement(path, ep, fmt: str) -> None:
    """Write ``ep`` (an :class:`~zepp.interop.layers.EnginePlacement`) in engine format ``fmt``."""
    check_suffix(fmt, path)
    _module(fmt).write_engine(path, ep)


def read_placement_file(path, fmt: str, spec, nodes: int, gpus_per_node: int):
    """Read a placement file of format ``fmt`` back into an ``EnginePlacement``."""
    return _module(fmt).read_engine(path, spec, nodes, gpus_per_node)


def load_hint(fmt: str, out: str, ep) -> str:
    """One line: how the engine of format ``fmt`` is given the file ``out`` written from ``ep``."""
    return _module(fmt).load_hint(out, ep)
