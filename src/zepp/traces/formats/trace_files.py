"""One layer's trace from a file: :func:`read_trace`, the reader of each suffix in one table.

- ``.txt`` (and no suffix, ``.trace``): the text format (:mod:`zepp.traces.formats.text`);
- ``.npz``: array ``topk_ids [N, k]`` (or ``[layers, N, k]``, or the file's only array),
  optional ``topk_weights [N, k]``;
- ``.pt`` / ``.pth``: an SGLang per-token dump (:mod:`zepp.traces.formats.sglang_dumps`).
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import input_file
from zepp.traces.formats.arrays import check_ids, int_array, npz_load, pick_layer, torch_load, weights_array
from zepp.traces.formats.sglang_dumps import sglang_topk
from zepp.traces.formats.text import read_text_ids
from zepp.traces.trace import Trace

__all__ = ["read_trace", "TEXT_SUFFIXES"]

TEXT_SUFFIXES = (".txt", ".trace", "")


def _count_arg(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value < 2**31:
        raise ZeppInputError(f"{name} must be a positive integer below 2**31, got {value!r}")
    return int(value)


def _npz_ids(p, source: str, layer: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(ids [N, k] int64, weights [N, k] float32 or None)`` of an ``.npz`` trace."""
    arrays = npz_load(p)
    names = list(arrays)
    if "topk_ids" in names:
        raw = arrays["topk_ids"]
    elif len(names) == 1:
        raw = arrays[names[0]]
    else:
        raise ZeppInputError(f"{source}: no array named 'topk_ids' among {names}; save the trace as topk_ids=[N, k]")
    ids = int_array(raw, f"{source}: topk_ids")
    if ids.ndim == 3:
        ids = pick_layer(ids, layer, source, "topk_ids")
    if ids.ndim != 2:
        raise ZeppInputError(f"{source}: topk_ids must be [tokens, k], got shape {ids.shape}")
    weights = None
    if "topk_weights" in names:
        w = arrays["topk_weights"]
        if w.ndim == 3:
            w = pick_layer(w, layer, source, "topk_weights")
        weights = weights_array(w, source, ids.shape)
    return ids, weights


def _pt_ids(p, source: str, layer: int | None) -> tuple[np.ndarray, None]:
    """``(ids [N, k] int64, None)`` of an SGLang per-token dump."""
    return sglang_topk(torch_load(p), source, layer), None


ARRAY_READERS = {".npz": _npz_ids, ".pt": _pt_ids, ".pth": _pt_ids}


def read_trace(path, num_experts: int | None = None, top_k: int | None = None, layer: int | None = None,
               allow_duplicates: bool = False, max_bytes: int | None = None) -> Trace:
    """Read a trace file (``.txt``, ``.npz``, ``.pt``/``.pth``) into a :class:`~zepp.traces.trace.Trace`.

    ``num_experts``: the model's expert count; ids must lie in ``[0, num_experts)``. When
    ``None`` it is inferred as ``max id + 1`` (ids of 65536 or more are then refused: pass it
    whenever the model is known). ``top_k``: the model's top-k; rows of another width are an
    error. ``layer``: the layer of a multi-layer file (default the first).
    ``allow_duplicates``: accept one id twice in a token's top-k (synthetic data only).
    ``max_bytes``: refuse text files whose reading needs more memory (default: what is free).
    """
    num_experts = _count_arg(num_experts, "num_experts")
    top_k = _count_arg(top_k, "top_k")
    p = input_file(path)
    source = str(p)
    suffix = p.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        ids, e = read_text_ids(p, top_k, num_experts, allow_duplicates, max_bytes)
        return Trace(ids, e, source)
    if suffix not in ARRAY_READERS:
        raise ZeppInputError(f"{source}: unknown trace format {suffix!r}; use .txt, .npz or .pt (SGLang dump)")
    ids, weights = ARRAY_READERS[suffix](p, source, layer)
    e = check_ids(ids, num_experts, top_k, source, "row (0-based)", allow_duplicates)
    return Trace(ids.astype(np.int32), e, source, weights)
