"""SGLang's expert-distribution dumps, one layer at a time: the token ids of a ``per_token``
dump and the load histogram of a ``stat`` dump.

SGLang's recorder (``--expert-distribution-recorder-mode``) saves a ``torch.save`` dict:
``per_token`` mode holds ``topk_ids_of_layer [layers, T, k]`` (at the top level or in each of
a list of ``records``, rows SGLang padded with ``-1`` included) and, since SGLang 0.4.x,
``last_physical_to_logical_map [layers, P]``: the ids are *physical* and mapped to logical
ones through it. ``stat`` mode holds ``logical_count [steps, layers, E]``. Every layer of
such dumps at once (and the ``per_pass`` mode) is read by :mod:`zepp.interop.sglang`.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import describe_keys, input_file, read_json
from zepp.traces.formats.arrays import int_array, npz_load, pick_layer, torch_load, whole_counts

__all__ = ["sglang_topk", "read_load_histogram"]


def sglang_topk(obj, source: str, layer: int | None) -> np.ndarray:
    """``[T, k]`` int64 logical ids of one layer from an SGLang per-token dump (dict, list of
    records, or tensor); rows SGLang padded with ``-1`` are dropped; physical ids are mapped
    through the dump's ``last_physical_to_logical_map`` when it has one."""
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(r, dict) for r in obj):
        obj = {"records": list(obj)}
    p2l = None
    if isinstance(obj, dict) and "last_physical_to_logical_map" in obj:
        p2l = int_array(obj["last_physical_to_logical_map"], f"{source}: last_physical_to_logical_map",
                        "physical_to_logical_map entries")
    ids = _drop_padding(_layer_ids(_topk_parts(obj, source), source, layer), source)
    if p2l is not None and ids.size:
        m = p2l if p2l.ndim == 1 else pick_layer(p2l, layer, source, "last_physical_to_logical_map")
        if ids.max() >= m.shape[0]:
            raise ZeppInputError(f"{source}: physical id {int(ids.max())} but last_physical_to_logical_map has "
                                 f"{m.shape[0]} physical experts")
        ids = m[ids]
    return ids


def _topk_parts(obj, source: str) -> list:
    """The ``topk_ids_of_layer`` arrays of a dump, in record order."""
    if isinstance(obj, dict) and "topk_ids_of_layer" in obj:
        return [obj["topk_ids_of_layer"]]
    if isinstance(obj, dict) and isinstance(obj.get("records"), (list, tuple)):
        parts = [r["topk_ids_of_layer"] for r in obj["records"] if isinstance(r, dict) and "topk_ids_of_layer" in r]
        if not parts:
            raise ZeppInputError(
                f"{source}: its records hold no 'topk_ids_of_layer'; record the dump in SGLang's per_token mode")
        return parts
    if hasattr(obj, "shape"):
        return [obj]
    raise ZeppInputError(
        f"{source}: no 'topk_ids_of_layer' found (got {describe_keys(obj)}); expected an SGLang per_token "
        f"expert-distribution dump, or a tensor [layers, T, k]")


def _layer_ids(parts: list, source: str, layer: int | None) -> np.ndarray:
    """``[T, k]`` int64: layer ``layer`` of every part ``[layers, t, k]`` (or ``[t, k]``), concatenated."""
    out = []
    for i, part in enumerate(parts):
        a = int_array(part, f"{source}: topk_ids_of_layer" + (f" (record {i})" if len(parts) > 1 else ""),
                      lo=-1)
        if a.ndim == 3:
            a = pick_layer(a, layer, source, "topk_ids_of_layer")
        if a.ndim != 2:
            raise ZeppInputError(f"{source}: topk_ids_of_layer must be [layers, T, k], got shape {a.shape}")
        out.append(a)
    ks = {a.shape[1] for a in out}
    if len(ks) > 1:
        raise ZeppInputError(f"{source}: records disagree on k ({sorted(ks)}); every record must have the same top-k")
    return np.concatenate(out, axis=0)


def _drop_padding(ids: np.ndarray, source: str) -> np.ndarray:
    """``ids [T, k]`` without the rows SGLang padded with ``-1`` (a row partly padded is refused)."""
    if not ids.size:
        return ids
    pad = ids < 0
    whole = pad.all(axis=1)
    part = pad.any(axis=1) & ~whole
    if part.any():
        r = int(np.flatnonzero(part)[0])
        raise ZeppInputError(f"{source}: row {r} is partly padded with -1 ({ids[r].tolist()}); only whole rows "
                             f"may be padding")
    return ids[~whole]


def read_load_histogram(path, layer: int | None = None) -> np.ndarray:
    """Per-expert load ``[E]`` int64 from an SGLang ``logical_count`` dump.

    ``logical_count`` is ``[steps, layers, E]`` (summed over steps), ``[layers, E]`` or ``[E]``;
    ``layer`` picks the layer (default the first). Accepts ``.pt``/``.pth`` (``torch.save`` dict
    or tensor), ``.json`` (``{"logical_count": ...}`` or a bare nested list) and ``.npz``
    (``logical_count`` or the only array). Counts must be whole non-negative numbers.
    """
    p = input_file(path, "load-histogram file", ".pt, .json or .npz")
    source = str(p)
    obj = _histogram_object(p, source)
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            raise ZeppInputError(f"{source}: no 'logical_count' key (keys: {describe_keys(obj)}); expected an SGLang "
                                 f"expert-distribution dump recorded in stat mode")
        obj = obj["logical_count"]
    arr = whole_counts(obj, f"{source}: logical_count", "loads")
    if arr.ndim == 3:
        arr = arr.sum(axis=0)
    if arr.ndim == 2:
        arr = pick_layer(arr, layer, source, "logical_count")
    if arr.ndim != 1 or arr.size == 0:
        raise ZeppInputError(f"{source}: logical_count must be [steps, layers, E], [layers, E] or [E]")
    return arr


def _histogram_object(p, source: str):
    """The object a load-histogram file holds (a dict, an array or a nested list), by suffix."""
    suffix = p.suffix.lower()
    if suffix in (".pt", ".pth"):
        return torch_load(p)
    if suffix == ".json":
        return read_json(p, "load-histogram file", ".pt, .json or .npz")
    if suffix == ".npz":
        arrays = npz_load(p)
        if "logical_count" in arrays:
            return arrays["logical_count"]
        if len(arrays) == 1:
            return next(iter(arrays.values()))
        raise ZeppInputError(f"{source}: no array named 'logical_count' among {list(arrays)}")
    raise ZeppInputError(f"{source}: unknown load-histogram format {suffix!r}; use .pt, .json or .npz")
