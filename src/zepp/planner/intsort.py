"""Fast stable sorting of integer keys (what the simulator's graph builder and the planner sort).

``numpy.argsort(kind="stable")`` on int64 keys runs a merge sort, about 9x slower than numpy's
vectorised ``sort`` of plain int64 values on the same keys. A stable order is unique (ties in
index order), so it can be read off a plain sort of ``key * 2**b + index``: the packed values are
distinct, their sorted order is ``(key, index)`` order, and the low ``b`` bits give the
permutation. ``stable_argsort`` does that where the packed values fit in an int64 and falls back
to numpy's stable argsort elsewhere; both give the same permutation, element for element.
"""

from __future__ import annotations

import numpy as np


def _packable(key: np.ndarray) -> int | None:
    """Bits for the index when ``key`` packs (non-negative integers, ``key * 2**b`` fits), else None."""
    if key.dtype.kind not in "iub" or key.size < 2:
        return None
    b = int(key.size - 1).bit_length()
    if int(key.min()) < 0 or int(key.max()) >= 1 << (62 - b):
        return None
    return b


def stable_argsort(key) -> np.ndarray:
    """``numpy.argsort(key, kind="stable")`` of a 1-D integer array (the same permutation)."""
    key = np.asarray(key)
    b = _packable(key)
    if b is None:
        return np.argsort(key, kind="stable")
    v = (key.astype(np.int64) << b) | np.arange(key.size, dtype=np.int64)
    v.sort()
    return v & ((1 << b) - 1)


def sorted_with_order(key) -> tuple[np.ndarray, np.ndarray]:
    """``(key[order], order)`` with ``order = stable_argsort(key)`` (keys as int64)."""
    key = np.asarray(key)
    b = _packable(key)
    if b is None:
        order = np.argsort(key, kind="stable")
        return key[order].astype(np.int64, copy=False), order
    v = (key.astype(np.int64) << b) | np.arange(key.size, dtype=np.int64)
    v.sort()
    return v >> b, v & ((1 << b) - 1)


def sorted_unique(a) -> np.ndarray:
    """``numpy.unique`` of a 1-D integer array (its distinct values, ascending), by one plain sort."""
    a = np.sort(np.asarray(a).ravel())
    if a.size < 2:
        return a
    keep = np.empty(a.size, bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]
