"""Expert placement: which logical expert each slot holds, computed once from history.

Every function here returns a ``Placement`` (``slot_expert [R, S]``, see ``zepp.planner.types``) built
from a per-node demand histogram ``hist [N, E]`` (entries node ``n`` asked of expert ``e`` in
a past window). Ranks are node-major (node = rank // L). ``S = E/R + extra`` slots per rank
for the replicating placements, ``S = E/R`` for ``home``.

Placements:

- ``home``: expert ``e`` on rank ``e // (E/R)``, no replicas.
- ``zepp``: PAPER.md section 2.1 (``place_zepp``).
- ``eplb``: DeepSeek EPLB, global policy, on the summed history (``place_eplb``); its own
  ``rebalance_experts`` is re-implemented here from the published rules (PAPER.md section 6).
- ``eplb-distinct``: EPLB's replica counts and greedy packing, but never two replicas of one
  expert on one GPU (``place_eplb_distinct``).
- ``epic``: greedy redundancy, then GPUs, then node positions balancing NIC load
  (``place_epic``).

All replica-count and node decisions are exact: loads per replica ``l / c`` are compared as
integers scaled by ``M = lcm(1..c_max)`` (Python ints, no overflow), so every rank computes
the same placement. EPLB and its variants use float32 loads, because EPLB does.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import torch

from zepp.errors import ZeppInputError
from zepp.planner.types import Placement

PLACEMENTS = ("home", "zepp", "eplb", "eplb-distinct", "epic")


# --------------------------------------------------------------------------- input checks


def _check_divisible(num_experts: int, ranks: int) -> int:
    """Experts per rank ``E / R``; raises when ``R`` does not divide ``E``."""
    if ranks <= 0:
        raise ZeppInputError(f"ranks must be >= 1, got {ranks}")
    if num_experts <= 0:
        raise ZeppInputError(f"num_experts must be >= 1, got {num_experts}")
    if num_experts % ranks:
        raise ZeppInputError(
            f"{num_experts} experts cannot be spread evenly over {ranks} GPUs ({num_experts} % {ranks} = "
            f"{num_experts % ranks}); choose a GPU count (nodes x gpus_per_node) that divides {num_experts}, "
            f"or override the expert count (--experts)"
        )
    return num_experts // ranks


def _check_hist(hist, gpus_per_node: int, ranks: int | None = None, num_experts: int | None = None) -> np.ndarray:
    """Validate a history histogram; returns it as ``int64 [N, E]``."""
    if not isinstance(gpus_per_node, (int, np.integer)) or gpus_per_node < 1:
        raise ZeppInputError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    h = np.asarray(hist)
    if h.ndim != 2:
        raise ZeppInputError(
            f"hist must be a 2-D [nodes, experts] demand histogram, got shape {h.shape}; "
            f"build it with zepp.traces.sampling.node_demand"
        )
    if h.shape[0] < 1 or h.shape[1] < 1:
        raise ZeppInputError(f"hist must have at least one node row and one expert column, got shape {h.shape}")
    if h.dtype == bool or not (np.issubdtype(h.dtype, np.integer) or np.issubdtype(h.dtype, np.floating)):
        raise ZeppInputError(f"hist must hold integer entry counts, got dtype {h.dtype}")
    if np.issubdtype(h.dtype, np.floating):
        if not np.all(np.isfinite(h)) or np.any(h != np.round(h)):
            raise ZeppInputError("hist must hold whole entry counts; found a fractional or non-finite value")
    if h.min() < 0:
        n, e = np.argwhere(h < 0)[0]
        raise ZeppInputError(f"hist[{n}, {e}] = {h[n, e]} is negative; entry counts must be >= 0")
    if ranks is not None and h.shape[0] * gpus_per_node != ranks:
        raise ZeppInputError(
            f"hist has {h.shape[0]} node rows but ranks={ranks} with gpus_per_node={gpus_per_node} means "
            f"{ranks / gpus_per_node:g} nodes; give one history row per node"
        )
    if num_experts is not None and h.shape[1] != num_experts:
        raise ZeppInputError(
            f"hist has {h.shape[1]} expert columns but num_experts={num_experts}; the histogram must have "
            f"one column per expert"
        )
    return h.astype(np.int64)


def _check_extra(extra: int) -> int:
    if not isinstance(extra, (int, np.integer)) or isinstance(extra, bool) or extra < 0:
        raise ZeppInputError(f"extra (redundant slots per GPU) must be an integer >= 0, got {extra!r}")
    return int(extra)


# --------------------------------------------------------------------------- home


def place_home(num_experts: int, ranks: int, gpus_per_node: int) -> Placement:
    """Static contiguous homing: expert ``e`` on rank ``e // (E/R)``, ``S = E/R``, no replicas."""
    per = _check_divisible(num_experts, ranks)
    if gpus_per_node < 1 or ranks % gpus_per_node:
        raise ZeppInputError(f"ranks={ranks} is not a multiple of gpus_per_node={gpus_per_node}")
    return Placement(np.arange(num_experts, dtype=np.int32).reshape(ranks, per), num_experts, gpus_per_node)


