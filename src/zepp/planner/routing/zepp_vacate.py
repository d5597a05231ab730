"""Zepp's vacate pass: per token, move every entry bound for the remote node the token touches
least onto replicas on nodes the token already touches (home node first), when the replica
bounds allow (PAPER.md section 2.2, after the water-fill of ``zepp_routing``).

A move of a token is all-or-nothing: it only pays if the node drops out entirely. Rounds are
vectorised over the candidate tokens ``[g]`` and their proposed moves ``[m]``. A token's entries
are held column by column (``node [k, G]``: entry ``j`` of every token contiguous), so a token's
per-node counts are ``k(k-1)/2`` comparisons of two columns. Which entries can never move (their
expert has one replica) comes with the nodes, off the assignment's gather (node codes:
``zepp_assign.assign_entries``), so a token blocked by one is found on the columns and only
several-replica moves are listed, in token order, each token's one move read off the columns
(``_token_major``). A move's target is read off bit masks of nodes (``N <= zepp_tables.MASK_NODES``)
or, on larger clusters, off the ``k + 1`` candidate nodes in turn. Admission counts a move's place
among the earlier moves into (out of) the same replica only where more moves ask for a replica
than it has room (``_fits_in_order``).
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.base_routing import position_in_group
from zepp.planner.routing.zepp_tables import single_bit, zepp_tables
from zepp.planner.types import Placement, replica_bounds


def vacate(topk_ids: np.ndarray, slot: np.ndarray, placement: Placement, relaxation: float,
           rounds: int, slot_counts: tuple | None = None, node: np.ndarray | None = None,
           in_place: bool = False) -> np.ndarray:
    """``slot [R, T, k]`` after up to ``rounds`` rounds of the vacate pass.

    Each round every candidate token proposes its move; moves are admitted in token order while
    the target replica stays under its upper bound and the source above its lower bound; a token
    whose moves are not all admitted keeps its routing (its reserved room stays unused that round).
    ``slot [R, T, k]``: ``-1`` where an entry is missing. ``slot_counts``: ``(load, lower, upper)``
    per global slot ``[R*S]`` where the caller has them from its counts (the water-fill's; only the
    slots of several-replica experts are read, the only ones a move leaves or enters), else they
    are counted here. ``node``: each entry's node code under ``slot`` (``zepp_assign.assign_entries``:
    its node, the home node where missing, the sign bit set where its expert has a single replica),
    any shape of ``R*T*k`` elements, where the caller has it. ``in_place``: ``slot`` (int32, C
    order) is moved in place instead of copied (the caller's own array).
    """
    ranks, T, k = topk_ids.shape
    N = ranks // placement.gpus_per_node
    if N < 2 or rounds < 1 or not (placement.replica_count > 1).any():
        return slot
    state = _Vacate(topk_ids, slot, placement, relaxation, slot_counts, node, in_place)
    for _ in range(rounds):
        if not state.round():
            break
    return state.slot.reshape(ranks, T, k)


class _Vacate:
    """The pass's state over the ``G = R*T`` tokens: ``expert`` and ``slot [G*k]`` (flat, ``-1``
    where missing), ``node [k, G]`` (a missing entry sits on its token's home node: never remote,
    never moved), ``single [k, G]`` (the entry's expert has one replica: it can never move),
    ``home [G]``, ``load`` and the bounds ``lo`` / ``hi [R*S]`` per slot, ``candidates [g]``
    tokens still worth a round; the placement's ``tables``."""

    def __init__(self, topk_ids, slot, placement: Placement, relaxation: float, slot_counts, node, in_place=False):
        ranks, T, k = topk_ids.shape
        self.tables = zepp_tables(placement)
        self.N, self.k, self.SL = placement.nodes, k, placement.slots_per_rank * placement.gpus_per_node
        G = ranks * T
        self.expert = topk_ids.reshape(-1)
        self.slot = slot.reshape(-1) if in_place else slot.astype(np.int32).reshape(-1)  # else a copy
        self.multi = placement.replica_count > 1
        self.node_mask = None  # node bit masks in the narrowest type wider than N bits (shifts by N stay defined)
        if self.tables.node_mask is not None:
            bits = next(b for b in (8, 16, 32, 64) if self.N < b)
            self.node_mask = self.tables.node_mask.astype(f"uint{bits}")
        dtype = self.tables.node_of.dtype
        self.home = np.repeat(np.arange(self.N, dtype=dtype), T * placement.gpus_per_node)
        if node is None:  # node codes (zepp_assign.assign_entries) from the slots
            code = np.where(self.slot >= 0, self.slot // self.SL, np.repeat(self.home, k)).astype(dtype)
            code[(self.expert >= 0) & ~self.multi[np.maximum(self.expert, 0)]] |= single_bit(dtype)
            node = code
        code = np.ascontiguousarray(np.asarray(node, dtype).reshape(G, k).T)  # [k, G]
        self.single = code < 0
        self.node = code & np.iinfo(dtype).max
        self.n_slots = placement.slot_expert.size
        self.slot_expert = placement.slot_expert.ravel()
        if slot_counts is None:
            s = self.slot[self.slot >= 0]
            slot_counts = (np.bincount(s, minlength=self.n_slots), *replica_bounds(self.expert, placement, relaxation))
        load, self.lo, self.hi = (np.asarray(a, np.int64) for a in slot_counts)
        self.load = load.copy()
        # every token: one without an entry of a several-replica expert proposes only infeasible
        # moves (onto its own single-replica slots, which no feasible move touches) and drops out
        self.candidates = np.arange(G)

    def round(self) -> bool:
        """One round; False when nothing was proposed or admitted (the pass ends)."""
        cand = self.candidates
        g = cand.size
        if g == 0:
            return False
        every = g == self.node.shape[1]
        node = self.node if every else self.node.take(cand, axis=1)  # [k, g], C order
        single = self.single if every else self.single.take(cand, axis=1)
        home = self.home if every else self.home.take(cand)
        least, has_remote = _least_touched(node, home, self.N)
        on_least = node == least  # [k, g]: the entries to move (none where no node is remote)
        # An entry of a single-replica expert on the node cannot move: its token keeps its routing
        # (such moves only touch single-replica slots, so they hold no room of the others; the
        # token's other moves still hold theirs in the admission order below).
        stuck = (on_least & single).any(0)
        on_least &= ~single
        gi, ki = _token_major(on_least)
        if gi.size == 0:
            return False
        tok = cand.take(gi)
        flat = tok * self.k + ki
        src = self.slot.take(flat)
        e_mv = self.slot_expert.take(src)
        dst, feasible = self._targets(e_mv, node, gi, home.take(gi), least.take(gi), src)
        # Admission in token order; a token moves only if all its entries on that node can move.
        fits = feasible & _fits_in_order(dst, self.hi - self.load, self.n_slots) \
            & _fits_in_order(src, self.load - self.lo, self.n_slots)
        accept = ~_mark(stuck, gi, ~fits).take(gi)
        if not accept.any():
            return False
        at = np.flatnonzero(accept)
        da, sa = dst[at], src[at]
        self.slot[flat[at]] = da
        self.node.ravel()[ki[at] * self.node.shape[1] + tok[at]] = da // self.SL
        self.load += np.bincount(da, minlength=self.n_slots) - np.bincount(sa, minlength=self.n_slots)
        # Next round: tokens that moved (another node may now drop) and tokens that only lost
        # because rejected moves of other tokens held the room.
        self.candidates = cand.take(np.flatnonzero(~_mark(stuck, gi, ~feasible) & has_remote))
        return True

    def _targets(self, e_mv, node, gi, home, least, src) -> tuple[np.ndarray, np.ndarray]:
        """Where each move (expert ``e_mv [m]``, its token's nodes ``node[:, gi]``, ``home [m]``,
        the node ``least [m]`` to vacate) could go instead: a replica on the home node or on
        another node the token touches, nearest to home in rotation order (home, home+1, ...).
        Returns ``(dst [m], feasible [m])`` (``dst = src`` where none)."""
        N, ron, node_mask = self.N, self.tables.replica_on_node.ravel(), self.node_mask
        if node_mask is not None:
            u = node_mask.dtype.type
            touched = np.zeros(node.shape[1], u)
            for col in node:
                touched |= u(1) << col.astype(u)
            h = home.astype(u)
            allowed = (touched[gi] | (u(1) << h)) & ~(u(1) << least.astype(u)) & node_mask[e_mv]
            rotated = ((allowed >> h) | (allowed << (u(N) - h))) & ((u(1) << u(N)) - u(1))
            step = np.bitwise_count((rotated & (~rotated + u(1))) - u(1))  # lowest set bit
            there = ron[e_mv * N + (home + step) % N]
            feasible = allowed != 0
        else:
            best = np.full(e_mv.size, N, np.int64)
            there = src.copy()
            for col in (home, *(c[gi] for c in node)):  # home, then the token's nodes
                rep = ron[e_mv * N + col]
                dist = np.where((rep >= 0) & (col != least), (col.astype(np.int64) - home) % N, N)
                better = dist < best
                best = np.where(better, dist, best)
                there = np.where(better, rep, there)
            feasible = best < N
        return np.where(feasible, there, src).astype(np.int32), feasible


def _mark(flags: np.ndarray, gi: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``[g]`` bool: ``flags``, or named in ``gi [m]`` where ``where [m]`` (a new array)."""
    out = flags.copy()
    out[gi.take(np.flatnonzero(where))] = True  # (a take: boolean indexing is several times slower)
    return out


def _fits_in_order(key: np.ndarray, room: np.ndarray, n_keys: int) -> np.ndarray:
    """``[m]``: whether each element's place among the earlier elements with its key (array
    order) is below ``room[key]``; places are counted only for keys asked more than their room."""
    tight = np.bincount(key, minlength=n_keys) > np.maximum(room, 0)
    ok = np.ones(key.size, bool)
    at = np.flatnonzero(tight[key])
    if at.size:
        ok[at] = position_in_group(key[at], n_keys) < room[key[at]]
    return ok


def _least_touched(node: np.ndarray, home: np.ndarray, N: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token (``node [k, g]`` of its entries, ``home [g]``), the remote node it touches least
    (ties: lowest node id): ``(least [g], has_remote [g])``, ``least = -1`` where no node is remote."""
    k, g = node.shape
    count = np.zeros((k, g), np.int8 if k < 64 else np.int16)  # per entry, other entries of its token on its node
    same = np.empty(g, bool)
    for i in range(k):
        for j in range(i + 1, k):
            np.equal(node[i], node[j], out=same)
            count[i] += same.view(np.int8)
            count[j] += same.view(np.int8)
    count += (node == home) * count.dtype.type(k)  # a home entry counts k more: never the least
    dtype = np.int16 if 2 * k * N < 1 << 15 else np.int32
    least_key = (count.astype(dtype) * dtype(N) + node).min(0)  # (count, node) of the least touched
    has_remote = least_key < k * N
    table = np.full(2 * k * N, -1, node.dtype)
    table[:k * N] = np.arange(k * N) % N
    return table.take(least_key), has_remote


def _token_major(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``True`` cells of ``mask [k, g]`` in token-major order: ``(gi [m], ki [m])``. Almost
    every token has at most one, so a token's cell is read off the columns (``sum j mask[j]``,
    right where it has one) and only the tokens with several are listed cell by cell."""
    k, g = mask.shape
    small = np.int8 if k < 128 else np.int32
    count = mask.sum(0, dtype=small)
    tok = np.flatnonzero(count != 0)  # (a bool array: numpy's nonzero of int8 is several times slower)
    col = np.zeros(g, small)
    for j in range(1, k):
        col += mask[j].view(np.int8) * small(j)
    per = count.take(tok)
    several = np.flatnonzero(per > 1)
    if several.size == 0:
        return tok, col.take(tok).astype(np.intp)
    # the first cell of token i of tok sits after the extra cells of the tokens before it
    extra = np.zeros(tok.size, np.intp)
    extra[several] = per[several] - 1
    first = np.arange(tok.size) + (np.cumsum(extra) - extra)
    gi = np.empty(tok.size + int(extra.sum()), np.intp)
    ki = np.empty_like(gi)
    gi[first], ki[first] = tok, col.take(tok)
    row, j = np.nonzero(mask[:, tok[several]].T)  # their cells, token-major; row: which of them
    start = np.cumsum(per[several]) - per[several]  # where each one's cells start in row
    at = first[several].take(row) + np.arange(row.size) - start.take(row)
    gi[at], ki[at] = tok[several].take(row), j
    return gi, ki
