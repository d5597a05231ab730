"""Shared by every routing: the default relaxation, the batch check, the routing record, grouping and hashing of entries.

A router takes a checked batch ``topk_ids [R, T, k]`` int32 (``-1``: a missing entry), the
``Placement``, the relaxation ``C`` and the vacate rounds, and returns a ``Routing``. All of it is
integer numpy over entries, so every rank computes the same routing bit for bit.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.types import Placement, Routing


def default_relaxation(nodes: int) -> float:
    """Zepp's relaxation ``C`` when none is given: 0.25, and 0.5 from 16 nodes on (PAPER.md 1)."""
    return 0.5 if nodes >= 16 else 0.25


def check_batch(topk_ids: np.ndarray, placement: Placement) -> np.ndarray:
    """Check a batch ``[R, T, k]`` against a placement; return it as int32."""
    arr = np.asarray(topk_ids)
    if arr.ndim != 3:
        raise ZeppInputError(f"batch topk_ids must be [ranks, tokens, k], got shape {arr.shape}")
    if arr.shape[0] != placement.ranks:
        raise ZeppInputError(f"batch has {arr.shape[0]} ranks but the placement has {placement.ranks}")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < -1 or arr.max() >= placement.num_experts):
        bad = np.argwhere((arr < -1) | (arr >= placement.num_experts))[0]
        raise ZeppInputError(
            f"batch entry (rank {bad[0]}, token {bad[1]}, choice {bad[2]}) has expert id "
            f"{arr[tuple(bad)]}, outside [0, {placement.num_experts}) (-1 marks a missing entry); check --experts"
        )
    return arr.astype(np.int32, copy=False)


def slot_routing(topk_ids: np.ndarray, slot: np.ndarray, placement: Placement,
                 relaxation: float | None = None) -> Routing:
    """The ``Routing`` of ``slot [R, T, k]`` (any value where an entry is missing: it becomes ``-1``).
    ``relaxation``: the C whose replica-load bounds the routing promises (``validate`` checks them)."""
    slot = np.array(np.broadcast_to(slot, topk_ids.shape), np.int32)
    missing = topk_ids < 0
    if missing.any():  # (a where() over every entry costs more than this check when none is missing)
        slot[missing] = -1
    return Routing(topk_ids, slot, placement, relaxation=relaxation)


def position_in_group(key: np.ndarray, num_keys: int) -> np.ndarray:
    """For each element, how many earlier elements (in array order) share its key. ``[n]``.

    ``key`` holds group ids in ``[0, num_keys)``. For up to 2**16 groups the elements are ranked
    in blocks of ``_BLOCK``, each by a stable radix sort that stays in cache (a few times faster
    than one sort of them all), the counts of earlier blocks added; so this is linear in ``n``."""
    key = np.asarray(key)
    n = key.shape[0]
    small = num_keys <= 1 << 16
    step = _BLOCK if small else max(n, 1)
    pos = np.empty(n, dtype=np.int64)
    seen = np.zeros(num_keys, np.int64)  # elements of each group in earlier blocks
    for b0 in range(0, n, step):
        block = key[b0:b0 + step]
        order = np.argsort(block.astype(np.uint16) if small else block, kind="stable")
        counts = np.bincount(block, minlength=num_keys)
        pos[b0:b0 + step][order] = np.arange(block.size) + np.repeat(seen - (np.cumsum(counts) - counts), counts)
        seen += counts
    return pos


_BLOCK = 1 << 14


HASH_MUL, HASH_ADD, HASH_MOD = 1103515245, 12345, 1 << 31


def entry_hash(index: np.ndarray) -> np.ndarray:
    """A fixed integer hash of entry indices (``[n]`` int64 -> ``[n]`` int64 in ``[0, 2**31)``):
    two rounds of a linear congruential step with a xor-shift, all products below 2**62, so a
    torch or numpy port gives the same values on any device."""
    x = np.asarray(index, np.int64) % HASH_MOD
    for _ in range(2):
        x = (x * HASH_MUL + HASH_ADD) % HASH_MOD
        x ^= x >> 16
    return x
