"""A routing's entries counted per token: what the count-level flow builders
(``direct_volumes``, ``gateway_volumes``) read instead of per-row lists.

Every transport's volumes follow from three ``[R, *]`` counts of the routing and, for the
NIC-balanced split, the token order inside a few (owner, node) segments:

- ``entries [R, R]``: entries of owner rank ``r`` computed on rank ``c`` (one row each, ``a2av``);
- ``pairs [R, R]``: tokens of owner ``r`` with at least one entry on rank ``c`` (token-GPU pairs);
- ``union [R, N]``: tokens of owner ``r`` with at least one entry on node ``n`` (token-node pairs);
- ``rows_beyond(kept)``: the token-node pairs of segment ``(r, n)`` past its first ``kept[r, n]``
  in token order (the rows a GPU hands to another NIC), with ``gpus_on`` their token's GPUs there.

The entries are read rank block by rank block (``block_entries`` entries at most), each block
held column by column (``[k, g]``: entry ``j`` of every token contiguous), so a token's distinct
GPUs and nodes are ``k(k-1)/2`` comparisons of two columns, and memory stays bounded.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.types import Routing

BLOCK_ENTRIES = 1 << 23


class TokenCounts:
    """The counts of ``routing`` (see the module docstring); ``R``, ``T``, ``k``, ``L``, ``N``."""

    def __init__(self, routing: Routing, block_entries: int | None = None):
        p = routing.placement
        self.R, self.T, self.k = routing.slot.shape
        self.L, self.S, self.N = p.gpus_per_node, p.slots_per_rank, p.nodes
        self.slot = routing.slot
        self.ranks_per_block = max(1, (block_entries or BLOCK_ENTRIES) // max(1, self.T * self.k))
        R, N, L = self.R, self.N, self.L
        counts = np.zeros(R * (R + 1) * 4, np.int64)  # [owner, comp + 1, first on its rank + 2 first on its node]
        self._blocks: list[_Block | None] = []
        for r0 in range(0, R, self.ranks_per_block):
            b = _Block(self, r0)
            counts += np.bincount(b.key().ravel(), minlength=counts.size)
            self._blocks.append(b if R <= self.ranks_per_block else None)  # kept when there is one block
        counts = counts.reshape(R, R + 1, 4)[:, 1:]  # comp + 1 = 0: missing entries
        self.entries = counts.sum(2)
        self.pairs = counts[:, :, 1] + counts[:, :, 3]
        self.union = (counts[:, :, 2] + counts[:, :, 3]).reshape(R, N, L).sum(2)

    def _block(self, i: int) -> "_Block":
        return self._blocks[i] or _Block(self, i * self.ranks_per_block)

    def rows_beyond(self, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The token-node pairs of each segment (owner ``r``, node ``n``) past its first
        ``kept [R, N]`` in token order: ``(owner, token, node, place)`` ``[d]`` each, ``place`` the
        pair's index in its segment (``>= kept``); by owner, then node, then token."""
        out = []
        over = self.union > kept
        for i in range(len(self._blocks)):
            r0 = i * self.ranks_per_block
            r1 = min(self.R, r0 + self.ranks_per_block)
            if over[r0:r1].any():
                out.append(self._block(i).rows_beyond(kept[r0:r1], over[r0:r1]))
        if not out:
            z = np.zeros(0, np.int64)
            return z, z, z, z
        return tuple(np.concatenate(c) for c in zip(*out))

    def slot_entries(self) -> np.ndarray:
        """``[R, R*S]``: entries of owner ``r`` served by global slot ``s`` (what the simulator's
        GEMM tasks count, per slot and owner)."""
        R, RS = self.R, self.R * self.S
        out = np.zeros(R * RS + 1, np.int64)
        for i in range(len(self._blocks)):
            r0 = i * self.ranks_per_block
            slot = self.slot[r0:r0 + self.ranks_per_block].reshape(-1, self.T * self.k)
            key = (np.arange(r0, r0 + slot.shape[0], dtype=np.int64) * RS)[:, None] + slot
            out += np.bincount(np.where(slot >= 0, key, R * RS).ravel(), minlength=out.size)
        return out[:-1].reshape(R, RS)

    def single_pairs(self, single: np.ndarray) -> np.ndarray:
        """``[R, R]``: tokens of owner ``r`` with an entry on rank ``c`` served by a slot of
        ``single [R*S]`` (a single-copy expert's: ``zepp.sim.predispatch``)."""
        R = self.R
        out = np.zeros(R * R + 1, np.int64)
        for i in range(len(self._blocks)):
            b = self._block(i)
            r0, r1 = b.r0, b.r1
            slot = np.ascontiguousarray(self.slot[r0:r1].reshape(-1, self.k).T)
            flag = (slot >= 0) & single[np.maximum(slot, 0)]
            first = _first_of_token(np.where(flag, b.comp, -1))
            out += np.bincount(np.where(first, b.owner * R + b.comp, R * R).ravel(), minlength=out.size)
        return out[:-1].reshape(R, R)

    def has_single_on(self, owner: np.ndarray, token: np.ndarray, rank: np.ndarray, single: np.ndarray) -> np.ndarray:
        """``[d]`` bool: token ``(owner, token)`` has an entry on ``rank`` served by a slot of ``single``."""
        slot = self.slot[owner, token]  # [d, k]
        return ((slot // self.S == rank[:, None]) & (slot >= 0) & single[np.maximum(slot, 0)]).any(1)

    def gpus_on(self, owner: np.ndarray, token: np.ndarray, node: np.ndarray) -> np.ndarray:
        """``[d, k]`` int64: the distinct ranks on ``node [d]`` computing entries of token
        ``(owner [d], token [d])``, ``-1`` elsewhere."""
        comp = np.sort(self.slot[owner, token] // self.S, axis=1)  # -1 (missing) sorts first
        keep = (comp // self.L == node[:, None]) & (comp >= 0)
        keep[:, 1:] &= comp[:, 1:] != comp[:, :-1]
        return np.where(keep, comp, -1).astype(np.int64)

    def gpus_on_listed(self, owner: np.ndarray, token: np.ndarray, node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``gpus_on`` as a list: ``(row [p], gpu [p])``, the distinct ranks of each row's token on
        its node, by row (inside a row in entry order; no sort: ``k(k-1)/2`` column comparisons)."""
        comp = np.ascontiguousarray(self.slot[owner, token].T) // self.S  # [k, d], -1 where missing
        keep = _first_of_token(comp) & (comp // self.L == node)
        row, j = np.nonzero(keep.T)
        return row, comp[j, row].astype(np.int64)


class _Block:
    """Ranks ``r0 .. r1`` of a ``TokenCounts``: per entry column ``comp`` and ``node [k, g]``
    (``-1`` where missing; ``g = (r1 - r0) T``; the smallest integer type that holds them),
    ``first_c`` / ``first_n [k, g]`` (the entry is its token's first on that rank / node),
    ``owner [g]`` (global rank of each token, built on use)."""

    def __init__(self, tc: TokenCounts, r0: int):
        self.tc, self.r0 = tc, r0
        self.r1 = r1 = min(tc.R, r0 + tc.ranks_per_block)
        self.comp = _divide(tc.slot[r0:r1].reshape(-1, tc.k), tc.S).T.astype(_small_int(tc.R), order="C")  # [k, g]
        self.node = _divide(self.comp, tc.L)
        self.first_c = _first_of_token(self.comp)
        self.first_n = _first_of_token(self.node)

    @property
    def owner(self) -> np.ndarray:
        return np.repeat(np.arange(self.r0, self.r1, dtype=np.int32), self.tc.T)

    def key(self) -> np.ndarray:
        """``[k, g]``: ``(owner (R+1) + comp + 1) 4 + first_c + 2 first_n`` (``comp + 1 = 0``: missing)."""
        R = self.tc.R
        dtype = _small_int(4 * R * (R + 1))
        flags = np.multiply(self.first_n.view(np.int8), np.int8(2))  # in int8, so the int16 key takes 3 passes
        flags += self.first_c.view(np.int8)
        key = np.multiply(self.comp, 4, dtype=dtype)
        key += flags
        key += ((np.arange(self.r0, self.r1) * (R + 1) + 1) * 4).astype(dtype).repeat(self.tc.T)
        return key

    def rows_beyond(self, kept: np.ndarray, over: np.ndarray):
        """``TokenCounts.rows_beyond`` for this block's ranks (``kept``, ``over [rb, N]``: the
        segments with rows past ``kept``). The rows past ``kept`` are a segment's last ones, so each
        segment is read in a window of its last tokens, widened (doubled) until it holds them all:
        about the excess rows' tokens per segment, not all ``T``."""
        T, N = self.tc.T, self.tc.N
        which = np.flatnonzero(over.ravel())  # segments (r - r0) * N + n with rows beyond
        rb, n = which // N, which % N
        union = self.tc.union[self.r0:self.r1].ravel()[which]
        kept = kept.ravel()[which]
        width = np.minimum(T, 5 * (union - kept) * T // (4 * union) + 16)  # tokens read from each segment's end
        while True:
            seg, start, t, present = self._window(rb, n, width)
            csum = np.concatenate(([0], np.cumsum(present)))
            seen = csum[start + width] - csum[start]  # rows in each window
            short = (union - seen > kept) & (width < T)
            if not short.any():
                break
            width = np.where(short, np.minimum(T, 2 * width), width)
        place = (union - seen - csum[start])[seg] + csum[1:] - 1  # 0-based place in the segment
        at = np.flatnonzero(present & (place >= kept[seg]))
        return rb[seg[at]] + self.r0, t[at], n[seg[at]], place[at].astype(np.int32)

    def _window(self, rb: np.ndarray, n: np.ndarray, width: np.ndarray):
        """The last ``width [D]`` tokens of segments (block rank ``rb``, node ``n``) ``[D]``, one
        after another: ``(seg, start [D], token, present)``, ``present`` where the token has an
        entry on the segment's node."""
        T = self.tc.T
        start = np.cumsum(width) - width
        seg = np.repeat(np.arange(width.size), width)
        t = np.arange(seg.size) - (start - (T - width))[seg]
        g = rb[seg] * T + t
        node = n.astype(self.node.dtype)[seg]
        bits = self.node_bits()
        if bits is not None:  # one gather per window token instead of k
            u = bits.dtype.type
            present = ((bits.take(g) >> node.astype(bits.dtype)) & u(1)).astype(bool)
        else:
            present = np.zeros(g.size, bool)
            for col in self.node:
                present |= col.take(g) == node
        return seg, start, t, present

    def node_bits(self) -> np.ndarray | None:
        """``[g]``: each token's nodes as bits (bit ``n`` set where an entry is on node ``n``), in
        the narrowest unsigned type of ``N`` bits; ``None`` beyond 64 nodes. Built on first use."""
        if not hasattr(self, "_bits"):
            self._bits = None
            N = self.tc.N
            if N <= 64:
                u = np.dtype(f"uint{next(b for b in (8, 16, 32, 64) if N <= b)}").type
                self._bits = np.zeros(self.node.shape[1], u)
                bit = np.empty_like(self._bits)
                missing = bool((self.node < 0).any())
                for col in self.node:  # a missing entry (-1) sets no bit
                    np.left_shift(u(1), col.astype(u), out=bit)
                    if missing:
                        bit[col < 0] = 0
                    self._bits |= bit
        return self._bits


def _divide(a: np.ndarray, d: int) -> np.ndarray:
    """``a // d``, by a shift where ``d`` is a power of two (the same values, negative ones too)."""
    return a >> (d.bit_length() - 1) if d & (d - 1) == 0 else a // d


def _small_int(hi: int) -> type:
    """The smallest signed integer type holding ``[-1, hi]``."""
    return np.int8 if hi < 1 << 7 else np.int16 if hi < 1 << 15 else np.int32 if hi < 1 << 31 else np.int64


def _first_of_token(col: np.ndarray) -> np.ndarray:
    """``[k, g]`` bool: entry ``j`` of a token is present and no earlier entry of the token has
    the same value (``col [k, g]``, ``-1`` where missing)."""
    first = col >= 0
    for i in range(1, col.shape[0]):
        for j in range(i):
            first[i] &= col[i] != col[j]
    return first
