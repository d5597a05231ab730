"""Zepp's vacate pass: per token, move every entry bound for the remote node the token touches
least onto replicas on nodes the token already touches (home node first), when the replica
bounds allow (PAPER.md section 2.2, after the water-fill of ``zepp_routing``).

A move of a token is all-or-nothing: it only pays if the node drops out entirely. Rounds are
vectorised over the candidate tokens ``[g]`` and their entries ``[g, k]``.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.base_routing import position_in_group
from zepp.planner.types import Placement, expert_load_bounds

_NO_REMOTE = np.iinfo(np.int32).max


def vacate(topk_ids: np.ndarray, slot: np.ndarray, placement: Placement, relaxation: float,
           rounds: int) -> np.ndarray:
    """``slot [R, T, k]`` after up to ``rounds`` rounds of the vacate pass.

    Each round every candidate token proposes its move; moves are admitted in token order while
    the target replica stays under its upper bound and the source above its lower bound; a token
    whose moves are not all admitted keeps its routing (its reserved room stays unused that round).
    """
    ranks, T, k = topk_ids.shape
    N = ranks // placement.gpus_per_node
    if N < 2 or rounds < 1 or not (placement.replica_count > 1).any():
        return slot
    state = _Vacate(topk_ids, slot, placement, relaxation)
    for _ in range(rounds):
        if not state.round():
            break
    return np.where(state.present, state.slot, -1).reshape(ranks, T, k).astype(np.int32)


def replica_on_node(placement: Placement) -> np.ndarray:
    """``[E, N]`` int32: the lowest global slot of expert ``e`` on node ``n``, or ``-1``."""
    S, L, E = placement.slots_per_rank, placement.gpus_per_node, placement.num_experts
    N = placement.ranks // L
    reps = placement.replicas
    rep_node = np.where(reps >= 0, reps // S // L, N)
    table = np.full((E, N + 1), -1, np.int32)
    ee = np.repeat(np.arange(E), reps.shape[1])
    order = np.argsort(-reps.ravel(), kind="stable")  # highest slot first, so the lowest wins
    table[ee[order], rep_node.ravel()[order]] = reps.ravel()[order]
    return table[:, :N]


class _Vacate:
    """The pass's state over the ``G = R*T`` tokens: ``expert``, ``present``, ``slot [G, k]``
    (int64; a missing entry sits on its token's home node: never remote, never moved), ``home [G]``
    node, ``load [R*S]`` per slot, ``candidates [g]`` tokens still worth a round; per expert the
    bounds ``lower_e`` / ``upper_e [E]`` and ``replica_on_node [E, N]``."""

    def __init__(self, topk_ids: np.ndarray, slot: np.ndarray, placement: Placement, relaxation: float):
        ranks, T, k = topk_ids.shape
        self.S, self.L = placement.slots_per_rank, placement.gpus_per_node
        self.N = ranks // self.L
        ids = topk_ids.ravel()
        demand = np.bincount(ids[ids >= 0], minlength=placement.num_experts).astype(np.int64)
        self.lower_e, self.upper_e = expert_load_bounds(demand, placement.replica_count.astype(np.int64), relaxation)
        self.replica_on_node = replica_on_node(placement)
        self.expert = topk_ids.reshape(-1, k)  # [G, k], G = R * T tokens
        G = self.expert.shape[0]
        self.home = ((np.arange(G) // T) // self.L).astype(np.int16)  # [G] owner node of each token
        self.present = self.expert >= 0
        away = (self.home[:, None].astype(np.int64) * self.L) * self.S
        self.slot = np.where(self.present, slot.reshape(-1, k), away).astype(np.int64)
        self.load = np.bincount(self.slot[self.present], minlength=placement.slot_expert.size).astype(np.int64)
        multi = (placement.replica_count > 1)[np.maximum(self.expert, 0)]
        self.candidates = np.flatnonzero((multi & self.present).any(1))

    def round(self) -> bool:
        """One round; False when nothing was proposed or admitted (the pass ends)."""
        if self.candidates.size == 0:
            return False
        g = self.candidates.size
        sl = self.slot[self.candidates]
        node = (sl // (self.S * self.L)).astype(np.int16)  # [g, k]
        g_home = self.home[self.candidates]
        gi, ki, least = _least_touched_entries(node, g_home, self.N)
        if gi.size == 0:
            return False
        e_mv = self.expert[self.candidates[gi], ki]
        src = sl[gi, ki].astype(np.int64)
        dst, feasible = self._targets(e_mv, g_home[gi], node[gi], least[gi], src)
        # Admission in token order; a token moves only if all its entries on that node can move.
        fits = feasible & self._room(e_mv, src, dst)
        accept = np.bincount(gi[~fits], minlength=g)[gi] == 0
        if not accept.any():
            return False
        gsel, ksel = self.candidates[gi[accept]], ki[accept]
        self.slot[gsel, ksel] = dst[accept]
        np.add.at(self.load, dst[accept], 1)
        np.subtract.at(self.load, src[accept], 1)
        # Next round: tokens that moved (another node may now drop) and tokens that only lost
        # because rejected moves of other tokens held the room.
        still = np.bincount(gi[~feasible], minlength=g) == 0
        self.candidates = self.candidates[np.flatnonzero(still & (np.bincount(gi, minlength=g) > 0))]
        return True

    def _targets(self, e_mv: np.ndarray, home: np.ndarray, node: np.ndarray, least: np.ndarray,
                 src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each moving entry (expert ``e_mv [m]``, its token's ``home [m]`` node, the nodes
        ``node [m, k]`` of the token's entries and the node ``least [m]`` to vacate) could go
        instead: a replica on the home node or on another node the token touches, nearest to
        home in rotation order. Returns ``(dst [m], feasible [m])`` (``dst = src`` where none)."""
        N = self.N
        m, k = node.shape
        target_node = np.empty((m, k + 1), np.int16)  # [m, k+1]: home, then the token's nodes
        target_node[:, 0] = home
        target_node[:, 1:] = node
        there = self.replica_on_node[e_mv[:, None], target_node]
        rotation = target_node - target_node[:, :1]
        rotation += N * (rotation < 0)
        score = np.where((there >= 0) & (target_node != least[:, None]), rotation, N)
        best = score.argmin(1)
        feasible = score[np.arange(m), best] < N
        dst = there[np.arange(m), best].astype(np.int64)
        return np.where(feasible, dst, src), feasible

    def _room(self, e_mv: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """``[m]``: the move fits, in token order, under ``dst``'s upper and above ``src``'s lower bound."""
        room_in = self.upper_e[e_mv] - self.load[dst]
        room_out = self.load[src] - self.lower_e[e_mv]
        n_slots = self.load.size
        return (position_in_group(dst, n_slots) < room_in) & (position_in_group(src, n_slots) < room_out)


def _least_touched_entries(node: np.ndarray, home: np.ndarray, N: int):
    """Per token (``node [g, k]`` of its entries, ``home [g]``), the remote node it touches least
    (ties: lowest node id): ``(gi [m], ki [m], least [g])``, the (token, entry) indices of the
    entries on it."""
    g = node.shape[0]
    # Per entry, how many of its token's entries share its node.
    token_node = (np.arange(g, dtype=np.int64)[:, None] * N + node).ravel()
    count = np.bincount(token_node, minlength=g * N)[token_node].reshape(node.shape)
    remote = node != home[:, None]
    key = np.where(remote, count * N + node, _NO_REMOTE)
    pick = key.argmin(1)
    has_remote = key[np.arange(g), pick] < _NO_REMOTE
    least = node[np.arange(g), pick]
    gi, ki = np.nonzero((node == least[:, None]) & has_remote[:, None])
    return gi, ki, least
