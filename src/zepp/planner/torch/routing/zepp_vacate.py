"""Zepp's vacate pass in torch: ``zepp.planner.routing.zepp_vacate.vacate``, element for element.

The same rounds over the same state (a token's entries column by column, ``node [k, G]``).
With ``sync`` the rounds compact their candidate tokens and proposed moves and stop as soon as
the numpy planner's would (a few host reads, like the numpy planner's own compactions); without,
every round runs on every token and every entry with masks: the row-major order of the masked
moves on the ``[G, k]`` grid is the order of the numpy planner's lists, so every place counted
in a replica's admission order is the same, and a device flag ``live`` turns off the rounds
after the one where the numpy planner stops. The replica-load bounds are the numpy planner's
``expert_load_bounds``; a move's target is read off node bit masks up to ``_MASK_NODES`` nodes
(int64 shifts stay within 63 bits), off the candidate nodes in turn beyond.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I64, arange, counts, select, take
from zepp.planner.torch.routing.base_routing import position_in_group
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.types import expert_load_bounds

_MASK_NODES = 31
_NODE = torch.int16  # node ids (a cluster of up to 2**15 - 1 nodes)


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
    return state.slot.reshape(R, T, k)


class _Vacate:
    """The pass's state (``zepp_vacate._Vacate``): ``expert`` and ``slot [G*k]``, ``node [k, G]``,
    ``home [G]``, ``load`` / ``lo`` / ``hi [R*S]``, ``cand [G]`` (tokens still worth a round) and,
    without ``sync``, the device flag ``live``."""

    def __init__(self, ids, slot, dp: DevicePlacement, relaxation: float, sync: bool, slot_counts, node):
        R, T, k = ids.shape
        self.dp, self.sync, self.k, self.G = dp, sync, k, R * T
        dev = ids.device
        self.SL = dp.S * dp.L
        self.expert = ids.reshape(-1)
        self.slot = slot.reshape(-1).to(I64).clone()
        self.home = (arange(self.G, dev) // (T * dp.L)).to(_NODE)
        if node is None:
            node = torch.where(self.slot >= 0, self.slot // self.SL, self.home.repeat_interleave(k))
        self.node = node.reshape(self.G, k).t().to(_NODE).contiguous()  # [k, G]
        self.n = R * dp.S
        if slot_counts is None:
            slot_counts = (counts(torch.where(self.slot >= 0, self.slot, self.n), self.n),
                           *_slot_bounds(self.expert, dp, relaxation))
        self.load, self.lo, self.hi = (t.clone() for t in slot_counts)
        self.cand = torch.ones(self.G, dtype=torch.bool, device=dev)
        self.live = torch.ones((), dtype=torch.bool, device=dev)

    def round(self) -> bool:
        """One round; False when the numpy planner would stop here (``sync`` only)."""
        k = self.k
        rows = torch.nonzero(self.cand)[:, 0] if self.sync else arange(self.G, self.cand.device)
        g = rows.shape[0]
        if self.sync and g == 0:
            return False
        node = self.node if g == self.G else self.node[:, rows]
        home = self.home[rows]
        least, has_remote, grid = _proposals(node, home, self.dp.N)  # grid [g, k]: the moves
        if not self.sync:
            grid &= self.cand[:, None] & self.live
        if self.sync:
            gi, ki = torch.nonzero(grid).t()  # row-major: token order
            if gi.numel() == 0:
                return False
            mask = torch.ones_like(gi, dtype=torch.bool)
        else:
            flat = arange(g * k, grid.device)
            gi, ki, mask = flat // k, flat % k, grid.reshape(-1)
        at = rows[gi] * k + ki  # the moves' entries
        e_mv = take(self.expert, at).clamp_min(0)
        single = mask & ~take(self.dp.several, e_mv)
        stuck = counts(select(single, gi, g), g) > 0
        mask2 = mask & ~single
        src = take(self.slot, at)
        dst, feasible = self._targets(e_mv, node, gi, take(home, gi), take(least, gi), src)
        fits = feasible & self._fits(dst, self.hi - self.load, mask2) & self._fits(src, self.load - self.lo, mask2)
        rejected = stuck | (counts(select(mask2 & ~fits, gi, g), g) > 0)
        accept = mask2 & ~take(rejected, gi)
        if self.sync:
            if not bool(accept.any()):
                return False
        else:
            self.live = self.live & mask.any() & accept.any()
            accept = accept & self.live
        self._apply(at, accept, dst, src)
        still = ~stuck & (counts(select(mask2 & ~feasible, gi, g), g) == 0) & has_remote
        if self.sync:
            self.cand = torch.zeros_like(self.cand)
            self.cand[rows] = still
        else:
            self.cand = self.cand & (still | ~self.live)
        return True

    def _apply(self, at, accept, dst, src) -> None:
        """The admitted moves: slots, nodes and loads."""
        self.slot[at] = select(accept, dst, take(self.slot, at))
        ki, tok = at % self.k, at // self.k
        self.node[ki, tok] = select(accept, dst // self.SL, self.node[ki, tok]).to(_NODE)
        n = self.n
        self.load = self.load + counts(select(accept, dst, n), n) - counts(select(accept, src, n), n)

    def _fits(self, key: torch.Tensor, room: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``zepp_vacate._fits_in_order`` over the moves in ``mask``: each one's place among the
        earlier masked moves with its key is below ``room[key]``."""
        n = self.n
        keyed = select(mask, key, n)
        if self.sync:  # places counted only for keys asked more than their room, as numpy does
            tight = counts(keyed, n) > room.clamp_min(0)
            at = torch.nonzero(mask & tight[key.clamp(0, n - 1)])[:, 0]
            ok = torch.ones_like(mask)
            ok[at] = position_in_group(key[at], n) < room[key[at]]
            return ok
        return position_in_group(keyed, n) < take(room, key.clamp(0, n - 1))

    def _targets(self, e_mv, node, gi, home, least, src) -> tuple[torch.Tensor, torch.Tensor]:
        """``zepp_vacate._Vacate._targets``: ``(dst [m], feasible [m])``."""
        dp, N = self.dp, self.dp.N
        ron = dp.replica_on_node.reshape(-1)
        home, least = home.to(I64), least.to(I64)
        if dp.node_mask is not None and N <= _MASK_NODES:
            one = torch.ones((), dtype=I64, device=node.device)
            touched = torch.zeros(node.shape[1], dtype=I64, device=node.device)
            for col in node:
                touched |= one << col.to(I64)
            allowed = (take(touched, gi) | (one << home)) & ~(one << least) & take(dp.node_mask, e_mv)
            rotated = ((allowed >> home) | (allowed << (N - home))) & ((1 << N) - 1)
            step = torch.frexp((rotated & -rotated).double())[1].to(I64) - 1  # the lowest set bit
            there = take(ron, e_mv * N + (home + step.clamp_min(0)) % N)
            feasible = allowed != 0
        else:
            best = torch.full_like(e_mv, N)
            there = src
            for col in (home, *(take(c, gi).to(I64) for c in node)):  # home, then the token's nodes
                rep = take(ron, e_mv * N + col)
                dist = select((rep >= 0) & (col != least), (col - home) % N, N)
                better = dist < best
                best = select(better, dist, best)
                there = select(better, rep, there)
            feasible = best < N
        return select(feasible, there, src), feasible


