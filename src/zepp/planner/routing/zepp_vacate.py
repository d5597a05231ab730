"""Zepp's vacate pass: per token, move every entry bound for the remote node the token touches
least onto replicas on nodes the token already touches (home node first), when the replica
bounds allow (PAPER.md section 2.2, after the water-fill of ``zepp_routing``).

A move of a token is all-or-nothing: it only pays if the node drops out entirely. Rounds are
vectorised over the candidate tokens ``[g]`` and their proposed moves ``[m]``. A token's entries
are held column by column (``node [k, G]``: entry ``j`` of every token contiguous), so a token's
per-node counts are ``k(k-1)/2`` comparisons of two columns; a move's target is read off bit
masks of nodes (``N <= zepp_tables.MASK_NODES``) or, on larger clusters, off the ``k + 1`` candidate nodes in turn.
Admission counts a move's place among the earlier moves into (out of) the same replica only
where more moves ask for a replica than it has room (``_fits_in_order``).
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.base_routing import position_in_group
from zepp.planner.routing.zepp_tables import zepp_tables
from zepp.planner.types import Placement, replica_bounds


def vacate(topk_ids: np.ndarray, slot: np.ndarray, placement: Placement, relaxation: float,
           rounds: int, slot_counts: tuple | None = None, node: np.ndarray | None = None) -> np.ndarray:
    """``slot [R, T, k]`` after up to ``rounds`` rounds of the vacate pass.

    Each round every candidate token proposes its move; moves are admitted in token order while
    the target replica stays under its upper bound and the source above its lower bound; a token
    whose moves are not all admitted keeps its routing (its reserved room stays unused that round).
    ``slot [R, T, k]``: ``-1`` where an entry is missing. ``slot_counts``: ``(load, lower, upper)``
    per global slot ``[R*S]`` where the caller has them from its counts (the water-fill's; only the
    slots of several-replica experts are read, the only ones a move leaves or enters), else they
    are counted here. ``node``: each entry's node under ``slot`` (its home node where missing),
    any shape of ``R*T*k`` elements, where the caller has it.
    """
    ranks, T, k = topk_ids.shape
    N = ranks // placement.gpus_per_node
    if N < 2 or rounds < 1 or not (placement.replica_count > 1).any():
        return slot
    state = _Vacate(topk_ids, slot, placement, relaxation, slot_counts, node)
    for _ in range(rounds):
        if not state.round():
            break
    return state.slot.reshape(ranks, T, k)


class _Vacate:
    """The pass's state over the ``G = R*T`` tokens: ``expert`` and ``slot [G*k]`` (flat, ``-1``
    where missing), ``node [k, G]`` (a missing entry sits on its token's home node: never remote,
    never moved), ``home [G]``, ``load`` and the bounds ``lo`` / ``hi [R*S]`` per slot,
    ``candidates [g]`` tokens still worth a round; the placement's ``tables``."""

    def __init__(self, topk_ids, slot, placement: Placement, relaxation: float, slot_counts, node):
        ranks, T, k = topk_ids.shape
        self.tables = zepp_tables(placement)
        self.N, self.k, self.SL = placement.nodes, k, placement.slots_per_rank * placement.gpus_per_node
        G = ranks * T
        self.expert = topk_ids.reshape(-1)
        self.slot = slot.astype(np.int32).reshape(-1)  # a copy
        self.multi = placement.replica_count > 1
        self.node_mask = None  # node bit masks in the narrowest type wider than N bits (shifts by N stay defined)
        if self.tables.node_mask is not None:
            bits = next(b for b in (8, 16, 32, 64) if self.N < b)
            self.node_mask = self.tables.node_mask.astype(f"uint{bits}")
        self.home = np.repeat(np.arange(self.N, dtype=self.tables.node_of.dtype), T * placement.gpus_per_node)
        if node is None:
            node = np.where(self.slot >= 0, self.slot // self.SL, np.repeat(self.home, k))
        self.node = np.ascontiguousarray(np.asarray(node, self.home.dtype).reshape(G, k).T)  # [k, G]
        self.n_slots = placement.slot_expert.size
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
        node = self.node if g == self.node.shape[1] else self.node.take(cand, axis=1)  # [k, g], C order
        home = self.home[cand]
        gi, ki, least, has_remote = _least_touched_entries(node, home, self.N)
        if gi.size == 0:
            return False
        flat = cand[gi] * self.k + ki
        e_mv = self.expert.take(flat)
        # An entry of a single-replica expert on the node cannot move: its token keeps its routing
        # (such moves only touch single-replica slots, so they hold no room of the others).
        single = ~self.multi[e_mv]
        stuck = _any_of_token(gi[single], g)
        mv = np.flatnonzero(~single)
        gi, ki, flat, e_mv = gi[mv], ki[mv], flat[mv], e_mv[mv]
        src = self.slot.take(flat)
        dst, feasible = self._targets(e_mv, node, gi, home[gi], least[gi], src)
        # Admission in token order; a token moves only if all its entries on that node can move.
        fits = feasible & _fits_in_order(dst, self.hi - self.load, self.n_slots) \
            & _fits_in_order(src, self.load - self.lo, self.n_slots)
        accept = ~(stuck | _any_of_token(gi[~fits], g))[gi]
        if not accept.any():
            return False
        at = np.flatnonzero(accept)
        da, sa = dst[at], src[at]
        self.slot[flat[at]] = da
        self.node.ravel()[ki[at] * self.node.shape[1] + cand[gi[at]]] = da // self.SL
        self.load += np.bincount(da, minlength=self.n_slots) - np.bincount(sa, minlength=self.n_slots)
        # Next round: tokens that moved (another node may now drop) and tokens that only lost
        # because rejected moves of other tokens held the room.
        still = ~(stuck | _any_of_token(gi[~feasible], g))
        self.candidates = cand[still & has_remote]
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


def _any_of_token(gi: np.ndarray, g: int) -> np.ndarray:
    """``[g]`` bool: the tokens named in ``gi``."""
    out = np.zeros(g, bool)
    out[gi] = True
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


def _least_touched_entries(node: np.ndarray, home: np.ndarray, N: int):
    """Per token (``node [k, g]`` of its entries, ``home [g]``), the remote node it touches least
    (ties: lowest node id): ``(gi [m], ki [m], least [g], has_remote [g])``, the (token, entry)
    indices of the entries on it, in token order."""
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
    least = table.take(least_key)
    flat = np.flatnonzero((node == least).T)  # token-major order
    gi = flat // k
    return gi, flat - gi * k, least, has_remote
