"""Formats of serving engines: placements they load, written and read back.

- :mod:`zepp.interop.layers`: every layer's placement with redundancy counted in total
  (``EnginePlacement``, ``plan_layers``);
- :mod:`zepp.interop.sglang`: ``--init-expert-location`` (``physical_to_logical_map``);
- :mod:`zepp.interop.trtllm`: the wide-EP load-balancer YAML;
- :mod:`zepp.interop.vllm`: the three EPLB maps (``.pt``) and the vLLM-Ascend JSON;
- :mod:`zepp.interop.zepp_format`: zepp's own JSON.

What engines *record* is read by :func:`zepp.interop.history.read_history`.
"""

from __future__ import annotations

import importlib

from zepp.errors import ZeppInputError

FORMATS = {"sglang": "zepp.interop.sglang", "trtllm": "zepp.interop.trtllm", "vllm": "zepp.interop.vllm",
           "zepp": "zepp.interop.zepp_format"}
SUFFIXES = {"sglang": (".json", ".pt"), "trtllm": (".yaml", ".yml"), "vllm": (".pt", ".json"), "zepp": (".json",)}

__all__ = ["FORMATS", "SUFFIXES", "write_placement", "read_placement_file"]


def _module(fmt: str):
    if fmt not in FORMATS:
        raise ZeppInputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return importlib.import_module(FORMATS[fmt])


def check_suffix(fmt: str, path) -> None:
    from pathlib import Path

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
