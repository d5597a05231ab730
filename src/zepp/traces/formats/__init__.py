"""Trace file formats: readers of one layer's expert choices and of load histograms.

A trace is ``topk_ids [N, k]`` (:class:`zepp.traces.sampling.Trace`). :func:`read_trace` reads

- ``.txt`` (and no suffix, ``.trace``): one token per line, ``k`` whitespace-separated ids
  (the format of ``../shared/traces``), streamed (:mod:`zepp.traces.formats.text`);
- ``.npz``: array ``topk_ids [N, k]`` (or ``[layers, N, k]``, or the file's only array),
  optional ``topk_weights [N, k]``;
- ``.pt`` / ``.pth``: SGLang expert-distribution dumps holding ``topk_ids_of_layer
  [layers, T, k]`` (per_token recorder mode), at the top level or in each of a list of
  ``records`` (concatenated in order); ``layer=`` picks the layer. Ids there are *physical*:
  when the dump carries ``last_physical_to_logical_map`` they are mapped to logical ids.

:func:`read_load_histogram` reads one layer of an SGLang ``logical_count`` dump. Multi-layer
engine histories (SGLang, TensorRT-LLM, vLLM, zepp's recorder) are read by
:func:`zepp.interop.history.read_history`.

Every problem is one :class:`~zepp.errors.ZeppInputError` naming the file, row and field,
raised before any planning starts; no value is ever silently changed
(:mod:`zepp.traces.formats.arrays`).
"""

from __future__ import annotations

import json

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.formats.arrays import check_ids, int_array, npz_load, to_numpy, torch_load, weights_array
from zepp.traces.formats.files import describe_keys, input_file, read_bytes
from zepp.traces.formats.text import read_text_ids

__all__ = ["read_trace", "read_load_histogram", "sglang_topk"]


def _check_count_arg(num_experts, name: str = "num_experts") -> int | None:
    if num_experts is None:
        return None
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) or not 1 <= num_experts < 2**31:
        raise ZeppInputError(f"{name} must be a positive integer below 2**31, got {num_experts!r}")
    return int(num_experts)


def _pick_layer(arr: np.ndarray, layer: int | None, source: str, what: str) -> np.ndarray:
    layers = arr.shape[0]
    li = 0 if layer is None else layer
    if not -layers <= li < layers:
        raise ZeppInputError(f"{source}: {what} has {layers} layers; layer={layer} is out of range [0, {layers})")
    return arr[li]


def sglang_topk(obj, source: str, layer: int | None) -> np.ndarray:
    """``[T, k]`` int64 logical ids of one layer from an SGLang per-token dump (dict, list of
    records, or tensor); rows SGLang padded with ``-1`` are dropped; physical ids are mapped
    through the dump's ``last_physical_to_logical_map`` when it has one."""
    p2l = None
    if isinstance(obj, dict) and "last_physical_to_logical_map" in obj:
        p2l = int_array(obj["last_physical_to_logical_map"], f"{source}: last_physical_to_logical_map",
                        "physical_to_logical_map entries")
    if isinstance(obj, dict) and "topk_ids_of_layer" in obj:
        parts = [obj["topk_ids_of_layer"]]
    elif isinstance(obj, dict) and isinstance(obj.get("records"), (list, tuple)):
        parts = [r["topk_ids_of_layer"] for r in obj["records"] if isinstance(r, dict) and "topk_ids_of_layer" in r]
        if not parts:
            raise ZeppInputError(
                f"{source}: its records hold no 'topk_ids_of_layer'; record the dump in SGLang's per_token mode")
    elif isinstance(obj, (list, tuple)) and obj and all(isinstance(r, dict) for r in obj):
        return sglang_topk({"records": list(obj)}, source, layer)
    elif hasattr(obj, "shape"):
        parts = [obj]
    else:
        raise ZeppInputError(
            f"{source}: no 'topk_ids_of_layer' found (got {describe_keys(obj)}); expected an SGLang per_token "
            f"expert-distribution dump, or a tensor [layers, T, k]")
    out = []
    for i, part in enumerate(parts):
        a = int_array(part, f"{source}: topk_ids_of_layer" + (f" (record {i})" if len(parts) > 1 else ""),
                      lo=-1)
        if a.ndim == 3:
            a = _pick_layer(a, layer, source, "topk_ids_of_layer")
        if a.ndim != 2:
            raise ZeppInputError(f"{source}: topk_ids_of_layer must be [layers, T, k], got shape {a.shape}")
        out.append(a)
    ks = {a.shape[1] for a in out}
    if len(ks) > 1:
        raise ZeppInputError(f"{source}: records disagree on k ({sorted(ks)}); every record must have the same top-k")
    ids = np.concatenate(out, axis=0)
    if ids.size:
        pad = ids < 0
        whole = pad.all(axis=1)
        part = pad.any(axis=1) & ~whole
        if part.any():
            r = int(np.flatnonzero(part)[0])
            raise ZeppInputError(f"{source}: row {r} is partly padded with -1 ({ids[r].tolist()}); only whole rows "
                                 f"may be padding")
        ids = ids[~whole]
    if p2l is not None and ids.size:
        m = p2l if p2l.ndim == 1 else _pick_layer(p2l, layer, source, "last_physical_to_logical_map")
        if ids.max() >= m.shape[0]:
            raise ZeppInputError(f"{source}: physical id {int(ids.max())} but last_physical_to_logical_map has "
                                 f"{m.shape[0]} physical experts")
        ids = m[ids]
    return ids


