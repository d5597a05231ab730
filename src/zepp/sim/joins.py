"""Joins of non-negative integer keys, and the one the layer builder asks of them.

``join_keys(left, right)`` finds every pair ``(i, j)`` with ``left[i] == right[j]``: through a
key -> index table where the keys fit one (``_join_table``; one pass where one side's keys are
distinct, as a row's arrivals at a rank nearly always are), block by block where they are wider
(``join_blocked``: both sides radix-sorted by block of ``2**bits`` keys, one reused table per
block), else by one sort of both sides (``join_sorted``). All three give the same pairs as a set.

``stage_message_pairs`` joins a phase's hops on ``(rank, owner, token)``: which message carries
on a row that an earlier-stage message delivered (``zepp.sim.layer_builder``'s stage
dependencies). ``sorted_distinct`` is ``np.unique`` through a presence table where it fits.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.intsort import sorted_with_order
from zepp.planner.types import Hops

_DENSE_BITS = 24
_DENSE_KEYS = 1 << _DENSE_BITS  # key tables up to 64 MB (int32); larger key ranges are joined block by block
_BLOCK_BITS = 22  # wider keys: blocks of 4M keys, one 16 MB table reused


def join_keys(left_key: np.ndarray, right_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs ``(i, j)`` with ``left_key[i] == right_key[j]`` (non-negative integer keys; as a
    set, in no fixed order)."""
    nl, nr = left_key.size, right_key.size
    if nl == 0 or nr == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    hi = max(int(left_key.max()), int(right_key.max())) + 1
    if min(int(left_key.min()), int(right_key.min())) < 0 or max(nl, nr) >= 2**31:
        return join_sorted(left_key, right_key)
    if hi <= _DENSE_KEYS:
        return _join_dense(left_key, right_key, hi)
    if (hi - 1) >> _BLOCK_BITS < 2**31:
        return join_blocked(left_key, right_key)
    return join_sorted(left_key, right_key)


