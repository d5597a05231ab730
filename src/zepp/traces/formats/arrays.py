"""Strict conversion of arrays read from ``.npz`` / ``.pt`` / ``.json`` / ``.safetensors`` files.

Every value that would be changed by a cast is refused with the file, the field and the first
offending row: float ids (``1.5`` is never truncated to ``1``; ``3.0`` is refused too, ids are
integers), bool and complex ids, strings and objects, ids beyond the int32 range (checked in the
array's own dtype, so ``2**32`` never wraps to ``0``), NaN or infinite gate weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import describe_keys, read_npz, read_torch
from zepp.traces.trace import MAX_INFERRED_EXPERTS, check_id_range, check_no_repeats, check_weights

__all__ = ["to_numpy", "int_array", "weights_array", "torch_load", "npz_load", "check_ids", "pick_layer",
           "whole_counts"]

_INT32_MAX = (1 << 31) - 1


def torch_load(p: Path):
    """``torch.load`` (weights only, CPU, ``zepp.files`` limits) with every failure as one clear line."""
    return read_torch(p)


def npz_load(p: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` archive (``zepp.files.read_npz``: no pickles, headers checked first)."""
    return read_npz(p)


def to_numpy(x, where: str) -> np.ndarray:
    """A numpy array from a tensor, array or nested list; anything else is one clear error."""
    if hasattr(x, "detach"):
        try:
            x = x.detach().cpu()
            if str(x.dtype) == "torch.bfloat16":
                x = x.float()
            x = x.numpy()
        except Exception as exc:
            raise ZeppInputError(f"{where}: cannot convert the tensor ({type(exc).__name__})") from None
    if isinstance(x, dict):
        raise ZeppInputError(f"{where}: expected an array, got a dict with keys {describe_keys(x)}")
    try:
        a = np.asarray(x)
    except Exception:
        raise ZeppInputError(f"{where}: cannot be read as an array (ragged or mixed lists?)") from None
    if a.dtype == object:
        raise ZeppInputError(f"{where}: holds Python objects or ragged lists, not a numeric array")
    return a


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def int_array(x, where: str, what: str = "expert ids", lo: int = 0, hi: int | None = None) -> np.ndarray:
    """``x`` as int64 after the strict checks; values must lie in ``[lo, hi)`` (``hi`` default
    the int32 range). Messages give the index of the first bad value."""
    a = to_numpy(x, where)
    kind = a.dtype.kind
    if kind == "b":
        raise ZeppInputError(f"{where}: {what} are booleans (dtype bool); save integer ids")
    if kind == "c":
        raise ZeppInputError(f"{where}: {what} are complex numbers (dtype {a.dtype}); save integer ids")
    if kind in "USV":
        raise ZeppInputError(f"{where}: {what} are strings or raw bytes (dtype {a.dtype}); save integer ids")
    if kind == "f":
        if a.size:
            nonint = ~np.isfinite(a) | (a != np.round(a))
            if nonint.any():
                idx = _first(nonint)
                raise ZeppInputError(
                    f"{where}: {what} must be integers, found {a[idx].item()!r} at index {list(idx)} (dtype "
                    f"{a.dtype}); refused rather than truncated: save them as an integer array")
        raise ZeppInputError(
            f"{where}: {what} are stored as floating point (dtype {a.dtype}); refused rather than converted: "
            f"save them as an integer array")
    if kind not in "iu":
        raise ZeppInputError(f"{where}: {what} must be integers, got dtype {a.dtype}")
    top = _INT32_MAX + 1 if hi is None else hi
    if a.size:
        # compare in the array's own dtype (as Python ints), so nothing wraps
        bad = (a < lo) | (a >= top)
        if bad.any():
            idx = _first(bad)
            v = int(a[idx])
            if v < lo and v < 0:
                raise ZeppInputError(f"{where}: {what}: negative value {v} at index {list(idx)}; "
                                     f"values must lie in [{lo}, {top})")
            if hi is None:
                raise ZeppInputError(f"{where}: {what}: value {v} at index {list(idx)} exceeds the int32 range; "
                                     f"check the file")
            raise ZeppInputError(f"{where}: {what}: value {v} at index {list(idx)} is out of range [{lo}, {hi}); "
                                 f"pass the model's expert count if this file has more experts")
    return a.astype(np.int64)