def read_trace(path, num_experts: int | None = None, top_k: int | None = None, layer: int | None = None,
               allow_duplicates: bool = False, max_bytes: int | None = None):
    """Read a trace file (``.txt``, ``.npz``, ``.pt``/``.pth``) into a :class:`~zepp.traces.sampling.Trace`.

    ``num_experts``: the model's expert count; ids must lie in ``[0, num_experts)``. When
    ``None`` it is inferred as ``max id + 1`` (ids of 65536 or more are then refused: pass it
    whenever the model is known). ``top_k``: the model's top-k; rows of another width are an
    error. ``layer``: the layer of a multi-layer file (default the first).
    ``allow_duplicates``: accept one id twice in a token's top-k (synthetic data only).
    ``max_bytes``: refuse text files whose reading needs more memory (default: what is free).
    """
    from zepp.traces.trace import Trace

    num_experts = _check_count_arg(num_experts)
    top_k = _check_count_arg(top_k, "top_k")
    p = input_file(path)
    source = str(p)
    suffix = p.suffix.lower()
    if suffix in (".txt", ".trace", ""):
        ids, e = read_text_ids(p, top_k, num_experts, allow_duplicates, max_bytes)
        return Trace(ids, e, source)
    weights = None
    if suffix == ".npz":
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
            ids = _pick_layer(ids, layer, source, "topk_ids")
        if ids.ndim != 2:
            raise ZeppInputError(f"{source}: topk_ids must be [tokens, k], got shape {ids.shape}")
        if "topk_weights" in names:
            w = arrays["topk_weights"]
            if w.ndim == 3:
                w = _pick_layer(w, layer, source, "topk_weights")
            weights = weights_array(w, source, ids.shape)
    elif suffix in (".pt", ".pth"):
        ids = sglang_topk(torch_load(p), source, layer)
    else:
        raise ZeppInputError(f"{source}: unknown trace format {suffix!r}; use .txt, .npz or .pt (SGLang dump)")
    e = check_ids(ids, num_experts, top_k, source, "row (0-based)", allow_duplicates)
    return Trace(ids.astype(np.int32), e, source, weights)


def read_load_histogram(path, layer: int | None = None) -> np.ndarray:
    """Per-expert load ``[E]`` int64 from an SGLang ``logical_count`` dump.

    ``logical_count`` is ``[steps, layers, E]`` (summed over steps), ``[layers, E]`` or ``[E]``;
    ``layer`` picks the layer (default the first). Accepts ``.pt``/``.pth`` (``torch.save`` dict
    or tensor), ``.json`` (``{"logical_count": ...}`` or a bare nested list) and ``.npz``
    (``logical_count`` or the only array). Counts must be whole non-negative numbers.
    """
    p = input_file(path, "load-histogram file", ".pt, .json or .npz")
    source = str(p)
    suffix = p.suffix.lower()
    if suffix in (".pt", ".pth"):
        obj = torch_load(p)
    elif suffix == ".json":
        try:
            obj = json.loads(read_bytes(p))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ZeppInputError(f"{source}: not valid JSON ({exc})") from None
    elif suffix == ".npz":
        arrays = npz_load(p)
        if "logical_count" in arrays:
            obj = arrays["logical_count"]
        elif len(arrays) == 1:
            obj = next(iter(arrays.values()))
        else:
            raise ZeppInputError(f"{source}: no array named 'logical_count' among {list(arrays)}")
    else:
        raise ZeppInputError(f"{source}: unknown load-histogram format {suffix!r}; use .pt, .json or .npz")
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            raise ZeppInputError(f"{source}: no 'logical_count' key (keys: {describe_keys(obj)}); expected an SGLang "
                                 f"expert-distribution dump recorded in stat mode")
        obj = obj["logical_count"]
    a = to_numpy(obj, f"{source}: logical_count")
    if a.dtype.kind == "f" and a.size and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
        a = a.astype(np.int64)  # whole counts stored as floats (JSON numbers, float tensors) are exact
    arr = int_array(a, f"{source}: logical_count", "loads", lo=0, hi=2**62)
    if arr.ndim == 3:
        arr = arr.sum(axis=0)
    if arr.ndim == 2:
        arr = _pick_layer(arr, layer, source, "logical_count")
    if arr.ndim != 1 or arr.size == 0:
        raise ZeppInputError(f"{source}: logical_count must be [steps, layers, E], [layers, E] or [E]")
    return arr
