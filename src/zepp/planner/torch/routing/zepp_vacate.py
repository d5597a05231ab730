"""Zepp's vacate pass in torch: ``zepp.planner.routing.zepp_vacate.vacate``, element for element.

Fixed shapes and integer arithmetic; ``vacate_rounds`` rounds. With ``sync`` the rounds compact
their candidates and stop as soon as the numpy planner's would (a few host reads); without, every
round runs on every token with masks, and a device flag turns the rounds after the numpy
planner's stop into no-ops. The replica-load bounds are the numpy planner's ``expert_load_bounds``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from zepp.planner.torch._ops import arange, counts
from zepp.planner.torch.routing.base_routing import position_in_group
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.types import expert_load_bounds

_NO_REMOTE = np.iinfo(np.int32).max


def vacate(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float, rounds: int,
           sync: bool) -> torch.Tensor:
    """The vacate pass (``zepp.planner.routing.zepp_vacate.vacate``).

    The numpy planner compacts its candidate tokens and their proposed moves each round and
    stops early. With ``sync`` this does the same (``nonzero`` on the host). Without, every round
    runs on all ``G = R*T`` tokens and all ``G*k`` entries with masks: the row-major order of the
    masked entries is the order of the numpy planner's compacted lists, so the admission order
    (every ``position_in_group``) is the same, and a device flag ``live`` turns off every round
    after the one where the numpy planner would have stopped.
    """
    R, T, k = ids.shape
    if dp.N < 2 or rounds < 1 or not dp.any_multi:
        return slot
    state = _Vacate(ids, slot, dp, relaxation, sync)
    for _ in range(rounds):
        if not state.round():
            break
    return torch.where(state.present, state.slot, -1).reshape(R, T, k)


class _Moves(NamedTuple):
    """A round's proposed moves: a compact list ``[m]`` (``sync``, like the numpy planner's) or a
    mask on the grid ``[G, k]`` (targets then broadcast ``[G, 1, k+1]``). ``gi``: token row of
    each move; ``ki``: its entry (compact list only); ``mask``: which are proposed; ``expert``,
    ``src`` (its slot now); ``target_node`` / ``target_score`` ``[.., k+1]``."""

    gi: torch.Tensor
    ki: torch.Tensor | None
    mask: torch.Tensor
    expert: torch.Tensor
    src: torch.Tensor
    target_node: torch.Tensor
    target_score: torch.Tensor


class _Vacate:
    """The pass's state over the ``G = R*T`` tokens: ``expert`` (``e0`` clamped), ``present``,
    ``slot [G, k]`` (a missing entry sits on its token's home node), ``home [G]``, ``load [R*S]``,
    ``cand [G]`` tokens still worth a round, ``live`` (device flag, ``sync=False`` only); per
    expert the bounds ``lower_e`` / ``upper_e [E]``."""

    def __init__(self, ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float, sync: bool):
        R, T, k = ids.shape
        dev = ids.device
        self.dp, self.sync, self.k = dp, sync, k
        self.G = G = R * T
        demand = counts(torch.where(ids >= 0, ids, dp.E).reshape(-1), dp.E)
        self.lower_e, self.upper_e = expert_load_bounds(demand, dp.count, relaxation)
        expert = ids.reshape(G, k)
        self.present = expert >= 0
        self.e0 = expert.clamp_min(0)
        self.home = arange(G, dev) // T // dp.L  # [G]
        self.slot = torch.where(self.present, slot.reshape(G, k), (self.home * dp.L * dp.S)[:, None])
        self.n_slots = R * dp.S
        self.load = counts(torch.where(self.present, self.slot, self.n_slots).reshape(-1), self.n_slots)
        self.cand = ((dp.count[self.e0] > 1) & self.present).any(1)  # [G]
        self.live = torch.ones((), dtype=torch.bool, device=dev)
        self.ron = dp.replica_on_node.reshape(-1)
        self.all_rows = arange(G, dev)

    def round(self) -> bool:
        """One round; False when the numpy planner would stop here (``sync`` only)."""
        if self.sync:
            rows = torch.nonzero(self.cand)[:, 0]
            if rows.numel() == 0:
                return False
        else:
            rows = self.all_rows
        sl = self.slot[rows]  # [g, k]
        mv, target_node, tok_score = _proposals(sl // (self.dp.S * self.dp.L), self.home[rows], self.dp.N)
        moves = self._moves(rows, sl, mv, target_node, tok_score)
        if moves is None:
            return False
        dst, feasible, accept = self._admit(rows.shape[0], moves)
        src = moves.src
        if self.sync:
            if not bool(accept.any()):
                return False
            self.slot[rows[moves.gi], moves.ki] = torch.where(accept, dst, src)
        else:
            self.live = self.live & moves.mask.any() & accept.any()
            accept = accept & self.live
            self.slot = torch.where(accept, dst, self.slot)
        n = self.n_slots
        self.load = self.load + counts(torch.where(accept, dst, n).reshape(-1), n) \
            - counts(torch.where(accept, src, n).reshape(-1), n)
        self._next_candidates(rows, moves.gi, moves.mask, feasible)
        return True

    def _moves(self, rows, sl, mv, target_node, tok_score) -> _Moves | None:
        """The proposed moves of the tokens ``rows`` (``None``: none, ``sync`` only)."""
        if self.sync:
            gi, ki = torch.nonzero(mv, as_tuple=True)
            if gi.numel() == 0:
                return None
            mmask = torch.ones_like(gi, dtype=torch.bool)
            return _Moves(gi, ki, mmask, self.e0[rows[gi], ki], sl[gi, ki], target_node[gi], tok_score[gi])
        mmask = mv & self.cand[:, None] & self.live
        gi = self.all_rows[:, None].expand(self.G, self.k)
        return _Moves(gi, None, mmask, self.e0, sl, target_node[:, None, :], tok_score[:, None, :])

    def _admit(self, g: int, moves: _Moves):
        """Where each proposed move goes (a replica on a target node, nearest to home in rotation)
        and whether it is admitted in token order under the replica bounds; a token moves only if
        all its entries on that node can move. Returns ``(dst, feasible, accept)``."""
        N, n = self.dp.N, self.n_slots
        gi, mmask, e_mv, src = moves.gi, moves.mask, moves.expert, moves.src
        there = self.ron[e_mv[..., None] * N + moves.target_node]  # [m, k+1] or [G, k, k+1]
        smin, best = torch.where(there >= 0, moves.target_score, N).min(-1)
        feasible = smin < N
        dst = torch.where(feasible, there.gather(-1, best[..., None])[..., 0], src)
        room_in = self.upper_e[e_mv] - self.load[dst]
        room_out = self.load[src] - self.lower_e[e_mv]
        pos_in = position_in_group(torch.where(mmask, dst, n).reshape(-1), n).reshape(dst.shape)
        pos_out = position_in_group(torch.where(mmask, src, n).reshape(-1), n).reshape(dst.shape)
        fits = feasible & (pos_in < room_in) & (pos_out < room_out)
        if self.sync:
            rejected = counts(torch.where(fits, g, gi), g) > 0
        else:
            rejected = (mmask & ~fits).any(1)
        return dst, feasible, mmask & ~rejected[gi]

    def _next_candidates(self, rows, gi, mmask, feasible) -> None:
        """Tokens that moved (another node may now drop) and tokens that only lost because
        rejected moves of other tokens held the room."""
        g = rows.shape[0]
        if self.sync:
            infeasible = counts(torch.where(feasible, g, gi), g) > 0
            proposed = counts(gi, g) > 0
            cand = torch.zeros_like(self.cand)
            cand[rows] = proposed & ~infeasible
            self.cand = cand
        else:
            infeasible = (mmask & ~feasible).any(1)
            proposed = mmask.any(1)
            self.cand = torch.where(self.live, self.cand & (proposed & ~infeasible), self.cand)


def _proposals(node: torch.Tensor, home: torch.Tensor, N: int):
    """Per token (``node [g, k]`` of its entries, ``home [g]``): ``mv [g, k]`` the entries on the
    remote node it touches least (ties: lowest id), and its targets ``[g, k+1]`` (home, then the
    nodes it touches) with their rotation distance from home (``N`` for the vacated node)."""
    g = node.shape[0]
    # Per entry, how many of its token's entries share its node.
    token_node = arange(g, node.device)[:, None] * N + node  # [g, k]
    same = counts(token_node.reshape(-1), g * N)[token_node]
    remote = node != home[:, None]
    key = torch.where(remote, same * N + node, _NO_REMOTE)
    kmin, pick = key.min(1)
    has_remote = kmin < _NO_REMOTE
    least = node.gather(1, pick[:, None])[:, 0]
    mv = (node == least[:, None]) & has_remote[:, None]
    target_node = torch.cat([home[:, None], node], 1)  # [g, k+1]
    tok_score = torch.where(target_node != least[:, None], (target_node - home[:, None]) % N, N)
    return mv, target_node, tok_score