def whole_counts(x, where: str, what: str = "counts") -> np.ndarray:
    """Entry counts as int64, each in ``[0, 2**62)`` and all together below ``2**62``; whole numbers stored as floats (JSON
    numbers, float tensors) are exact and accepted, any fraction is refused."""
    a = to_numpy(x, where)
    if a.dtype.kind == "f" and a.size and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
        if float(np.abs(a).max()) >= 2.0**62:
            idx = _first(np.abs(a) >= 2.0**62)
            raise ZeppInputError(f"{where}: {what}: value {a[idx].item():.3g} at index {list(idx)} is beyond 2**62; "
                                 f"give the recorded counts")
        a = a.astype(np.int64)
    out = int_array(a, where, what, lo=0, hi=2**62)
    total = float(out.sum(dtype=np.float64))
    if total >= 2.0**62:  # any sum of these counts (per expert, per bin) would overflow int64
        raise ZeppInputError(f"{where}: the {what} sum to {total:.3g}, beyond 2**62 (int64 sums would overflow); "
                             f"give the recorded counts")
    return out


def weights_array(x, where: str, shape: tuple[int, ...]) -> np.ndarray:
    """Gate weights ``[N, k]`` float32: real, finite, of the ids' shape."""
    return check_weights(to_numpy(x, where), where, shape)


def pick_layer(arr: np.ndarray, layer: int | None, source: str, what: str) -> np.ndarray:
    """Row ``layer`` (default 0, negative counts from the end) of a per-layer array ``[layers, ...]``."""
    layers = arr.shape[0]
    li = 0 if layer is None else layer
    if not -layers <= li < layers:
        raise ZeppInputError(f"{source}: {what} has {layers} layers; layer={layer} is out of range [0, {layers})")
    return arr[li]


def check_ids(ids: np.ndarray, num_experts: int | None, top_k: int | None, source: str, unit: str,
              allow_duplicates: bool, row_numbers: np.ndarray | None = None) -> int:
    """Checks shared by the array readers on ``ids [N, k]`` int64; returns the expert count
    (``num_experts``, or ``max id + 1`` when not given, refused beyond ``MAX_INFERRED_EXPERTS``)."""
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ZeppInputError(f"{source}: topk_ids must be [tokens, k], got shape {ids.shape}")
    if ids.shape[0] == 0:
        raise ZeppInputError(f"{source}: the trace is empty (no token rows); give a file with one row per token")
    if top_k is not None and ids.shape[1] != top_k:
        raise ZeppInputError(f"{source}: rows have {ids.shape[1]} expert ids but the model is top-{top_k}; "
                             f"pass --topk {ids.shape[1]} or use the trace recorded for this model")

    def where(r: int) -> str:
        return f"{unit} {int(row_numbers[r]) if row_numbers is not None else r}"

    if num_experts is not None:
        check_id_range(ids, num_experts, source, where)
        e = int(num_experts)
    else:
        e = _inferred_experts(ids, source, where)
    if not allow_duplicates:
        check_no_repeats(ids, source, where)
    return e


def _inferred_experts(ids: np.ndarray, source: str, where) -> int:
    """``max id + 1`` of ``ids [N, k]``: no negative id, no absurd count."""
    if ids.min() < 0:
        r, c = np.argwhere(ids < 0)[0]
        raise ZeppInputError(f"{source}: {where(r)}: negative expert id {int(ids[r, c])} (position {c + 1})")
    top = int(ids.max())
    if top >= MAX_INFERRED_EXPERTS:
        r, c = np.argwhere(ids == top)[0]
        raise ZeppInputError(f"{source}: {where(r)}: expert id {top} would mean {top + 1} experts; pass the "
                             f"model's expert count (num_experts / --model) or check the file")
    return top + 1
