"""Zepp's vacate pass in torch: ``zepp.planner.routing.zepp_vacate.vacate``, element for element.

The same rounds over the same state, every per-entry array held column by column (``[k, G]``:
entry ``j`` of every token contiguous), the nodes in the narrowest integer type (int8 column
comparisons are several times faster than int32 ones on the CPU), so a token's per-node counts
are ``k(k-1)/2`` comparisons of two columns and its per-token decisions are reductions down the
``k`` rows. A round's moves are *listed* in the numpy planner's order (token-major), so every
place counted in a replica's admission order is the same; the per-move work (targets,
admission, the writes) runs on the list, not on the grid.

How the lists are made (``_Lists``):

- ``sync``: exactly, as numpy does (``nonzero``: a host read of their length); the candidate
  tokens likewise; the rounds stop as soon as the numpy planner's would.
- ``sync=False``: fixed-capacity lists (a prefix sum and a scatter, no host read), padded past
  their length with a spare index; a device flag ``live`` turns off the rounds after the one where
  the numpy planner stops. Capacities:

  - ``bounded=False`` (the default bound, ``sweeps=None``): every token, ``k`` moves per token:
    nothing can be left out;
  - ``bounded=True`` (``sweeps`` given: the short, capturable form): the first round lists up to
    ``G`` moves (one per token), the second up to ``G / 2`` candidate tokens and as many moves,
    later ones ``G / 3`` (``_TOKEN_SHARES``; at least ``_MIN_CAPACITY``). On the recorded traces
    (K2 and Qwen3, 4 to 32 nodes x 4 GPUs, 1 to 64 MB per GPU) the rounds list at most 0.91, 0.41
    and 0.26 moves per token and keep at most 0.42 and 0.25 of the tokens as candidates (K2 at
    16 x 4: 0.49, 0.15, 0.08 moves; 0.23 and 0.10 of the tokens).
    A round that had more sets ``overflow`` (a device flag in the routing): the plan is then not
    the numpy planner's, ``TorchRouting.to_numpy`` raises ``IncompletePlan`` and
    ``plan_batch(..., host=True)`` re-plans with the default bound, like the water-fill's
    ``unplaced``.

The replica-load bounds are the numpy planner's ``expert_load_bounds``; a move's target is read
off int32 node bit masks up to ``_MASK_NODES`` nodes, off the candidate nodes in turn beyond.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I32, I64, any_of, arange, counts, list_token_major, list_true, select, take
from zepp.planner.torch.routing.base_routing import position_in_group
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.types import expert_load_bounds

_MASK_NODES = 31  # bits 0 .. 30 of an int32
_TOKEN_SHARES = (1, 2, 3)  # bounded lists: round i keeps up to G / _TOKEN_SHARES[i] candidate tokens (the last
# share for every later round) and as many moves (the first round: G moves)
_MIN_CAPACITY = 1024  # bounded lists are never shorter than this (small batches are never cut)


def vacate(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float, rounds: int,
           sync: bool, slot_counts: tuple | None = None, node: torch.Tensor | None = None,
           bounded: bool = False, expert: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The vacate pass (``zepp.planner.routing.zepp_vacate.vacate``) of the batch ``ids [R, T, k]``:
    ``(slot [k, G] int32 after up to ``rounds`` rounds, overflow)``, the slots column by column
    as they come in (``slot [k, G]``, ``-1`` where missing); ``slot_counts`` and ``node [k, G]``
    as there; ``expert``: ``ids`` column by column where the caller has it; ``bounded``: the
    short fixed-capacity lists (``sync=False`` only, module docstring) whose ``overflow`` (0-d
    bool; ``None`` where nothing can overflow) says the lists were too short."""
    R, T, k = ids.shape
    if dp.N < 2 or rounds < 1 or not dp.any_multi:
        return slot, None
    if expert is None:
        expert = ids.reshape(R * T, k).t()
    state = _Vacate(ids, slot, dp, relaxation, sync, slot_counts, node, bounded and not sync, expert)
    for i in range(rounds):
        if not state.round(i):
            break
    return state.slot[:-1].view(k, R * T), state.overflow


