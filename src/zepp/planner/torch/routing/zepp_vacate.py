"""Zepp's vacate pass in torch: ``zepp.planner.routing.zepp_vacate.vacate``, element for element.

The same rounds over the same state, every per-entry array held column by column (``[k, G]``:
entry ``j`` of every token contiguous) in int32, so a token's per-node counts are ``k(k-1)/2``
comparisons of two columns and its per-token decisions are reductions down the ``k`` rows. A
round's moves are a mask on that grid; their order in the numpy planner's lists is the grid's
token-major order (``[G, k]``), so every place counted in a replica's admission order is the
same. With ``sync`` the rounds take only the candidate tokens and list their moves in that
order (``_Moves``; a few host reads, like the numpy planner's own compactions), rank only the
moves into (out of) replicas asked more than their room, and stop as soon as the numpy
planner's would; without, the moves stay a mask on the grid, every round runs on every
token, and a device flag ``live`` turns off the rounds after the one where the numpy planner
stops. The replica-load bounds are the numpy planner's ``expert_load_bounds``; a move's target
is read off int32 node bit masks up to ``_MASK_NODES`` nodes, off the candidate nodes in turn
beyond.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I32, I64, any_of, arange, counts, select, take
from zepp.planner.torch.routing.base_routing import position_in_group
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.types import expert_load_bounds

_MASK_NODES = 31  # bits 0 .. 30 of an int32


def vacate(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float, rounds: int,
           sync: bool, slot_counts: tuple | None = None, node: torch.Tensor | None = None) -> torch.Tensor:
    """The vacate pass (``zepp.planner.routing.zepp_vacate.vacate``): ``slot [R, T, k]`` after up
    to ``rounds`` rounds; ``slot_counts`` and ``node`` as there."""
    R, T, k = ids.shape
    if dp.N < 2 or rounds < 1 or not dp.any_multi:
        return slot
    state = _Vacate(ids, slot, dp, relaxation, sync, slot_counts, node)
    for _ in range(rounds):
        if not state.round():
            break
    return state.slot.t().reshape(R, T, k)


class _Vacate:
    """The pass's state (``zepp_vacate._Vacate``), per entry ``[k, G]`` int32: ``slot``, ``node``,
    ``expert`` (0 where missing), ``several`` (bool: an entry of a several-replica expert) and,
    without ``sync``, ``mask`` (its expert's node bits, ``mask_of [E]``); ``home [G]``, ``load`` / ``lo`` / ``hi [R*S]``, ``cand [G]``
    (tokens still worth a round) and, without ``sync``, the device flag ``live``."""

    def __init__(self, ids, slot, dp: DevicePlacement, relaxation: float, sync: bool, slot_counts, node):
        R, T, k = ids.shape
        self.dp, self.sync, self.k, self.G = dp, sync, k, R * T
        dev = ids.device
        self.SL = dp.S * dp.L
        cols = lambda a: a.reshape(self.G, k).t().to(I32).contiguous()  # noqa: E731  [G*k] -> [k, G]
        expert = ids.reshape(-1)
        self.slot = cols(slot)
        self.home = (arange(self.G, dev) // (T * dp.L)).to(I32)
        if node is None:
            s = slot.reshape(-1).to(I64)
            node = torch.where(s >= 0, s // self.SL, self.home.repeat_interleave(k))
        self.node = cols(node)
        expert_cols = cols(expert)
        self.expert = expert_cols.clamp_min(0)
        self.several = take(dp.several, self.expert) & (expert_cols >= 0)
        use_mask = dp.node_mask is not None and dp.N <= _MASK_NODES
        self.mask_of = dp.node_mask.to(I32) if use_mask else None
        # without sync the masks of every entry, read each round (with sync: of the listed moves)
        self.mask = take(self.mask_of, self.expert) if use_mask and not sync else None
        self.n = R * dp.S
        if slot_counts is None:
            s = slot.reshape(-1)
            slot_counts = (counts(torch.where(s >= 0, s, self.n).to(I64), self.n),
                           *_slot_bounds(expert, dp, relaxation))
        self.load, self.lo, self.hi = (t.clone() for t in slot_counts)
        self.cand = torch.ones(self.G, dtype=torch.bool, device=dev)
        self.live = torch.ones((), dtype=torch.bool, device=dev)

    def round(self) -> bool:
        """One round; False when the numpy planner would stop here (``sync`` only)."""
        rows = None
        if self.sync:
            rows = torch.nonzero(self.cand)[:, 0]
            if rows.shape[0] == 0:
                return False
        pick = (lambda a: a) if rows is None else (lambda a: a.index_select(-1, rows))  # noqa: E731
        node, home = pick(self.node), pick(self.home)
        least, has_remote, moves = _proposals(node, home, self.dp.N)  # moves [k, g]
        if not self.sync:
            moves &= self.cand & self.live
        several = pick(self.several)
        stuck = any_of(moves & ~several, 0)  # an entry of a single-replica expert cannot move
        mv = _Moves(moves & several, rows, self.G)
        src = mv.read(self.slot)
        dst, dst_node, feasible = self._targets(mv, node, home, least, src)
        fits = feasible & self._fits(mv, dst, self.hi - self.load) & self._fits(mv, src, self.load - self.lo)
        accept = mv.valid & ~mv.of_token(stuck | mv.any_of_token(~fits))
        if self.sync:
            if not bool(any_of(accept)):
                return False
        else:
            self.live = self.live & any_of(moves) & any_of(accept)
            accept &= self.live
        self._apply(mv, accept, src, dst, dst_node)
        still = ~stuck & ~mv.any_of_token(~feasible) & has_remote
        if self.sync:
            self.cand = torch.zeros_like(self.cand)
            self.cand[rows] = still
        else:
            self.cand = self.cand & (still | ~self.live)
        return True

    def _apply(self, mv: "_Moves", accept, src, dst, dst_node) -> None:
        """The admitted moves: slots, nodes and loads."""
        n = self.n
        self.slot = mv.write(self.slot, select(accept, dst, src))
        self.node = mv.write(self.node, select(accept, dst_node, mv.read(self.node)))
        moved = lambda a: select(accept, a, n).reshape(-1)  # noqa: E731
        self.load = self.load + counts(moved(dst), n) - counts(moved(src), n)

    def _fits(self, mv: "_Moves", key: torch.Tensor, room: torch.Tensor) -> torch.Tensor:
        """``zepp_vacate._fits_in_order`` over the moves: each one's place among the earlier moves
        (token-major order) with its key is below ``room[key]``."""
        n = self.n
        if self.sync:  # listed: places counted only for keys asked more than their room, as numpy does
            tight = counts(key, n) > room.clamp_min(0)
            at = torch.nonzero(take(tight, key))[:, 0]
            ok = torch.ones_like(key, dtype=torch.bool)
            k_at = key.index_select(0, at)
            return ok.index_copy_(0, at, position_in_group(k_at, n) < take(room, k_at))
        k, g = key.shape
        pos = position_in_group(select(mv.valid, key, n).t().reshape(-1), n).reshape(g, k).t()
        return pos < take(room, key.clamp(0, n - 1))

    def _targets(self, mv: "_Moves", node, home, least, src):
        """``zepp_vacate._Vacate._targets`` on the moves: ``(dst, dst_node, feasible)``."""
        dp, N = self.dp, self.dp.N
        ron = dp.replica_on_node.reshape(-1).to(I32)
        expert = mv.read(self.expert)
        if self.mask_of is not None:
            touched = torch.zeros_like(home)
            for col in node:
                touched |= 1 << col
            mask = take(self.mask_of, expert) if self.mask is None else mv.read(self.mask)
            allowed = mask & mv.of_token((touched | (1 << home)) & ~(1 << least.clamp_min(0)))
            upper = allowed & mv.of_token(-1 << home)  # nodes home, home+1, ... come first in rotation order
            first = select(upper != 0, upper, allowed)
            there_node = _lowest_bit(first)
            feasible = allowed != 0
            there_node = there_node * feasible  # 0, a valid index, where no node is allowed
        else:
            best = torch.full_like(src, N)
            there_node = torch.zeros_like(src)
            h = mv.of_token(home)
            for col in (home, *node):  # home, then the token's nodes
                col = mv.of_token(col)
                ok = (take(ron, expert * N + col) >= 0) & (col != mv.of_token(least))
                dist = select(ok, (col - h + N) % N, N)
                better = dist < best
                best = select(better, dist, best)
                there_node = select(better, col, there_node)
            feasible = best < N
        there = take(ron, expert * N + there_node)
        return select(feasible, there, src), select(feasible, there_node, 0), feasible


class _Moves:
    """A round's moves (``mask [k, g]`` over the candidate tokens ``rows [g]`` of ``G``, all when
    ``rows`` is None): listed in token-major order where ``rows`` is given (``sync``), else the
    masked grid itself (``valid``). ``read`` takes the moves' values of a ``[k, G]`` state array,
    ``write`` puts values back, ``of_token`` gives each move its token's value of a ``[g]``
    array, ``any_of_token`` reduces per token."""

    def __init__(self, mask: torch.Tensor, rows: torch.Tensor | None, G: int):
        self.listed = rows is not None
        self.g = mask.shape[1]
        self.valid = mask
        if self.listed:
            gi, ki = torch.nonzero(mask.t()).t()  # token-major
            self.gi, self.at = gi, ki * G + rows.index_select(0, gi)
            self.valid = torch.ones_like(gi, dtype=torch.bool)

    def read(self, state: torch.Tensor) -> torch.Tensor:
        return state.reshape(-1).index_select(0, self.at) if self.listed else state

    def write(self, state: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return state.view(-1).index_copy_(0, self.at, values).view(state.shape) if self.listed else values

    def of_token(self, per_token: torch.Tensor) -> torch.Tensor:
        return per_token.index_select(0, self.gi) if self.listed else per_token

    def any_of_token(self, x: torch.Tensor) -> torch.Tensor:
        if self.listed:
            return counts(select(x, self.gi, self.g), self.g) > 0
        return any_of(x & self.valid, 0)


def _lowest_bit(x: torch.Tensor) -> torch.Tensor:
    """The index of the lowest set bit of int32 ``x > 0`` (from the exponent of ``x & -x`` as a float)."""
    return torch.frexp((x & -x).float())[1] - 1


def _slot_bounds(ids: torch.Tensor, dp: DevicePlacement, relaxation: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per global slot, its expert's replica-load bounds (``zepp.planner.types.replica_bounds``)."""
    demand = counts(torch.where(ids >= 0, ids, dp.E), dp.E)
    lo_e, hi_e = expert_load_bounds(demand, dp.count, relaxation)
    se = torch.as_tensor(dp.placement.slot_expert.reshape(-1), device=ids.device).to(I64)
    return torch.where(se >= 0, lo_e[se.clamp_min(0)], 0), torch.where(se >= 0, hi_e[se.clamp_min(0)], 0)


def _proposals(node: torch.Tensor, home: torch.Tensor, N: int):
    """``zepp_vacate._least_touched_entries`` on the grid: ``(least [g], has_remote [g], moves
    [k, g])``, the moves being the entries on each token's least-touched remote node."""
    k, g = node.shape
    big = (k + 2) * N
    count = torch.zeros(k, g, dtype=I32, device=node.device)
    for i in range(k):
        for j in range(i + 1, k):
            same = node[i] == node[j]
            count[i] += same
            count[j] += same
    key = select(node != home, count * N + node, big)
    least_key = key.amin(0)
    has_remote = least_key < big
    least = select(has_remote, least_key % N + 1, 0) - 1
    return least, has_remote, (node == least) & has_remote