def _slot_bounds(ids: torch.Tensor, dp: DevicePlacement, relaxation: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per global slot, its expert's replica-load bounds (``zepp.planner.types.replica_bounds``)."""
    demand = counts(torch.where(ids >= 0, ids, dp.E), dp.E)
    lo_e, hi_e = expert_load_bounds(demand, dp.count, relaxation)
    se = torch.as_tensor(dp.placement.slot_expert.reshape(-1), device=ids.device).to(I64)
    return torch.where(se >= 0, lo_e[se.clamp_min(0)], 0), torch.where(se >= 0, hi_e[se.clamp_min(0)], 0)


def _proposals(node: torch.Tensor, home: torch.Tensor, N: int):
    """``zepp_vacate._least_touched_entries`` on a grid: ``(least [g], has_remote [g], moves [g, k])``,
    the moves being the entries on each token's least-touched remote node."""
    k, g = node.shape
    big = (k + 2) * N
    dtype = torch.int16 if big < 1 << 15 else torch.int32
    count = torch.zeros(k, g, dtype=dtype, device=node.device)
    for i in range(k):
        for j in range(i + 1, k):
            same = node[i] == node[j]
            count[i] += same
            count[j] += same
    key = select(node != home, count * N + node, big)
    least_key = key.min(0).values
    has_remote = least_key < big
    least = select(has_remote, least_key % N, -1).to(node.dtype)
    return least, has_remote, (node == least).t() & has_remote[:, None]
