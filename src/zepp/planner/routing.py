"""Routing: which replica serves each entry of a batch.

The model's expert choices never change; routing only picks, per entry, one slot holding a
replica of the entry's expert. Choices:

- ``home``: replica 0 of the expert (its first slot); with a home placement, the only one.
- ``replica-rr``: an expert's entries, in batch order, go to its replicas in turn, so every
  replica gets ``floor`` or ``ceil`` of ``D_e / c_e`` (EPLB / vLLM style).
- ``locality``: SGLang's static dispatch: a fixed replica per source GPU, preferring one on the
  source GPU, then one on its node, else any: among the candidates of the best level, the
  ``(source rank mod count)``-th in replica order.
- ``fixed``: EPIC's choice: all of a source's entries of expert ``e`` go to replica
  ``source rank mod c_e`` (no locality preference).
- ``dynamic``: SGLang's dynamic dispatch: per entry, a replica on the source GPU, else one on
  the source's node, else any replica; among several candidates one is picked by an integer
  hash of (source rank, token, entry), so every rank computes the same choice.
- ``random``: vLLM's pseudo-random replica choice per entry (the same integer hash).
- ``zepp``: rotation water-fill under relaxed replica-load bounds, then the vacate pass that
  cuts the number of distinct remote nodes per token (PAPER.md section 2.2).
- ``moonep``: MoonEP's per-batch balance (``zepp.planner.moonep``): the routing comes with its own
  placement, the given home placement plus ``E/R`` prefetch slots per GPU.

Names and one-line meanings: ``zepp.registry.ROUTINGS``. An id of ``-1`` is a missing entry
(padding); it gets slot ``-1`` and counts for no load. All choices are vectorised numpy over
entries; loops run over ranks, replicas or rounds only. Integer arithmetic throughout, so every
rank computes the same routing bit for bit.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.types import PlanInvariantError, Placement, Routing, relaxation_fraction
from zepp.registry import ROUTINGS

ROUTING_NAMES = tuple(ROUTINGS)


def route(name: str, topk_ids: np.ndarray, placement: Placement, relaxation: float = 0.25,
          vacate_rounds: int = 3) -> Routing:
    """Route a batch ``topk_ids [R, T, k]`` onto ``placement`` with routing choice ``name``.

    ``relaxation`` (C) only matters for ``zepp``; its Routing carries C so ``validate()`` checks
    the replica-load bounds ``[floor((1-C) q), ceil((1+C) q)]``.
    """
    if name not in ROUTINGS:
        raise ZeppInputError(f"unknown routing {name!r}; choose one of {', '.join(ROUTING_NAMES)}")
    topk_ids = check_batch(topk_ids, placement)
    missing = topk_ids < 0
    if name == "moonep":
        from zepp.planner.moonep import moonep_plan

        if missing.any():
            raise ZeppInputError("routing 'moonep' does not take missing entries (-1 ids)")
        return moonep_plan(topk_ids, placement.num_experts, placement.gpus_per_node)[0]
    if name == "home":
        slot = placement.replicas[topk_ids, 0]
    elif name == "replica-rr":
        slot = _replica_round_robin(topk_ids, placement)
    elif name == "locality":
        slot = _choice(topk_ids, placement, prefer_local=True, per_source=True)
    elif name == "fixed":
        slot = _choice(topk_ids, placement, prefer_local=False, per_source=True)
    elif name in ("dynamic", "random"):
        slot = _choice(topk_ids, placement, prefer_local=name == "dynamic", per_source=False)
    else:
        slot = _water_fill(topk_ids, placement, relaxation)
        slot = _vacate(topk_ids, slot, placement, relaxation, vacate_rounds)
    slot = np.where(missing, -1, slot).astype(np.int32)
    return Routing(topk_ids, slot, placement, relaxation=relaxation if name == "zepp" else None)


def check_batch(topk_ids: np.ndarray, placement: Placement) -> np.ndarray:
    """Check a batch ``[R, T, k]`` against a placement; return it as int32."""
    arr = np.asarray(topk_ids)
    if arr.ndim != 3:
        raise ZeppInputError(f"batch topk_ids must be [ranks, tokens, k], got shape {arr.shape}")
    if arr.shape[0] != placement.ranks:
        raise ZeppInputError(f"batch has {arr.shape[0]} ranks but the placement has {placement.ranks}")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < -1 or arr.max() >= placement.num_experts):
        bad = np.argwhere((arr < -1) | (arr >= placement.num_experts))[0]
        raise ZeppInputError(
            f"batch entry (rank {bad[0]}, token {bad[1]}, choice {bad[2]}) has expert id "
            f"{arr[tuple(bad)]}, outside [0, {placement.num_experts}) (-1 marks a missing entry); check --experts"
        )
    return arr.astype(np.int32, copy=False)


def position_in_group(key: np.ndarray, num_keys: int) -> np.ndarray:
    """For each element, how many earlier elements (in array order) share its key. ``[n]``.

    ``key`` holds group ids in ``[0, num_keys)``; for up to 2**16 groups the stable sort is a
    radix sort, so this is linear in ``n``."""
    key = np.asarray(key)
    dtype = np.uint16 if num_keys <= 1 << 16 else np.int64
    order = np.argsort(key.astype(dtype), kind="stable")
    counts = np.bincount(key, minlength=num_keys)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pos = np.empty(key.shape[0], dtype=np.int64)
    pos[order] = np.arange(key.shape[0]) - starts[key[order]]
    return pos


def _replica_round_robin(topk_ids: np.ndarray, placement: Placement) -> np.ndarray:
    flat = topk_ids.ravel()
    key = np.where(flat >= 0, flat, placement.num_experts)  # missing entries: a group of their own
    pos = position_in_group(key, placement.num_experts + 1)
    e = np.maximum(flat, 0)
    idx = pos % placement.replica_count[e]
    return placement.replicas[e, idx].reshape(topk_ids.shape).astype(np.int32)


_HASH_MUL, _HASH_ADD, _HASH_MOD = 1103515245, 12345, 1 << 31


def entry_hash(index: np.ndarray) -> np.ndarray:
    """A fixed integer hash of entry indices (``[n]`` int64 -> ``[n]`` int64 in ``[0, 2**31)``):
    two rounds of a linear congruential step with a xor-shift, all products below 2**62, so a
    torch or numpy port gives the same values on any device."""
    x = np.asarray(index, np.int64) % _HASH_MOD
    for _ in range(2):
        x = (x * _HASH_MUL + _HASH_ADD) % _HASH_MOD
        x ^= x >> 16
    return x


def _choice(topk_ids: np.ndarray, placement: Placement, prefer_local: bool, per_source: bool) -> np.ndarray:
    """One replica per entry among candidates: all replicas, or (``prefer_local``) those on the
    source GPU if any, else on its node if any, else all (SGLang's preference). The pick among
    the candidates, in replica order: ``source rank mod count`` (``per_source``: a fixed replica
    per source GPU) or ``entry_hash mod count`` (a pseudo-random one per entry)."""
    R, T, k = topk_ids.shape
    e = np.maximum(topk_ids.reshape(-1), 0).astype(np.int64)
    src = np.arange(e.size, dtype=np.int64) // (T * k)
    if per_source:  # the pick depends on (source, expert) only: choose once per pair, then look up
        E = placement.num_experts
        pair_src, pair_e = np.divmod(np.arange(R * E, dtype=np.int64), E)
        table = _pick(pair_e, pair_src, pair_src, placement, prefer_local)
        return table[src * E + e].reshape(R, T, k).astype(np.int32)
    h = entry_hash(np.arange(e.size, dtype=np.int64))
    return _pick(e, src, h, placement, prefer_local).reshape(R, T, k).astype(np.int32)


def _pick(e: np.ndarray, src: np.ndarray, h: np.ndarray, placement: Placement, prefer_local: bool) -> np.ndarray:
    """``_choice``'s pick for entries of expert ``e [n]`` from rank ``src [n]`` with hash ``h [n]``:
    their global slots ``[n]``."""
    reps = placement.replicas[e]  # [n, cmax] global slots, -1 padded
    valid = reps >= 0
    if prefer_local:
        S, L = placement.slots_per_rank, placement.gpus_per_node
        rr = np.where(valid, reps // S, -1)
        level = np.where(rr == src[:, None], 0, np.where(rr // L == (src // L)[:, None], 1, 2))
        level = np.where(valid, level, 3)
        valid = level == level.min(axis=1, keepdims=True)
    cnt = valid.sum(axis=1)
    pick = h % cnt  # the pick-th candidate, in replica order
    nth = np.cumsum(valid, axis=1) - 1
    col = np.argmax(valid & (nth == pick[:, None]), axis=1)
    return reps[np.arange(e.size), col]


def _visit_priority(placement: Placement) -> np.ndarray:
    """``[R, R]`` rotation order of destination rank q for source rank r (0 = visited first):
    own GPU, then the other GPUs of the node, then remote nodes in rotation (n+1, n+2, ...),
    inside a node by local index rotated from the source's."""
    ranks, L = placement.ranks, placement.gpus_per_node
    nodes = ranks // L
    r = np.arange(ranks)[:, None]
    q = np.arange(ranks)[None, :]
    node_step = (q // L - r // L) % nodes
    local_step = (q % L - r % L) % L
    return node_step * L + local_step


def _water_fill(topk_ids: np.ndarray, placement: Placement, relaxation: float) -> np.ndarray:
    """Rotation water-fill. Returns ``slot [R, T, k]``.

    Per expert with several replicas, every source rank visits the replicas in its rotation order
    (own GPU, the other GPUs of its node, then remote nodes in rotation) and at each visit assigns
    as much of its remaining demand as the replica's upper bound allows, while keeping enough
    unassigned demand to lift every replica to its lower bound. All sources take their ``v``-th
    visit together (a step), and where several reach one replica in a step, lower ranks are served
    first (prefix sums); so a plan is a few vectorised steps over ``[R, M, C]`` arrays, not a loop
    over ranks, and maps onto a GPU as a handful of kernels.

    Invariant kept by every step: unassigned demand >= the summed lower-bound deficits, and no
    replica exceeds its upper bound. Each sweep over the ``C`` visit steps places demand while any
    remains (a deficit is always reachable), so the sweeps end with everything placed.
    """
    ranks, S = placement.ranks, placement.slots_per_rank
    E = placement.num_experts
    demand = _rank_demand(topk_ids, E)  # [R, E]
    count = placement.replica_count.astype(np.int64)
    slot = placement.replicas[np.maximum(topk_ids, 0), 0].astype(np.int32)  # experts with one replica: done

    multi = np.flatnonzero(count > 1)
    if multi.size == 0:
        return slot
    num, den = relaxation_fraction(relaxation)
    remaining = demand[:, multi]  # [R, M]
    total = remaining.sum(0)
    c = count[multi]
    upper = -((-(den + num) * total) // (den * c))
    lower = np.maximum(0, (den - num) * total // (den * c))
    reps = placement.replicas[multi]  # [M, C] global slots, -1 padded
    M, cmax = reps.shape
    valid = reps >= 0
    big = np.iinfo(np.int64).max // 4
    priority = np.where(valid[None], _visit_priority(placement)[:, np.where(valid, reps // S, 0)], big)
    visit = np.argsort(priority, axis=2, kind="stable")  # [R, M, C] replica index of each visit

    load = np.zeros((M, cmax), np.int64)
    unassigned = total.copy()
    assigned = np.zeros((ranks, M, cmax), np.int64)
    experts = np.arange(M)[None, :]
    for _ in range(4 * cmax + 4):  # sweeps; each one places demand while any remains
        if not remaining.any():
            break
        for v in range(cmax):
            if not remaining.any():
                break
            target = visit[:, :, v]  # [R, M]
            want = np.where(valid[experts, target], remaining, 0)
            held = load[experts, target]
            deficit = np.where(valid, np.maximum(lower[:, None] - load, 0), 0)  # [M, C]
            # Upper bound: sources reaching one replica are served in rank order.
            rank_order = _RankOrder(target)
            take = np.minimum(want, np.maximum(upper[None, :] - held - rank_order.before(want), 0))
            # Filling a lower-bound deficit is always allowed; the rest spends the expert's slack
            # (unassigned - deficits), again in rank order.
            to_deficit = np.clip(deficit[experts, target] - rank_order.before(take), 0, take)
            surplus = take - to_deficit
            slack = unassigned - deficit.sum(1)
            take = to_deficit + np.clip(slack[None, :] - (np.cumsum(surplus, axis=0) - surplus), 0, surplus)
            step = np.zeros((ranks, M, cmax), np.int64)
            np.put_along_axis(step, target[:, :, None], take[:, :, None], axis=2)
            assigned += step
            load += step.sum(0)
            remaining -= take
            unassigned -= take.sum(0)
    if remaining.any():  # cannot happen while the bounds are consistent; kept as a proof point
        r, m = np.argwhere(remaining)[0]
        raise PlanInvariantError(f"water-fill left demand of expert {multi[m]} on rank {r} unplaced")

    # Entries of (rank r, expert e), in batch order, fill r's assignments in replica order: sorted
    # by group (a stable radix sort), the replica indices are each group's counts laid end to end.
    flat = topk_ids.reshape(ranks, -1)
    multi_index = np.full(E + 1, -1, np.int64)  # index E: missing entries (id -1)
    multi_index[multi] = np.arange(multi.size)
    where = np.flatnonzero(multi_index[flat.ravel()] >= 0)
    rr, pos_in_rank = where // flat.shape[1], where % flat.shape[1]
    mi = multi_index[flat.ravel()[where]]
    groups = ranks * multi.size
    group = rr * multi.size + mi
    order = np.argsort(group.astype(np.uint16) if groups <= 1 << 16 else group, kind="stable")
    rep_idx = np.empty(group.size, np.int64)
    rep_idx[order] = np.repeat(np.tile(np.arange(cmax), groups), assigned.reshape(-1))
    out = slot.reshape(ranks, -1)
    out[rr, pos_in_rank] = reps[mi, rep_idx]
    return out.reshape(topk_ids.shape)


class _RankOrder:
    """Per expert, the sources of a step grouped by the replica they reach, in rank order.

    ``target [R, M]``: replica index each source reaches for each expert. ``before(amount)``
    gives, per (rank, expert), the sum of ``amount [R, M]`` over lower ranks that reach the same
    replica of the same expert (an exclusive segmented prefix sum down each expert's column).
    """

    def __init__(self, target: np.ndarray):
        self.order = np.argsort(target, axis=0, kind="stable")  # [R, M], grouped by replica, ranks ascending
        grouped = np.take_along_axis(target, self.order, axis=0)
        first = np.ones(target.shape, bool)
        first[1:] = grouped[1:] != grouped[:-1]
        rows = np.arange(target.shape[0])[:, None]
        self.start = np.maximum.accumulate(np.where(first, rows, 0), axis=0)  # row where each group starts

    def before(self, amount: np.ndarray) -> np.ndarray:
        grouped = np.take_along_axis(amount, self.order, axis=0)
        exclusive = np.cumsum(grouped, axis=0) - grouped
        exclusive -= np.take_along_axis(exclusive, self.start, axis=0)
        out = np.empty_like(exclusive)
        np.put_along_axis(out, self.order, exclusive, axis=0)
        return out


def _vacate(topk_ids: np.ndarray, slot: np.ndarray, placement: Placement, relaxation: float,
            rounds: int) -> np.ndarray:
    """Per token, move every entry bound for the remote node the token touches least onto
    replicas on nodes the token already touches (home node first), when the replica bounds
    allow. A move of a token is all-or-nothing: it only pays if the node drops out entirely.

    Rounds are vectorised: every token proposes its move; moves are admitted in token order while
    the target replica stays under its upper bound and the source above its lower bound; a token
    whose moves are not all admitted keeps its routing (its reserved room stays unused that round).
    """
    ranks, T, k = topk_ids.shape
    S, L = placement.slots_per_rank, placement.gpus_per_node
    N = ranks // L
    E = placement.num_experts
    if N < 2 or rounds < 1 or not (placement.replica_count > 1).any():
        return slot
    num, den = relaxation_fraction(relaxation)
    ids = topk_ids.ravel()
    demand = np.bincount(ids[ids >= 0], minlength=E).astype(np.int64)
    c = placement.replica_count.astype(np.int64)
    upper_e = -((-(den + num) * demand) // (den * c))
    lower_e = np.maximum(0, (den - num) * demand // (den * c))

    # replica_on_node[e, n]: a slot of e on node n, or -1 (the lowest one if several).
    reps = placement.replicas
    rep_node = np.where(reps >= 0, reps // S // L, N)
    replica_on_node = np.full((E, N + 1), -1, np.int32)
    ee = np.repeat(np.arange(E), reps.shape[1])
    order = np.argsort(-reps.ravel(), kind="stable")  # highest slot first, so the lowest wins
    replica_on_node[ee[order], rep_node.ravel()[order]] = reps.ravel()[order]
    replica_on_node = replica_on_node[:, :N]

    expert = topk_ids.reshape(-1, k)  # [G, k], G = R * T tokens
    G = expert.shape[0]
    home = ((np.arange(G) // T) // L).astype(np.int16)  # [G] owner node of each token
    present = expert >= 0
    # a missing entry sits on its token's home node: never remote, never moved
    slot = np.where(present, slot.reshape(-1, k), (home[:, None].astype(np.int64) * L) * S).astype(np.int64)
    load = np.bincount(slot[present], minlength=placement.slot_expert.size).astype(np.int64)
    candidates = np.flatnonzero(((placement.replica_count > 1)[np.maximum(expert, 0)] & present).any(1))
    big32 = np.iinfo(np.int32).max
    for _ in range(rounds):
        if candidates.size == 0:
            break
        g = candidates.size
        sl = slot[candidates]
        node = (sl // (S * L)).astype(np.int16)  # [g, k]
        g_home = home[candidates]
        # Per entry, how many of its token's entries share its node.
        token_node = (np.arange(g, dtype=np.int64)[:, None] * N + node).ravel()
        count = np.bincount(token_node, minlength=g * N)[token_node].reshape(g, k)
        # The least-touched remote node (ties: lowest node id) and the entries on it.
        remote = node != g_home[:, None]
        key = np.where(remote, count * N + node, big32)
        pick = key.argmin(1)
        has_remote = key[np.arange(g), pick] < big32
        least = node[np.arange(g), pick]
        gi, ki = np.nonzero((node == least[:, None]) & has_remote[:, None])
        if gi.size == 0:
            break
        # Where each could go instead: a replica on the home node or on another node the token
        # touches, nearest to home in rotation order.
        e_mv = expert[candidates[gi], ki]
        target_node = np.empty((gi.size, k + 1), np.int16)  # [m, k+1]: home, then the token's nodes
        target_node[:, 0] = g_home[gi]
        target_node[:, 1:] = node[gi]
        there = replica_on_node[e_mv[:, None], target_node]
        rotation = target_node - target_node[:, :1]
        rotation += N * (rotation < 0)
        score = np.where((there >= 0) & (target_node != least[gi, None]), rotation, N)
        best = score.argmin(1)
        feasible = score[np.arange(gi.size), best] < N
        src = sl[gi, ki].astype(np.int64)
        dst = there[np.arange(gi.size), best].astype(np.int64)
        dst = np.where(feasible, dst, src)
        room_in = upper_e[e_mv] - load[dst]
        room_out = load[src] - lower_e[e_mv]
        n_slots = load.size
        fits = feasible & (position_in_group(dst, n_slots) < room_in) & (position_in_group(src, n_slots) < room_out)
        # A token moves only if all its entries on that node can move.
        accept = np.bincount(gi[~fits], minlength=g)[gi] == 0
        if not accept.any():
            break
        gsel, ksel = candidates[gi[accept]], ki[accept]
        slot[gsel, ksel] = dst[accept]
        np.add.at(load, dst[accept], 1)
        np.subtract.at(load, src[accept], 1)
        # Next round: tokens that moved (another node may now drop) and tokens that only lost
        # because rejected moves of other tokens held the room.
        still = np.bincount(gi[~feasible], minlength=g) == 0
        candidates = candidates[np.flatnonzero(still & (np.bincount(gi, minlength=g) > 0))]
    return np.where(present, slot, -1).reshape(ranks, T, k).astype(np.int32)


def _rank_demand(topk_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Entries per (rank, expert), missing entries left out: ``[R, T, k]`` -> ``[R, E]`` int64."""
    r = topk_ids.shape[0]
    key = (np.arange(r, dtype=np.int64)[:, None, None] * (num_experts + 1) + np.where(topk_ids >= 0, topk_ids,
                                                                                    num_experts)).ravel()
    return np.bincount(key, minlength=r * (num_experts + 1)).reshape(r, num_experts + 1)[:, :num_experts]
