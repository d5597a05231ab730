"""Routing in torch: the numpy planner's routing choices (``zepp.planner.routing``), element for element.

Every function takes ``topk_ids [R, T, k]`` as an integer tensor on any device and returns
``slot [R, T, k]`` int32 on the same device, equal to ``zepp.planner.routing.route``'s. An id of ``-1``
is a missing entry (slot ``-1``, no load).

What runs where:

- Per placement, once (``DevicePlacement``): the placement's static tables (replica lists,
  visit orders, replicas per node) are built with numpy on the host and copied
  to the device; a placement changes between batches only after swaps.
- Per batch, on the device: everything else, as tensor operations of fixed shapes with integer
  arithmetic. Loop trip counts depend only on the placement and the shapes: the water-fill runs
  ``(4 C + 4)`` sweeps of ``C`` visit steps (``C`` = most replicas of any expert; the numpy
  planner's bound), the vacate pass ``vacate_rounds`` rounds.

``sync`` chooses whether the planner may read a value back to the host:

- ``sync=False`` (the default while a CUDA graph is being captured): no host read at all, so the routing can be
  captured in a CUDA graph for a fixed batch shape. The water-fill runs its full fixed number of
  steps; steps after the demand is placed take nothing (proved: ``take <= remaining = 0``), and
  a vacate round after the numpy planner would have stopped is masked off by a device flag, so
  the result is the same as the numpy planner's early-exiting loops.
- ``sync=True`` (the default, except while a CUDA graph is being captured): the same loops stop
  as soon as the numpy planner's would (nothing left to place, no vacate move left; a few host
  reads, free on the CPU and a few tens of microseconds each on a GPU, much less than the
  kernel launches of the steps they skip), the vacate pass compacts its candidates like the
  numpy planner, and the batch is checked like ``zepp.planner.routing.check_batch`` (ids in ``[-1, E)``).
"""

from __future__ import annotations

import numpy as np
import torch

from zepp.errors import ZeppInputError
from zepp.planner.types import Placement, relaxation_fraction
from zepp.registry import ROUTINGS
from zepp.planner.torch._ops import I64, arange, counts, position_in_group, sort_order
from zepp.planner.torch.tables import TorchRouting

TORCH_ROUTINGS = ("home", "replica-rr", "locality", "fixed", "dynamic", "random", "zepp")
_HASH_MUL, _HASH_ADD, _HASH_MOD = 1103515245, 12345, 1 << 31