def _join_dense(left_key: np.ndarray, right_key: np.ndarray, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``join_keys`` of keys in ``[0, hi)``, ``hi <= _DENSE_KEYS``, through a table of the smaller side."""
    if left_key.size <= right_key.size:
        return _join_table(left_key, right_key, hi)
    j, i = _join_table(right_key, left_key, hi)
    return i, j


def join_blocked(left_key: np.ndarray, right_key: np.ndarray, bits: int = _BLOCK_BITS) -> tuple[np.ndarray, np.ndarray]:
    """``join_keys`` of keys too wide for one table: both sides radix-sorted by block (``2**bits``
    consecutive keys), each block joined through one reused table. Equal keys share a block, so
    the pairs are exactly ``join_sorted``'s (as a set)."""
    mask = (1 << bits) - 1
    nb = (max(int(left_key.max()), int(right_key.max())) >> bits) + 1
    sides = []
    for key in (left_key, right_key):
        blk = np.asarray(key, np.int64) >> bits
        order = np.argsort(blk.astype(np.int16 if nb < 2**15 else np.int32), kind="stable")  # a radix sort
        bounds = np.concatenate(([0], np.cumsum(np.bincount(blk, minlength=nb))))
        sides.append((order, bounds, (np.asarray(key, np.int64)[order] & mask).astype(np.int32)))
    (lo, lb, ll), (ro, rb, rl) = sides
    tab = np.full(1 << bits, -1, np.int32)
    parts_i, parts_j = [], []
    for b in np.flatnonzero((np.diff(lb) > 0) & (np.diff(rb) > 0)).tolist():
        lk, rk = ll[lb[b]:lb[b + 1]], rl[rb[b]:rb[b + 1]]
        if lk.size <= rk.size:
            i, j = _join_table(lk, rk, tab.size, tab)
        else:
            j, i = _join_table(rk, lk, tab.size, tab)
        parts_i.append(lo[lb[b] + i])
        parts_j.append(ro[rb[b] + j])
    if not parts_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(parts_i).astype(np.int64), np.concatenate(parts_j).astype(np.int64)


def _join_table(a: np.ndarray, b: np.ndarray, hi: int, tab: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``join_keys`` through a key -> index table of ``a``: one pass where ``a``'s keys are distinct
    (nearly so in practice: each row arrives at a rank once in dispatch, leaves it once in
    combine); the few keys ``a`` holds more than once are joined by sorting. ``tab``: a table
    of at least ``hi`` entries all -1 (left so again), else one is made."""
    if tab is None:
        tab = np.full(hi, -1, np.int32)
    idx = np.arange(a.size, dtype=np.int32)
    tab[a] = idx
    lost = np.flatnonzero(tab[a] != idx)  # overwritten: their keys appear more than once in a
    hit = tab[b]
    tab[a] = -1
    if lost.size == 0:
        bj = np.flatnonzero(hit >= 0)
        return hit[bj].astype(np.int64), bj
    dup = np.zeros(hi, bool)
    dup[a[lost]] = True
    b_dup = dup[b]
    bj = np.flatnonzero((hit >= 0) & ~b_dup)
    asel, bsel = np.flatnonzero(dup[a]), np.flatnonzero(b_dup)
    i2, j2 = join_sorted(a[asel], b[bsel])
    return np.concatenate([hit[bj].astype(np.int64), asel[i2]]), np.concatenate([bj, bsel[j2]])


def join_sorted(left_key: np.ndarray, right_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``join_keys`` by one sort of both sides (left before right within a key)."""
    nl, nr = left_key.size, right_key.size
    if nl == 0 or nr == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    both = np.concatenate([np.asarray(left_key, np.int64) * 2, np.asarray(right_key, np.int64) * 2 + 1])
    sk, order = sorted_with_order(both)
    sk >>= 1
    is_r = order >= nl
    gid = np.cumsum(np.concatenate(([True], sk[1:] != sk[:-1]))) - 1
    lefts = order[~is_r]  # left indices, by key
    n_left = np.bincount(gid[~is_r], minlength=int(gid[-1]) + 1)
    first = np.cumsum(n_left) - n_left
    rpos = np.flatnonzero(is_r)
    cnt = n_left[gid[rpos]]
    total = int(cnt.sum())
    off = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return lefts[np.repeat(first[gid[rpos]], cnt) + off], np.repeat(order[rpos] - nl, cnt)


def sorted_distinct(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values of integers ``x`` (a presence table where the values are
    non-negative and fit a few times ``x.size`` bytes, else a sort)."""
    x = np.asarray(x)
    if x.size < 2:
        return np.sort(x)
    hi = int(x.max())
    if int(x.min()) >= 0 and hi < max(1 << 20, 16 * x.size):
        seen = np.zeros(hi + 1, bool)
        seen[x] = True
        return np.flatnonzero(seen).astype(x.dtype, copy=False)
    s = np.sort(x)
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.size == 0:
        return a, b
    base = int(b.max()) + 1
    u = sorted_distinct(a.astype(np.int64) * base + b)
    return u // base, u % base


def stage_message_pairs(h: Hops, hop_msg: np.ndarray, R: int, T: int, join=join_keys) -> tuple[np.ndarray, np.ndarray]:
    """The message pairs ``(a, b)`` (sorted, distinct) where message ``b`` carries on a row that
    an earlier-stage message ``a`` delivered to ``b``'s source: hops ``[M]`` of one phase,
    ``hop_msg [M]`` each hop's message. ``join``: the key join (``join_keys``; tests pass others)."""
    later = np.flatnonzero(h.stage > 0)
    if later.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    early = np.flatnonzero(h.stage < h.stage.max())  # only these can feed a later stage
    key_in = (h.dst[early].astype(np.int64) * R + h.owner[early]) * T + h.token[early]
    key_out = (h.src[later].astype(np.int64) * R + h.owner[later]) * T + h.token[later]
    i, j = join(key_in, key_out)
    i, j = early[i], later[j]
    ok = h.stage[i] < h.stage[j]
    return _unique_pairs(hop_msg[i[ok]], hop_msg[j[ok]])