class _Vacate:
    """The pass's state (``zepp_vacate._Vacate``): per entry, flat ``[k*G + 1]`` (``[k, G]`` column
    by column, then a spare cell the padded list entries write to) ``slot`` int32, ``node`` (the
    narrowest type), ``expert`` int32 (the id + 1: 0 where missing, the first row of the tables
    ``mask_of [E+1]`` and ``ron [(E+1)*N]``, the placement's with a row for no expert in front);
    ``several [k, G]`` bool (an entry of a several-replica expert); ``home [G]``; ``load`` /
    ``lo`` / ``hi [R*S]``; ``cand [G]`` (tokens still worth a round); and without ``sync`` the
    device flags ``live`` (the numpy planner has not stopped) and ``overflow`` (a bounded list
    was too short)."""

    def __init__(self, ids, slot, dp: DevicePlacement, relaxation: float, sync: bool, slot_counts, node,
                 bounded: bool, expert: torch.Tensor):
        R, T, k = ids.shape
        self.dp, self.sync, self.k, self.G, self.T = dp, sync, k, R * T, T
        dev = ids.device
        self.ndtype = torch.int8 if dp.N < 1 << 7 else torch.int16 if dp.N < 1 << 15 else I32
        self.lists = _Lists(self.G, k, sync, bounded)
        self.home = (arange(self.G, dev) // (T * dp.L)).to(self.ndtype)
        if node is None:
            s = slot.to(I64)
            node = torch.where(s >= 0, s // (dp.S * dp.L), self.home.to(I64)[None, :])
        self.slot = _columns(slot, I32)
        self.node = _columns(node, self.ndtype)
        self.expert = _columns(expert, I32).add_(1)  # 0 where missing: the tables' first row
        self.several = take(torch.cat([dp.several.new_zeros(1), dp.several]), self.expert[:-1]).view(k, self.G)
        self.mask_of = None
        if dp.node_mask is not None and dp.N <= _MASK_NODES:
            self.mask_of = torch.cat([dp.node_mask.new_zeros(1), dp.node_mask]).to(I32)
        self.ron = torch.cat([dp.replica_on_node.new_full((1, dp.N), -1), dp.replica_on_node]).reshape(-1).to(I32)
        self.n = R * dp.S
        if slot_counts is None:
            s = slot.reshape(-1)
            slot_counts = (counts(torch.where(s >= 0, s, self.n).to(I64), self.n),
                           *_slot_bounds(ids.reshape(-1), dp, relaxation))
        self.load, self.lo, self.hi = (t.clone() for t in slot_counts)
        self.cand = torch.ones(self.G, dtype=torch.bool, device=dev)
        self.live = torch.ones((), dtype=torch.bool, device=dev)
        self.overflow = torch.zeros((), dtype=torch.bool, device=dev) if self.lists.can_overflow else None

    def grid(self, flat: torch.Tensor) -> torch.Tensor:
        """The ``[k, G]`` view of a flat per-entry array (without its spare cell)."""
        return flat[:-1].view(self.k, self.G)

    def round(self, i: int) -> bool:
        """Round ``i``; False when the numpy planner would stop here (``sync`` only)."""
        live = self.live
        rows = self.lists.tokens(self.cand, i)
        if rows is not None and rows.empty:
            return False
        every = (lambda a: a) if rows is None else rows.pick  # noqa: E731
        node, home = every(self.grid(self.node)), every(self.home)
        least, has_remote, moves = _proposals(node, home, self.dp.N)  # moves [k, g]
        if not self.sync:
            moves &= (self.cand if rows is None else rows.valid) & live
        several = every(self.several)
        stuck = any_of(moves & ~several, 0)  # an entry of a single-replica expert cannot move
        mv = self.lists.moves(moves & several, rows, i)
        src = mv.read(self.slot)
        dst, dst_node, feasible = self._targets(mv, node, home, least, src)
        fits = feasible & self._fits(mv, dst, self.hi - self.load) & self._fits(mv, src, self.load - self.lo)
        accept = ~mv.of_token(stuck | mv.any_of_token(~fits))
        if mv.valid is not None:
            accept &= mv.valid
        if self.sync:
            if not bool(any_of(accept)):
                return False
        else:
            self.live = self.live & any_of(moves) & any_of(accept)
            accept &= self.live
            for flag in (rows, mv):
                if flag is not None and flag.overflow is not None:
                    self.overflow |= flag.overflow & live
        self._apply(mv, accept, src, dst, dst_node)
        still = ~stuck & ~mv.any_of_token(~feasible) & has_remote
        self.cand = self.cand & still if rows is None else rows.put(still)
        return True

    def _apply(self, mv: "_Moves", accept, src, dst, dst_node) -> None:
        """The admitted moves: slots, nodes and loads."""
        n = self.n
        mv.write(self.slot, select(accept, dst, src))
        mv.write(self.node, select(accept, dst_node.to(self.ndtype), mv.read(self.node)))
        moved = lambda a: select(accept, a, n)  # noqa: E731
        self.load = self.load + counts(moved(dst), n) - counts(moved(src), n)

    def _fits(self, mv: "_Moves", key: torch.Tensor, room: torch.Tensor) -> torch.Tensor:
        """``zepp_vacate._fits_in_order`` over the listed moves: each one's place among the
        earlier moves with its key is below ``room[key]`` (places counted only for keys asked more
        than their room where the list is exact, as numpy does; for every move of a fixed list)."""
        n = self.n
        if mv.valid is None:
            tight = counts(key, n) > room.clamp_min(0)
            at = torch.nonzero(take(tight, key))[:, 0]
            ok = torch.ones_like(key, dtype=torch.bool)
            k_at = key.index_select(0, at)
            return ok.index_copy_(0, at, position_in_group(k_at, n) < take(room, k_at))
        key = select(mv.valid, key, n)
        return position_in_group(key, n) < take(room, key.clamp_max(n - 1))

    def _targets(self, mv: "_Moves", node, home, least, src):
        """``zepp_vacate._Vacate._targets`` on the moves: ``(dst, dst_node, feasible)``."""
        N, ron = self.dp.N, self.ron
        expert = mv.read(self.expert)  # expert + 1: the tables' rows
        if self.mask_of is not None:
            touched = torch.zeros(home.shape, dtype=I32, device=home.device)
            for col in node:
                touched |= 1 << col.to(I32)
            m_home, m_least = mv.of_token(home).to(I32), mv.of_token(least).to(I32)
            allowed = take(self.mask_of, expert) & (mv.of_token(touched) | (1 << m_home)) & ~(1 << m_least.clamp_min(0))
            upper = allowed & (-1 << m_home)  # nodes home, home+1, ... come first in rotation order
            first = select(upper != 0, upper, allowed)
            feasible = allowed != 0
            there_node = _lowest_bit(first) * feasible  # 0, a valid index, where no node is allowed
        else:
            best = torch.full_like(src, N)
            there_node = torch.zeros_like(src)
            h = mv.of_token(home).to(I32)
            m_least = mv.of_token(least).to(I32)
            for col in (home, *node):  # home, then the token's nodes
                col = mv.of_token(col).to(I32)
                ok = (take(ron, expert * N + col) >= 0) & (col != m_least)
                dist = select(ok, (col - h + N) % N, N)
                better = dist < best
                best = select(better, dist, best)
                there_node = select(better, col, there_node)
            feasible = best < N
        there = take(ron, expert * N + there_node)
        return select(feasible, there, src), select(feasible, there_node, 0), feasible


def _columns(a: torch.Tensor, dtype) -> torch.Tensor:
    """``a [k, G]`` flat ``[k*G + 1]`` of ``dtype`` (the last cell a spare, 0)."""
    out = torch.zeros(a.numel() + 1, dtype=dtype, device=a.device)
    out[:-1].view(a.shape).copy_(a)
    return out


class _Lists:
    """How a round lists its candidate tokens and moves (module docstring): exactly (``sync``),
    or in fixed-capacity lists (``bounded``: short ones that can overflow; else long enough for
    everything)."""

    def __init__(self, G: int, k: int, sync: bool, bounded: bool):
        self.G, self.k, self.sync, self.bounded = G, k, sync, bounded
        self.can_overflow = bounded and not sync
        # list indices in int32 where they fit (their arithmetic is several times faster on the CPU)
        self.index = I32 if k * G + 1 < 1 << 31 else I64
        shares = _TOKEN_SHARES if bounded else (1,)
        self.token_caps = [min(G, max(G // share, _MIN_CAPACITY)) for share in shares]

    def tokens(self, cand: torch.Tensor, i: int) -> "_Rows | None":
        """Round ``i``'s candidate tokens: ``None`` for every token (the first round, or when the
        capacity holds them all), else a ``_Rows``."""
        cap = self.token_cap(i)
        if i == 0 or (not self.sync and cap >= self.G):
            return None
        if self.sync:
            return _Rows(torch.nonzero(cand)[:, 0].to(self.index), None, self.G, self.k)
        at, total = list_true(cand, cap)
        return _Rows(at.to(self.index), total > cap, self.G, self.k)

    def token_cap(self, i: int) -> int:
        return self.token_caps[min(i, len(self.token_caps) - 1)]

    def moves(self, mask: torch.Tensor, rows: "_Rows | None", i: int) -> "_Moves":
        """The moves of ``mask [k, g]`` (over ``rows``, every token when ``None``) listed."""
        k, g = mask.shape
        if self.sync:
            gi, ki = torch.nonzero(mask.t()).t().to(self.index)  # token-major
            return _Moves(gi, ki, rows, self.G, k * self.G, None, None)
        cap = k * g
        if self.bounded:
            cap = min(cap, self.token_cap(i))
        code, total = list_token_major(mask, cap)
        code = code.to(self.index)
        valid = arange(cap, mask.device) < total
        gi, ki = code % g, code // g  # the spare k*g: token 0, row k (its cell is the spare)
        return _Moves(gi, ki, rows, self.G, k * self.G, valid, total > cap if cap < k * g else None)


class _Rows:
    """A round's candidate tokens: ``at [g]`` indices into ``G`` (``G`` past the list's end where
    it is fixed-size: ``valid [g]``), ``overflow`` (0-d bool, or ``None``). ``pick`` takes their
    values of a ``[G]`` or ``[k, G]`` array (the latter by one gather from the flat array: an
    ``index_select`` along dim 1 is several times slower on the CPU), ``put`` writes per-token
    values back into a fresh ``[G]`` array (False elsewhere)."""

    def __init__(self, at: torch.Tensor, overflow: torch.Tensor | None, G: int, k: int):
        self.at_or_spare, self.overflow, self.G = at, overflow, G
        self.valid = at < G
        self.at = at.clamp_max(G - 1) if overflow is not None else at
        self.empty = at.shape[0] == 0
        self.cells = (self.at[None, :] + (torch.arange(k, dtype=at.dtype, device=at.device) * G)[:, None]).reshape(-1)

    def pick(self, a: torch.Tensor) -> torch.Tensor:
        if a.dim() == 1:
            return a.index_select(0, self.at)
        return a.reshape(-1).index_select(0, self.cells).view(a.shape[0], -1)

    def put(self, per_token: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.G + 1, dtype=per_token.dtype, device=per_token.device)
        return out.index_copy_(0, self.at_or_spare.to(I64), per_token)[:self.G]


class _Moves:
    """A round's moves listed in token-major order: ``gi [m]`` (the move's token among the
    round's ``g``), ``at [m]`` (its cell in the flat per-entry arrays; the spare ``k*G`` past a
    fixed list's end), ``valid [m]`` (``None`` for an exact list), ``overflow``. ``read`` takes
    the moves' values of a flat per-entry array, ``write`` puts values back, ``of_token`` gives
    each move its token's value of a ``[g]`` array, ``any_of_token`` reduces per token."""

    def __init__(self, gi, ki, rows: _Rows | None, G: int, spare: int, valid, overflow):
        self.gi, self.valid, self.overflow = gi, valid, overflow
        self.g = G if rows is None else rows.at.shape[0]
        token = gi if rows is None else rows.at.index_select(0, gi)
        self.at = ki * G + token
        if valid is not None:
            self.at = select(valid, self.at, spare)
        self.at_long = None  # ``at`` as int64, for index_copy_

    def read(self, state: torch.Tensor) -> torch.Tensor:
        return state.index_select(0, self.at)

    def write(self, state: torch.Tensor, values: torch.Tensor) -> None:
        if self.at_long is None:
            self.at_long = self.at.to(I64)
        state.index_copy_(0, self.at_long, values)

    def of_token(self, per_token: torch.Tensor) -> torch.Tensor:
        return per_token.index_select(0, self.gi)

    def any_of_token(self, x: torch.Tensor) -> torch.Tensor:
        if self.valid is not None:
            x = x & self.valid
        return counts(select(x, self.gi, self.g), self.g) > 0


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
    """``zepp_vacate._least_touched_entries`` on the grid (``node [k, g]`` and ``home [g]`` in the
    same narrow type): ``(least [g], has_remote [g], moves [k, g])``, the moves being the entries
    on each token's least-touched remote node. Per entry, the other entries of its token on its
    node (``k(k-1)/2`` column comparisons), then one key ``count * N + node`` (a home entry:
    ``k * N``, never the least) whose minimum is the least-touched node (ties: lowest id)."""
    k, g = node.shape
    big = k * N
    kdtype = torch.uint8 if big < 1 << 8 else torch.int16 if big < 1 << 15 else I32
    count = torch.zeros(k, g, dtype=kdtype, device=node.device)
    for i in range(k):
        for j in range(i + 1, k):
            same = (node[i] == node[j]).view(torch.uint8) if kdtype == torch.uint8 else node[i] == node[j]
            count[i] += same
            count[j] += same
    key = select(node != home, count * N + node.to(kdtype), big)
    least_key = key.amin(0)
    has_remote = least_key < big
    least = select(has_remote, (least_key % N).to(node.dtype) + 1, 0) - 1
    return least, has_remote, (node == least) & has_remote