class DevicePlacement:
    """A placement's static tables on ``device`` (built once per placement and device).

    ``replicas [E, C]`` int64 global slots (-1 padded), ``count [E]``, and for the water-fill the experts
    with several replicas ``multi [M]``, ``multi_index [E+1]`` (-1 elsewhere and for id -1),
    ``visit_flat [R, M, C]`` (flat index ``m*C + replica`` of each source's v-th visit) and
    ``valid_multi [M, C]``; for the vacate pass ``replica_on_node [E, N]`` (the lowest slot of e
    on node n, else -1).
    """

    def __init__(self, placement: Placement, device):
        p = placement
        self.placement = p
        self.device = torch.device(device)
        R, S = p.slot_expert.shape
        L = p.gpus_per_node
        N = R // L
        E = p.num_experts
        self.R, self.S, self.L, self.N, self.E = R, S, L, N, E
        reps = p.replicas.astype(np.int64)
        self.C = reps.shape[1]
        t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=I64, device=self.device)  # noqa: E731
        self.replicas = t(reps)
        self.count = t(p.replica_count)
        multi = np.flatnonzero(p.replica_count > 1)
        self.M = multi.size
        self.multi = t(multi)
        mi = np.full(E + 1, -1, np.int64)
        mi[multi] = np.arange(multi.size)
        self.multi_index = t(mi)
        rm = reps[multi]  # [M, C]
        valid = rm >= 0
        self.reps_multi = t(rm)
        self.valid_multi = torch.as_tensor(valid, device=self.device)
        # Visit order (the numpy planner's _visit_priority, then a stable argsort per (r, m)).
        rr = np.arange(R)[:, None]
        q = np.arange(R)[None, :]
        prio = ((q // L - rr // L) % N) * L + (q % L - rr % L) % L  # [R, R]
        big = np.iinfo(np.int64).max // 4
        priority = np.where(valid[None], prio[:, np.where(valid, rm // S, 0)], big)  # [R, M, C]
        visit = np.argsort(priority, axis=2, kind="stable")
        self.visit_flat = t(np.arange(multi.size)[None, :, None] * self.C + visit)
        # replica_on_node[e, n]: the lowest slot of e on node n, or -1.
        rep_node = np.where(reps >= 0, reps // S // L, N)
        ron = np.full((E, N + 1), -1, np.int64)
        ee = np.repeat(np.arange(E), reps.shape[1])
        order = np.argsort(-reps.ravel(), kind="stable")
        ron[ee[order], rep_node.ravel()[order]] = reps.ravel()[order]
        self.replica_on_node = t(ron[:, :N])
        self.any_multi = bool(multi.size)


_CACHE: dict[tuple[int, str], DevicePlacement] = {}


def device_placement(placement: Placement, device) -> DevicePlacement:
    """The cached ``DevicePlacement`` of ``placement`` on ``device`` (8 kept)."""
    key = (id(placement), str(torch.device(device)))
    dp = _CACHE.get(key)
    if dp is None or dp.placement is not placement:
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        dp = _CACHE[key] = DevicePlacement(placement, device)
    return dp


def default_sync(t: torch.Tensor) -> bool:
    """Host reads are allowed unless a CUDA graph is being captured on the current stream."""
    return not (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def check_batch(topk_ids: torch.Tensor, placement: Placement, read_values: bool) -> torch.Tensor:
    """Check ``topk_ids [R, T, k]`` (shape and dtype always; values in ``[-1, E)`` only when
    ``read_values``, which reads the data on the host). Returns it as int64."""
    if not isinstance(topk_ids, torch.Tensor):
        raise ZeppInputError(f"the torch planner takes a torch tensor, got {type(topk_ids).__name__}")
    if topk_ids.dim() != 3:
        raise ZeppInputError(f"batch topk_ids must be [ranks, tokens, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[0] != placement.ranks:
        raise ZeppInputError(f"batch has {topk_ids.shape[0]} ranks but the placement has {placement.ranks}")
    if topk_ids.dtype == torch.bool or topk_ids.is_floating_point() or topk_ids.is_complex():
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {topk_ids.dtype}")
    ids = topk_ids.to(I64)
    if read_values and ids.numel():
        bad = (ids < -1) | (ids >= placement.num_experts)
        if bool(bad.any()):
            r, t, j = (int(v) for v in torch.nonzero(bad)[0])
            raise ZeppInputError(
                f"batch entry (rank {r}, token {t}, choice {j}) has expert id {int(ids[r, t, j])}, outside "
                f"[0, {placement.num_experts}) (-1 marks a missing entry); check --experts")
    return ids


def route(name: str, topk_ids: torch.Tensor, placement: Placement, relaxation: float = 0.25,
          vacate_rounds: int = 3, *, sync: bool | None = None, sweeps: int | None = None) -> TorchRouting:
    """Route ``topk_ids [R, T, k]`` (integer tensor, any device) with routing ``name``;
    ``slot [R, T, k]`` int32 on the same device equals ``zepp.planner.routing.route(name, ...)``'s.

    ``sync``: see the module docstring (default: True, except while a CUDA graph is being
    captured on the current stream). ``sweeps``: water-fill sweeps to run without host reads
    (default and maximum: the numpy planner's bound ``4C+4``). Every recorded batch we tried
    needs one; with fewer than the bound, check ``unplaced`` (a device scalar, 0 when complete)
    and re-plan with the default when it is not 0 (``plan_batch`` does).
    """
    if name not in ROUTINGS:
        raise ZeppInputError(f"unknown routing {name!r}; choose one of {', '.join(ROUTINGS)}")
    if name not in TORCH_ROUTINGS:
        raise ZeppInputError(f"routing {name!r} has no torch planner; the torch planner has "
                             f"{', '.join(TORCH_ROUTINGS)} (use the numpy planner)")
    sync = default_sync(topk_ids) if sync is None else bool(sync)
    ids = check_batch(topk_ids, placement, read_values=sync)
    dp = device_placement(placement, ids.device)
    missing = ids < 0
    e = ids.clamp_min(0)
    unplaced = None
    if name == "home":
        slot = dp.replicas[e, 0]
    elif name == "replica-rr":
        slot = _replica_round_robin(ids, dp)
    elif name == "locality":
        slot = _choice(e, dp, prefer_local=True, per_source=True)
    elif name == "fixed":
        slot = _choice(e, dp, prefer_local=False, per_source=True)
    elif name in ("dynamic", "random"):
        slot = _choice(e, dp, prefer_local=name == "dynamic", per_source=False)
    else:
        slot, unplaced = _water_fill(ids, dp, relaxation, sync, sweeps)
        slot = _vacate(ids, slot, dp, relaxation, vacate_rounds, sync)
    slot = torch.where(missing, -1, slot).to(torch.int32)
    return TorchRouting(ids.to(torch.int32), slot, placement, relaxation if name == "zepp" else None, unplaced)


# ------------------------------------------------------------------------------------ simple choices


def _replica_round_robin(ids: torch.Tensor, dp: DevicePlacement) -> torch.Tensor:
    flat = ids.reshape(-1)
    key = torch.where(flat >= 0, flat, dp.E)
    pos = position_in_group(key, dp.E + 1)
    e = flat.clamp_min(0)
    idx = pos % dp.count[e]
    return dp.replicas[e, idx].reshape(ids.shape)


def entry_hash(index: torch.Tensor) -> torch.Tensor:
    """``zepp.planner.routing.entry_hash`` in torch: ``[n]`` int64 -> ``[n]`` int64 in ``[0, 2**31)``."""
    x = index.to(I64) % _HASH_MOD
    for _ in range(2):
        x = (x * _HASH_MUL + _HASH_ADD) % _HASH_MOD
        x = x ^ (x >> 16)
    return x


def _choice(e: torch.Tensor, dp: DevicePlacement, prefer_local: bool, per_source: bool) -> torch.Tensor:
    """``zepp.planner.routing._choice``: candidates (all replicas, or the nearest level), the pick
    ``source rank mod count`` (``per_source``) or ``entry_hash mod count``."""
    R, T, k = e.shape
    ef = e.reshape(-1)
    n = ef.shape[0]
    src = arange(n, e.device) // (T * k)
    h = src if per_source else entry_hash(arange(n, e.device))
    reps = dp.replicas[ef]  # [n, C]
    valid = reps >= 0
    if prefer_local:
        rr = torch.where(valid, reps // dp.S, -1)
        level = torch.where(rr == src[:, None], 0, torch.where(rr // dp.L == (src // dp.L)[:, None], 1, 2))
        level = torch.where(valid, level, 3)
        valid = level == level.min(dim=1, keepdim=True).values
    cnt = valid.sum(dim=1)
    pick = h % cnt
    nth = torch.cumsum(valid.to(I64), dim=1) - 1
    col = (valid & (nth == pick[:, None])).to(torch.int8).argmax(dim=1)
    return reps.gather(1, col[:, None]).reshape(R, T, k)


# ------------------------------------------------------------------------------------ water-fill


def _rank_demand(ids: torch.Tensor, E: int) -> torch.Tensor:
    """``[R, E]`` int64 entries per (rank, expert), missing entries left out."""
    R = ids.shape[0]
    key = arange(R, ids.device)[:, None, None] * (E + 1) + torch.where(ids >= 0, ids, E)
    return counts(key.reshape(-1), R * (E + 1)).reshape(R, E + 1)[:, :E]


def _water_fill(ids: torch.Tensor, dp: DevicePlacement, relaxation: float, sync: bool, sweeps: int | None = None):
    """Rotation water-fill (``zepp.planner.routing._water_fill``). Returns ``(slot [R, T, k] int64,
    unplaced 0-d int64)``. ``(4C+4) * C`` fixed visit steps over ``[R, M]`` tensors; the
    segmented prefix sums of the numpy planner (sources reaching one replica, in rank order) are
    exclusive cumulative sums down the rank axis of a ``[R, M*C]`` scatter of the amounts."""
    R, dev = ids.shape[0], ids.device
    slot = dp.replicas[ids.clamp_min(0), 0]
    if dp.M == 0:
        return slot, torch.zeros((), dtype=I64, device=dev)
    M, C = dp.M, dp.C
    num, den = relaxation_fraction(relaxation)
    remaining = _rank_demand(ids, dp.E)[:, dp.multi]  # [R, M]
    total = remaining.sum(0)
    c = dp.count[dp.multi]
    upper = -((-(den + num) * total) // (den * c))
    lower = ((den - num) * total // (den * c)).clamp_min(0)
    valid = dp.valid_multi.reshape(-1)  # [M*C]
    lower_flat = lower[:, None].expand(M, C).reshape(-1)  # [M*C]
    upper_rm = upper[None, :]
    load = torch.zeros(M * C, dtype=I64, device=dev)
    unassigned = total.clone()
    assigned = torch.zeros(R, M * C, dtype=I64, device=dev)
    scratch = torch.zeros(R, M * C, dtype=I64, device=dev)

    def before(amount, tf):
        """Per (r, m): sum of ``amount`` over lower ranks reaching the same replica this step."""
        scratch.zero_()
        scratch.scatter_(1, tf, amount)
        return (torch.cumsum(scratch, 0) - scratch).gather(1, tf)

    bound = 4 * C + 4
    for _ in range(bound if sweeps is None else max(0, min(int(sweeps), bound))):
        if sync and not bool(remaining.any()):
            break
        for v in range(C):
            if sync and not bool(remaining.any()):
                break
            tf = dp.visit_flat[:, :, v]  # [R, M] flat replica index of this visit
            want = torch.where(valid[tf], remaining, 0)
            held = load[tf]
            deficit = torch.where(valid, (lower_flat - load).clamp_min(0), 0)  # [M*C]
            take = torch.minimum(want, (upper_rm - held - before(want, tf)).clamp_min(0))
            to_deficit = torch.minimum((deficit[tf] - before(take, tf)).clamp_min(0), take)
            surplus = take - to_deficit
            slack = unassigned - deficit.reshape(M, C).sum(1)
            spent = torch.cumsum(surplus, 0) - surplus
            take = to_deficit + torch.minimum((slack[None, :] - spent).clamp_min(0), surplus)
            assigned.scatter_add_(1, tf, take)
            load.scatter_add_(0, tf.reshape(-1), take.reshape(-1))
            remaining = remaining - take
            unassigned = unassigned - take.sum(0)
    unplaced = remaining.sum()
    if sync and sweeps is None and int(unplaced):
        r, m = (int(v) for v in torch.nonzero(remaining)[0])
        raise AssertionError(f"water-fill left demand of expert {int(dp.multi[m])} on rank {r} unplaced")

    # Entries of (rank r, expert m), in batch order, fill r's assignments in replica order.
    flat = ids.reshape(R, -1)
    mi = dp.multi_index[torch.where(flat >= 0, flat, dp.E)]  # [R, T*k]
    is_multi = mi >= 0
    group = torch.where(is_multi, arange(R, dev)[:, None] * M + mi, R * M).reshape(-1)
    order = sort_order(group, R * M)
    # The assignments laid end to end (the numpy planner's np.repeat), padded by one group for
    # the entries of single-replica experts (sorted last) so the output size is static.
    n = group.shape[0]
    reps_ext = torch.cat([assigned.reshape(-1), (n - assigned.sum()).reshape(1)])
    which = torch.cat([arange(R * M * C, dev) % C, torch.zeros(1, dtype=I64, device=dev)])
    rep_sorted = torch.repeat_interleave(which, reps_ext, output_size=n)
    rep_idx = torch.empty_like(rep_sorted)
    rep_idx[order] = rep_sorted
    mslot = dp.reps_multi[mi.clamp_min(0).reshape(-1), rep_idx]
    out = torch.where(is_multi.reshape(-1), mslot, slot.reshape(-1))
    return out.reshape(ids.shape), unplaced


# ------------------------------------------------------------------------------------ vacate pass


def _vacate(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float, rounds: int,
            sync: bool) -> torch.Tensor:
    """The vacate pass (``zepp.planner.routing._vacate``).

    The numpy planner compacts its candidate tokens and their proposed moves each round and
    stops early. With ``sync`` this does the same (``nonzero`` on the host). Without, every round
    runs on all ``G = R*T`` tokens and all ``G*k`` entries with masks: the row-major order of the
    masked entries is the order of the numpy planner's compacted lists, so the admission order
    (every ``position_in_group``) is the same, and a device flag ``live`` turns off every round
    after the one where the numpy planner would have stopped.
    """
    R, T, k = ids.shape
    S, L, N, E = dp.S, dp.L, dp.N, dp.E
    if N < 2 or rounds < 1 or not dp.any_multi:
        return slot
    dev = ids.device
    G = R * T
    num, den = relaxation_fraction(relaxation)
    demand = counts(torch.where(ids >= 0, ids, E).reshape(-1), E)
    upper_e = -((-(den + num) * demand) // (den * dp.count))
    lower_e = ((den - num) * demand // (den * dp.count)).clamp_min(0)
    expert = ids.reshape(G, k)
    present = expert >= 0
    e0 = expert.clamp_min(0)
    home = arange(G, dev) // T // L  # [G]
    slot = torch.where(present, slot.reshape(G, k), (home * L * S)[:, None])
    n_slots = R * S
    load = counts(torch.where(present, slot, n_slots).reshape(-1), n_slots)
    cand = ((dp.count[e0] > 1) & present).any(1)  # [G]
    live = torch.ones((), dtype=torch.bool, device=dev)
    ron = dp.replica_on_node.reshape(-1)
    big = np.iinfo(np.int32).max
    all_rows = arange(G, dev)
    for _ in range(rounds):
        if sync:
            rows = torch.nonzero(cand)[:, 0]
            if rows.numel() == 0:
                break
        else:
            rows = all_rows
        g = rows.shape[0]
        sl = slot[rows]  # [g, k]
        hm = home[rows]
        node = sl // (S * L)
        # Per entry, how many of its token's entries share its node.
        token_node = arange(g, dev)[:, None] * N + node  # [g, k]
        same = counts(token_node.reshape(-1), g * N)[token_node]
        remote = node != hm[:, None]
        key = torch.where(remote, same * N + node, big)
        kmin, pick = key.min(1)
        has_remote = kmin < big
        least = node.gather(1, pick[:, None])[:, 0]
        mv = (node == least[:, None]) & has_remote[:, None]
        # Per token: targets (home, then the nodes the token touches) scored by rotation distance
        # from home; the least-touched node itself is no target.
        target_node = torch.cat([hm[:, None], node], 1)  # [g, k+1]
        tok_score = torch.where(target_node != least[:, None], (target_node - hm[:, None]) % N, N)
        if sync:  # the proposals as a compact list [m], like the numpy planner's
            gi, ki = torch.nonzero(mv, as_tuple=True)
            if gi.numel() == 0:
                break
            mmask = torch.ones_like(gi, dtype=torch.bool)
            e_mv, src = e0[rows[gi], ki], sl[gi, ki]
            t_node, t_score = target_node[gi], tok_score[gi]  # [m, k+1]
        else:  # the proposals as a mask on the grid [G, k]
            mmask = mv & cand[:, None] & live
            gi = all_rows[:, None].expand(G, k)
            e_mv, src = e0, sl
            t_node, t_score = target_node[:, None, :], tok_score[:, None, :]  # [G, 1, k+1]
        m_any = mmask.any()
        # Where each could go instead: a replica on a target node, nearest to home in rotation.
        there = ron[e_mv[..., None] * N + t_node]  # [m, k+1] or [G, k, k+1]
        smin, best = torch.where(there >= 0, t_score, N).min(-1)
        feasible = smin < N
        dst = torch.where(feasible, there.gather(-1, best[..., None])[..., 0], src)
        room_in = upper_e[e_mv] - load[dst]
        room_out = load[src] - lower_e[e_mv]
        pos_in = position_in_group(torch.where(mmask, dst, n_slots).reshape(-1), n_slots).reshape(dst.shape)
        pos_out = position_in_group(torch.where(mmask, src, n_slots).reshape(-1), n_slots).reshape(dst.shape)
        fits = feasible & (pos_in < room_in) & (pos_out < room_out)
        # A token moves only if all its entries on that node can move.
        if sync:
            rejected = counts(torch.where(fits, g, gi), g) > 0
        else:
            rejected = (mmask & ~fits).any(1)
        accept = mmask & ~rejected[gi]
        if sync:
            if not bool(accept.any()):
                break
            slot[rows[gi], ki] = torch.where(accept, dst, src)
        else:
            live = live & m_any & accept.any()
            accept = accept & live
            slot = torch.where(accept, dst, slot)
        load = load + counts(torch.where(accept, dst, n_slots).reshape(-1), n_slots) \
            - counts(torch.where(accept, src, n_slots).reshape(-1), n_slots)
        # Next round: tokens that moved (another node may now drop) and tokens that only lost
        # because rejected moves of other tokens held the room.
        if sync:
            infeasible = counts(torch.where(feasible, g, gi), g) > 0
            proposed = counts(gi, g) > 0
        else:
            infeasible = (mmask & ~feasible).any(1)
            proposed = mmask.any(1)
        new_cand = proposed & ~infeasible
        if sync:
            cand = torch.zeros_like(cand)
            cand[rows] = new_cand
        else:
            cand = torch.where(live, cand & new_cand, cand)
    return torch.where(present, slot, -1).reshape(R, T, k)