# --------------------------------------------------------------------------- zepp


def _scale(cap: int) -> int:
    """``M = lcm(1..cap)``: ``l * (M // c)`` orders loads per replica exactly for ``c <= cap``."""
    return math.lcm(*range(1, max(cap, 1) + 1))


def _zepp_counts(load: list[int], spare: int, cap: int, m: int) -> list[int]:
    """Replica counts: every expert starts at 1; each of ``spare`` slots goes to the expert with
    the largest ``load / count`` (ties: lower id) whose count is below ``cap``."""
    counts = [1] * len(load)
    heap = [(-(l * m), e) for e, l in enumerate(load) if cap > 1]
    heapq.heapify(heap)
    for _ in range(spare):
        if not heap:
            break
        _, e = heapq.heappop(heap)
        counts[e] += 1
        if counts[e] < cap:
            heapq.heappush(heap, (-(load[e] * (m // counts[e])), e))
    return counts


def place_zepp(hist, gpus_per_node: int, extra: int = 2) -> Placement:
    """Zepp's history-driven placement (PAPER.md section 2.1).

    ``hist [N, E]`` int: entries node ``n`` requested of expert ``e`` over the history window.
    Returns a placement over ``R = N * gpus_per_node`` ranks with ``S = E/R + extra`` slots.

    Steps (``l_e`` = total history load, ``c_e`` = replica count, share = ``l_e / c_e``):

    1. Counts: every expert starts at one replica; each of the ``R*S - E`` spare slots goes to
       the expert with the largest ``l_e / c_e`` (ties: lower id), never more than one
       replica per node (``c_e <= N``).
    2. Nodes: experts in descending share (ties: lower id); each copy goes to the node that
       requested the expert most (``hist[n, e]``) among nodes with a free slot not holding it
       yet; ties: lower accumulated node load, then lower node id.
    3. Leftover slots: while some node has a free slot that some expert is missing from, the
       expert with the highest *current* share among those gets one more replica, placed by
       the node rule of step 2.
    4. GPUs: each node's replicas, in descending share (ties: lower id), are dealt snake-wise
       to its GPUs (0..L-1, L-1..0, ...); the i-th dealt replica of a GPU sits in local slot i.

    Choices where the paper is silent (written down here):

    - "Accumulated node load" = sum of the shares (``l_e / c_e`` with the planned count) of the
      replicas already placed on the node.
    - A copy that finds no eligible node (every node with a free slot already holds the
      expert; possible only late in the order) is dropped; step 3 then reuses the slot.
    - Step 3 picks experts by current share (counts after the drops and earlier fills), so
      it continues the step-1 greedy under the one-replica-per-node cap.
    - Shares in step 4 use the final counts. Slots no expert can fill (a single node, or
      every expert already on every node) stay empty (``-1``) and are dealt last.
    - A zero history gives all shares 0: ties then go to lower ids throughout, so the
      result is still deterministic (spare replicas go to experts 0, 1, ...).

    All comparisons are exact: shares are the integers ``l_e * (M // c_e)``, ``M = lcm(1..N)``.
    """
    h = _check_hist(hist, gpus_per_node)
    extra = _check_extra(extra)
    n_nodes, e_num = h.shape
    per = _check_divisible(e_num, n_nodes * int(gpus_per_node))
    return zepp_slots(h, int(gpus_per_node), per + extra)


def zepp_slots(h: np.ndarray, gpus_per_node: int, slots_per_gpu: int) -> Placement:
    """``place_zepp``'s rules with ``slots_per_gpu`` slots per GPU on a checked ``h [N, E]``
    int64 (``E`` need not be a multiple of the GPU count, as for engines that count redundant
    experts in total); slots no expert can fill without a second copy on one node stay ``-1``."""
    n_nodes, e_num = h.shape
    L = int(gpus_per_node)
    R = n_nodes * L
    S = int(slots_per_gpu)
    if R * S < e_num:
        raise ZeppInputError(f"{R} GPUs x {S} slots cannot hold {e_num} experts")
    node_slots = L * S
    load = [int(x) for x in h.sum(axis=0)]
    m = _scale(n_nodes)
    planned = _zepp_counts(load, R * S - e_num, n_nodes, m)

    share = [load[e] * (m // planned[e]) for e in range(e_num)]
    order = sorted(range(e_num), key=lambda e: (-share[e], e))
    free = [node_slots] * n_nodes
    node_load = [0] * n_nodes
    on_node = np.zeros((n_nodes, e_num), dtype=bool)
    counts = [0] * e_num
    hist_rows = h.T.tolist()  # [E][N] python ints

    def best_node(e: int, add: int) -> int | None:
        best, best_key = None, None
        req = hist_rows[e]
        for n in range(n_nodes):
            if free[n] and not on_node[n, e]:
                key = (-req[n], node_load[n], n)
                if best_key is None or key < best_key:
                    best, best_key = n, key
        if best is not None:
            free[best] -= 1
            node_load[best] += add
            on_node[best, e] = True
            counts[e] += 1
        return best

    for e in order:
        for _ in range(planned[e]):
            if best_node(e, share[e]) is None:
                break  # dropped copy: every free node already holds e

    # Step 3: fill leftover slots, highest current share first.
    while True:
        free_nodes = np.array([f > 0 for f in free])
        if not free_nodes.any():
            break
        missing = (~on_node & free_nodes[:, None]).any(axis=0)
        cand = np.flatnonzero(missing)
        if cand.size == 0:
            break
        e = min(cand.tolist(), key=lambda x: (-(load[x] * (m // counts[x])), x))
        best_node(e, load[e] * (m // (counts[e] + 1)))

    final_share = [load[e] * (m // counts[e]) for e in range(e_num)]
    slot_expert = np.full((R, S), -1, dtype=np.int32)
    for n in range(n_nodes):
        experts = sorted(np.flatnonzero(on_node[n]).tolist(), key=lambda x: (-final_share[x], x))
        for i, e in enumerate(experts):
            rnd, pos = divmod(i, L)
            gpu = pos if rnd % 2 == 0 else L - 1 - pos
            slot_expert[n * L + gpu, rnd] = e
    return Placement(slot_expert, e_num, L)


# --------------------------------------------------------------------------- DeepSeek EPLB


def _balanced_packing(weight: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack ``n`` weighted items into ``num_packs`` packs of exactly ``n / num_packs`` items.

    ``weight [X, n]`` float32 (one problem per row). Returns ``pack [X, n]`` and
    ``rank_in_pack [X, n]`` (int64). With one item per pack, item ``i`` goes to pack ``i``;
    otherwise items in descending weight (a stable sort: equal weights in index order) each go
    to the lightest pack not yet full (ties: lowest pack index). Pack loads add in float32.
    """
    rows, n = weight.shape
    per = n // num_packs
    if per == 1:
        idx = np.broadcast_to(np.arange(n, dtype=np.int64), (rows, n)).copy()
        return idx, np.zeros((rows, n), dtype=np.int64)
    pack = np.empty((rows, n), dtype=np.int64)
    rank = np.empty((rows, n), dtype=np.int64)
    for x in range(rows):
        order = np.argsort(-weight[x], kind="stable")
        pack_w = np.zeros(num_packs, dtype=np.float32)
        pack_n = np.zeros(num_packs, dtype=np.int64)
        for i in order:
            masked = np.where(pack_n < per, pack_w, np.float32(np.inf))
            p = int(np.argmin(masked))  # first minimum = lowest pack index
            pack[x, i] = p
            rank[x, i] = pack_n[p]
            pack_w[p] += weight[x, i]
            pack_n[p] += 1
    return pack, rank


def _replicate(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replicate ``n`` experts into ``num_phy >= n`` physical slots.

    ``weight [X, n]`` float32. Returns ``phy2log [X, num_phy]``, ``rank [X, num_phy]`` (replica
    rank of each slot) and ``count [X, n]``. Slots ``0..n-1`` hold the experts themselves; each
    further slot goes to the expert with the largest float32 ``load / count`` (ties: lowest id).
    """
    rows, n = weight.shape
    phy2log = np.empty((rows, num_phy), dtype=np.int64)
    phy2log[:, :n] = np.arange(n)
    rank = np.zeros((rows, num_phy), dtype=np.int64)
    count = np.ones((rows, n), dtype=np.int64)
    ar = np.arange(rows)
    for i in range(n, num_phy):
        e = np.argmax(weight / count.astype(np.float32), axis=-1)  # first maximum
        phy2log[:, i] = e
        rank[:, i] = count[ar, e]
        count[ar, e] += 1
    return phy2log, rank, count


def _inverse(perm: np.ndarray) -> np.ndarray:
    """Row-wise inverse of permutations ``perm [X, n]``."""
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def _rebalance_hierarchical(weight: np.ndarray, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int):
    """The hierarchical policy on ``weight [layers, E]`` float32; returns numpy
    ``(phy2log [layers, P], phy_rank [layers, P], logcnt [layers, E])``."""
    layers, e_num = weight.shape
    group_size = e_num // num_groups
    groups_per_node = num_groups // num_nodes
    slots_per_gpu = num_phy // num_gpus
    e_per_node = e_num // num_nodes
    p_per_node = num_phy // num_nodes

    # 1. Groups onto nodes; renumber experts so each node's are contiguous ("renumbered" ids).
    group_load = weight.reshape(layers, num_groups, group_size).sum(axis=-1, dtype=np.float32)
    g_node, g_rank = _balanced_packing(group_load, num_nodes)
    first = (g_node * groups_per_node + g_rank) * group_size  # [layers, groups]
    renum = (first[:, :, None] + np.arange(group_size)).reshape(layers, e_num)  # logical -> renumbered
    orig = _inverse(renum)  # renumbered -> logical

    # 2. Replicate inside each node; one row per (layer, node): [layers * nodes, E / nodes].
    node_load = np.take_along_axis(weight, orig, axis=1).reshape(-1, e_per_node)
    rep_expert, rep_rank, rep_count = _replicate(node_load, p_per_node)  # node-local expert ids

    # 3. Pack each node's replicas onto its GPUs by load per replica.
    rep_load = np.take_along_axis(node_load / rep_count.astype(np.float32), rep_expert, axis=1)
    gpu, pos = _balanced_packing(rep_load, num_gpus // num_nodes)
    where = gpu * slots_per_gpu + pos  # replica -> slot within the node
    replica_at = _inverse(where)  # slot within the node -> replica

    local = np.take_along_axis(rep_expert, replica_at, axis=1).reshape(layers, num_nodes, p_per_node)
    renumbered = (local + np.arange(num_nodes)[None, :, None] * e_per_node).reshape(layers, num_phy)
    phy2log = np.take_along_axis(orig, renumbered, axis=1)
    phy_rank = np.take_along_axis(rep_rank, replica_at, axis=1).reshape(layers, num_phy)
    logcnt = np.take_along_axis(rep_count.reshape(layers, e_num), renum, axis=1)
    return phy2log, phy_rank, logcnt


def rebalance_experts(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int):
    """DeepSeek EPLB's placement, re-implemented from its published rules (PAPER.md section 6).

    Parameters:
        weight: ``[layers, E]`` load of each logical expert (any real dtype; used as float32).
        num_replicas: ``P``, physical experts in total (a multiple of ``num_gpus``, ``>= E``).
        num_groups: expert groups (``E`` a multiple of it).
        num_nodes: server nodes; the hierarchical policy is used when
            ``num_groups % num_nodes == 0``, else the global policy (one group, one node).
        num_gpus: GPUs in total (a multiple of ``num_nodes``).

    Returns:
        phy2log: ``[layers, P]`` int64, logical expert of each physical slot (GPU ``g`` holds
            physical slots ``g * P/num_gpus ..``).
        log2phy: ``[layers, E, P - E + 1]`` int64, physical slots of each expert's replicas in
            replica-rank order, ``-1`` padded. The width is the largest replica count an
            expert can reach (as DeepSeek's returns it), not the largest one reached.
        logcnt: ``[layers, E]`` int64, replica count of each expert.

    Known flaw kept on purpose (faithful): two replicas of one expert can share a GPU.
    """
    w = torch.as_tensor(weight)
    if w.ndim != 2:
        raise ZeppInputError(f"weight must be [layers, num_logical_experts], got shape {tuple(w.shape)}")
    layers, e_num = w.shape
    if w.is_complex() or w.dtype == torch.bool:
        raise ZeppInputError(f"weight must be a real-valued load tensor, got dtype {w.dtype}")
    for name, v in (("num_replicas", num_replicas), ("num_groups", num_groups), ("num_nodes", num_nodes),
                    ("num_gpus", num_gpus)):
        if int(v) < 1:
            raise ZeppInputError(f"{name} must be >= 1, got {v}")
    if num_replicas < e_num:
        raise ZeppInputError(f"num_replicas={num_replicas} is below the {e_num} logical experts; every expert needs a slot")
    if num_replicas % num_gpus:
        raise ZeppInputError(f"num_replicas={num_replicas} is not a multiple of num_gpus={num_gpus}")
    wf = w.detach().to("cpu", torch.float32).numpy()
    if num_groups % num_nodes == 0:
        groups, nodes = num_groups, num_nodes
    else:
        groups, nodes = 1, 1
    if e_num % groups:
        raise ZeppInputError(f"{e_num} experts do not split into num_groups={groups} equal groups")
    if e_num % nodes or num_replicas % nodes or num_gpus % nodes:
        raise ZeppInputError(
            f"{e_num} experts / {num_replicas} replicas / {num_gpus} GPUs do not split evenly over num_nodes={nodes}"
        )
    phy2log, phy_rank, logcnt = _rebalance_hierarchical(wf, num_replicas, groups, nodes, num_gpus)
    maxcnt = num_replicas - e_num + 1
    log2phy = np.full((layers, e_num * maxcnt), -1, dtype=np.int64)
    np.put_along_axis(log2phy, phy2log * maxcnt + phy_rank, np.broadcast_to(np.arange(num_replicas), phy2log.shape),
                      axis=1)
    return (torch.from_numpy(phy2log), torch.from_numpy(log2phy.reshape(layers, e_num, maxcnt)),
            torch.from_numpy(logcnt))


# --------------------------------------------------------------------------- EPLB-based placements


def _hist_load(hist, ranks: int, gpus_per_node: int, extra: int) -> tuple[np.ndarray, int, int]:
    """Checked summed load ``[E]`` int64, slots per rank ``S`` and ``E``."""
    h = _check_hist(hist, gpus_per_node, ranks=ranks)
    extra = _check_extra(extra)
    e_num = h.shape[1]
    per = _check_divisible(e_num, ranks)
    return h.sum(axis=0), per + extra, e_num


def place_eplb(hist, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """The paper's ``eplb`` baseline: ``rebalance_experts`` with the global policy.

    ``hist [N, E]`` with ``N * gpus_per_node == ranks``. The summed history load (float32)
    is spread over ``P = ranks * S`` physical slots, ``S = E/R + extra``
    (``num_groups = num_nodes = 1``, ``num_gpus = ranks``); physical slot ``p`` is local slot
    ``p % S`` of rank ``p // S``. Two replicas of one expert may share a GPU (EPLB's flaw).
    """
    load, S, e_num = _hist_load(hist, ranks, gpus_per_node, extra)
    weight = torch.from_numpy(load.astype(np.float32))[None, :]
    phy2log, _, _ = rebalance_experts(weight, ranks * S, 1, 1, ranks)
    return Placement(phy2log[0].numpy().reshape(ranks, S).astype(np.int32), e_num, gpus_per_node)


def _capped_counts(load32: np.ndarray, num_phy: int, cap: int) -> np.ndarray:
    """EPLB's replication rule on float32 ``load32 [E]`` (largest ``load / count``, ties lowest id)
    but no expert beyond ``cap`` replicas; slots left when every expert is capped stay unused."""
    count = np.ones(load32.shape[0], dtype=np.int64)
    for _ in range(num_phy - load32.shape[0]):
        ratio = np.where(count < cap, load32 / count.astype(np.float32), np.float32(-np.inf))
        e = int(np.argmax(ratio))
        if count[e] >= cap:
            break
        count[e] += 1
    return count


def _pack_distinct(load32: np.ndarray, count: np.ndarray, bins: int, per_bin: int) -> np.ndarray:
    """Greedy packing of replicas onto ``bins`` bins of ``per_bin`` slots, never two replicas of
    one expert in one bin. Returns ``slot_expert [bins, per_bin]`` (``-1`` = unused).

    Replicas (weight ``load / count`` in float32) in descending weight, ties by expert id then
    replica rank, each go to the lightest bin that has room and does not hold the expert (ties:
    lowest bin). If every bin with room already holds it, a repair move makes room: the
    lightest bin ``h`` without the expert (ties lowest) hands its lightest replica of an
    expert ``y`` that the first open bin ``g`` lacks (one exists: ``h`` holds more distinct
    experts than ``g``) over to ``g``, and the stuck replica takes ``y``'s slot on ``h``.
    """
    e_num = load32.shape[0]
    per_rep = load32 / count.astype(np.float32)
    experts = np.repeat(np.arange(e_num), count)
    order = experts[np.argsort(-per_rep[experts], kind="stable")]
    out = np.full((bins, per_bin), -1, dtype=np.int64)
    fill = np.zeros(bins, dtype=np.int64)
    bin_w = np.zeros(bins, dtype=np.float32)
    holds = np.zeros((bins, e_num), dtype=bool)
    for e in order:
        ok = (fill < per_bin) & ~holds[:, e]
        if ok.any():
            b = int(np.argmin(np.where(ok, bin_w, np.float32(np.inf))))
        else:
            g = int(np.flatnonzero(fill < per_bin)[0])
            b = int(np.argmin(np.where(~holds[:, e], bin_w, np.float32(np.inf))))
            movable = [s for s in range(per_bin) if not holds[g, out[b, s]]]
            s = min(movable, key=lambda s: (per_rep[out[b, s]], s))
            y = out[b, s]
            out[g, fill[g]] = y
            fill[g] += 1
            holds[g, y] = True
            bin_w[g] += per_rep[y]
            holds[b, y] = False
            bin_w[b] -= per_rep[y]
            out[b, s] = e
            holds[b, e] = True
            bin_w[b] += per_rep[e]
            continue
        out[b, fill[b]] = e
        fill[b] += 1
        holds[b, e] = True
        bin_w[b] += per_rep[e]
    return out


def place_eplb_distinct(hist, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """EPLB's counts and greedy packing, but never two replicas of one expert on one GPU.

    Counts: EPLB's replication rule on the summed float32 history load, except that an
    expert stops at ``ranks`` replicas (one per GPU); if every expert is capped the remaining
    slots stay empty. GPUs: replicas in descending load per replica, each to the lightest GPU
    with room that does not hold the expert yet (ties: lowest rank); see ``_pack_distinct``
    for the repair move when no such GPU is left. Within a GPU, slots fill in dealing order.
    """
    load, S, e_num = _hist_load(hist, ranks, gpus_per_node, extra)
    load32 = load.astype(np.float32)
    count = _capped_counts(load32, ranks * S, ranks)
    slots = _pack_distinct(load32, count, ranks, S)
    return Placement(slots.astype(np.int32), e_num, gpus_per_node)


def place_epic(hist, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """A model of the ``epic`` baseline's greedy placement (PAPER.md section 7).

    Its exact rules are unpublished; what is modelled, in its three greedy steps:

    1. Redundancy: replica counts as EPLB's replication rule on the summed history (float32),
       capped at one replica per GPU (as ``eplb-distinct``).
    2. GPUs: replicas packed onto ``ranks`` GPU bins by load per replica, never two of one
       expert in a bin (``_pack_distinct``), which balances compute.
    3. Node positions: bins in descending total load (ties: lower bin id) each go to the node,
       with a free GPU position, whose NIC inbound load grows least, i.e. minimising
       ``nic[n] + sum_{e in bin} (l_e - hist[n, e]) / c_e`` (a replica's remote demand is the
       load every other node sends it; ties: lower node id). Bins fill a node's GPUs in the
       order they are assigned. Exact integers: ``/ c_e`` scaled by ``lcm(1..c_max)``.

    A node may hold several replicas of one expert (on different GPUs); epic does not forbid it.
    """
    h = _check_hist(hist, gpus_per_node, ranks=ranks)
    load, S, e_num = _hist_load(h, ranks, gpus_per_node, extra)
    L = int(gpus_per_node)
    n_nodes = ranks // L
    load32 = load.astype(np.float32)
    count = _capped_counts(load32, ranks * S, ranks)
    bins = _pack_distinct(load32, count, ranks, S)
    m = _scale(int(count.max()))
    unit = [m // int(c) for c in count]  # replica weight = demand * unit[e]
    load_py = [int(x) for x in load]
    hist_py = h.tolist()
    bin_total, remote = [], []  # remote[b][n]: inbound NIC rows (scaled) of bin b on node n
    for b in range(ranks):
        es = [int(e) for e in bins[b] if e >= 0]
        bin_total.append(sum(load_py[e] * unit[e] for e in es))
        remote.append([sum((load_py[e] - hist_py[n][e]) * unit[e] for e in es) for n in range(n_nodes)])
    nic = [0] * n_nodes
    used = [0] * n_nodes
    out = np.full((ranks, S), -1, dtype=np.int32)
    for b in sorted(range(ranks), key=lambda b: (-bin_total[b], b)):
        n = min((n for n in range(n_nodes) if used[n] < L), key=lambda n: (nic[n] + remote[b][n], n))
        out[n * L + used[n]] = bins[b]
        used[n] += 1
        nic[n] += remote[b][n]
    return Placement(out, e_num, L)


# --------------------------------------------------------------------------- dispatcher


def make_placement(name: str, hist, num_experts: int, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """Build placement ``name`` (one of ``home``, ``zepp``, ``eplb``, ``eplb-distinct``, ``epic``).

    ``hist [N, E]`` non-negative int history histogram with ``N * gpus_per_node == ranks`` and
    ``E == num_experts`` (``home`` ignores it; ``None`` is accepted there). ``E`` must be a
    multiple of ``ranks``; ``extra >= 0`` redundant slots per GPU (not used by ``home``).
    """
    if name not in PLACEMENTS:
        raise ZeppInputError(f"unknown placement {name!r}; choose one of {', '.join(PLACEMENTS)}")
    if not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ZeppInputError(f"ranks must be a positive integer, got {ranks!r}")
    if not isinstance(gpus_per_node, (int, np.integer)) or gpus_per_node < 1 or ranks % gpus_per_node:
        raise ZeppInputError(f"gpus_per_node={gpus_per_node!r} must be a positive divisor of ranks={ranks}")
    _check_divisible(num_experts, ranks)
    extra = _check_extra(extra)
    if name == "home":
        if hist is not None:
            _check_hist(hist, gpus_per_node, ranks=ranks, num_experts=num_experts)
        return place_home(num_experts, ranks, gpus_per_node)
    if hist is None:
        raise ZeppInputError(f"placement {name!r} needs a history histogram hist [nodes, experts]; got None")
    h = _check_hist(hist, gpus_per_node, ranks=ranks, num_experts=num_experts)
    if name == "zepp":
        return place_zepp(h, gpus_per_node, extra)
    if name == "eplb":
        return place_eplb(h, ranks, gpus_per_node, extra)
    if name == "eplb-distinct":
        return place_eplb_distinct(h, ranks, gpus_per_node, extra)
    return place_epic(h, ranks, gpus_per_node, extra)
