"""DeepSeek EPLB (``rebalance_experts``, re-implemented from its published rules, PAPER.md
section 6) and the placements built on it: ``eplb`` (its global policy on the summed history)
and ``eplb-distinct`` (its counts and packing, never two replicas of one expert on one GPU).

EPLB and its variants compare float32 loads, because EPLB does. ``rebalance_experts`` speaks
torch tensors (DeepSeek's interface; torch is imported when it is called); ``rebalance_numpy`` is
the same on numpy arrays, what the placements here call, so planning needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.placement.base_placement import summed_load
from zepp.planner.types import Placement

if TYPE_CHECKING:
    import torch

# --------------------------------------------------------------------------- DeepSeek EPLB


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
    import torch

    w = torch.as_tensor(weight)
    if w.is_complex() or w.dtype == torch.bool:
        raise ZeppInputError(f"weight must be a real-valued load tensor, got dtype {w.dtype}")
    wf = w.detach().to("cpu", torch.float32).numpy()
    return tuple(torch.from_numpy(a) for a in rebalance_numpy(wf, num_replicas, num_groups, num_nodes, num_gpus))


def rebalance_numpy(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int):
    """``rebalance_experts`` on a numpy ``weight [layers, E]`` (real; used as float32): the same
    ``(phy2log [layers, P], log2phy [layers, E, P - E + 1], logcnt [layers, E])``, as int64 arrays."""
    w = np.asarray(weight)
    if w.dtype == bool or not (np.issubdtype(w.dtype, np.integer) or np.issubdtype(w.dtype, np.floating)):
        raise ZeppInputError(f"weight must be a real-valued load tensor, got dtype {w.dtype}")
    groups, nodes = _check_rebalance(w, num_replicas, num_groups, num_nodes, num_gpus)
    wf = w.astype(np.float32)
    phy2log, phy_rank, logcnt = _rebalance_hierarchical(wf, num_replicas, groups, nodes, num_gpus)
    return phy2log, _log2phy(phy2log, phy_rank, wf.shape[1], num_replicas), logcnt


def _check_rebalance(w: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
                     num_gpus: int) -> tuple[int, int]:
    """Check ``rebalance_experts``' arguments; returns the ``(groups, nodes)`` of the policy it runs."""
    if w.ndim != 2:
        raise ZeppInputError(f"weight must be [layers, num_logical_experts], got shape {tuple(w.shape)}")
    e_num = w.shape[1]
    for name, v in (("num_replicas", num_replicas), ("num_groups", num_groups), ("num_nodes", num_nodes),
                    ("num_gpus", num_gpus)):
        if int(v) < 1:
            raise ZeppInputError(f"{name} must be >= 1, got {v}")
    if num_replicas < e_num:
        raise ZeppInputError(f"num_replicas={num_replicas} is below the {e_num} logical experts; every expert needs a slot")
    if num_replicas % num_gpus:
        raise ZeppInputError(f"num_replicas={num_replicas} is not a multiple of num_gpus={num_gpus}")
    groups, nodes = (num_groups, num_nodes) if num_groups % num_nodes == 0 else (1, 1)
    if e_num % groups:
        raise ZeppInputError(f"{e_num} experts do not split into num_groups={groups} equal groups")
    if e_num % nodes or num_replicas % nodes or num_gpus % nodes:
        raise ZeppInputError(
            f"{e_num} experts / {num_replicas} replicas / {num_gpus} GPUs do not split evenly over num_nodes={nodes}"
        )
    return groups, nodes


def _log2phy(phy2log: np.ndarray, phy_rank: np.ndarray, e_num: int, num_replicas: int) -> np.ndarray:
    """``[layers, E, P - E + 1]``: the physical slots of each expert in replica-rank order, -1 padded."""
    layers = phy2log.shape[0]
    maxcnt = num_replicas - e_num + 1
    log2phy = np.full((layers, e_num * maxcnt), -1, dtype=np.int64)
    np.put_along_axis(log2phy, phy2log * maxcnt + phy_rank, np.broadcast_to(np.arange(num_replicas), phy2log.shape),
                      axis=1)
    return log2phy.reshape(layers, e_num, maxcnt)


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

    # 4. Back to logical ids and global physical slots.
    local = np.take_along_axis(rep_expert, replica_at, axis=1).reshape(layers, num_nodes, p_per_node)
    renumbered = (local + np.arange(num_nodes)[None, :, None] * e_per_node).reshape(layers, num_phy)
    phy2log = np.take_along_axis(orig, renumbered, axis=1)
    phy_rank = np.take_along_axis(rep_rank, replica_at, axis=1).reshape(layers, num_phy)
    logcnt = np.take_along_axis(rep_count.reshape(layers, e_num), renum, axis=1)
    return phy2log, phy_rank, logcnt


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


# --------------------------------------------------------------------------- eplb


def place_eplb(hist, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """The paper's ``eplb`` baseline: ``rebalance_experts`` with the global policy.

    ``hist [N, E]`` with ``N * gpus_per_node == ranks``. The summed history load (float32)
    is spread over ``P = ranks * S`` physical slots, ``S = E/R + extra``
    (``num_groups = num_nodes = 1``, ``num_gpus = ranks``); physical slot ``p`` is local slot
    ``p % S`` of rank ``p // S``. Two replicas of one expert may share a GPU (EPLB's flaw).
    """
    load, S, e_num = summed_load(hist, ranks, gpus_per_node, extra)
    phy2log, _, _ = rebalance_numpy(load.astype(np.float32)[None, :], ranks * S, 1, 1, ranks)
    return Placement(phy2log[0].reshape(ranks, S).astype(np.int32), e_num, gpus_per_node)


def build_eplb(hist: np.ndarray, num_experts: int, ranks: int, gpus_per_node: int, extra: int) -> Placement:
    """``make_placement``'s entry (``hist`` checked there)."""
    return place_eplb(hist, ranks, gpus_per_node, extra)


# --------------------------------------------------------------------------- eplb-distinct


def place_eplb_distinct(hist, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """EPLB's counts and greedy packing, but never two replicas of one expert on one GPU.

    Counts: EPLB's replication rule on the summed float32 history load, except that an
    expert stops at ``ranks`` replicas (one per GPU); if every expert is capped the remaining
    slots stay empty. GPUs: replicas in descending load per replica, each to the lightest GPU
    with room that does not hold the expert yet (ties: lowest rank); see ``pack_distinct``
    for the repair move when no such GPU is left. Within a GPU, slots fill in dealing order.
    """
    load, S, e_num = summed_load(hist, ranks, gpus_per_node, extra)
    load32 = load.astype(np.float32)
    count = capped_counts(load32, ranks * S, ranks)
    slots = pack_distinct(load32, count, ranks, S)
    return Placement(slots.astype(np.int32), e_num, gpus_per_node)


def build_eplb_distinct(hist: np.ndarray, num_experts: int, ranks: int, gpus_per_node: int,
                        extra: int) -> Placement:
    """``make_placement``'s entry (``hist`` checked there)."""
    return place_eplb_distinct(hist, ranks, gpus_per_node, extra)


def capped_counts(load32: np.ndarray, num_phy: int, cap: int) -> np.ndarray:
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


def pack_distinct(load32: np.ndarray, count: np.ndarray, bins: int, per_bin: int) -> np.ndarray:
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
    bins_ = _DistinctBins(bins, per_bin, e_num, per_rep)
    for e in experts[np.argsort(-per_rep[experts], kind="stable")]:
        ok = (bins_.fill < per_bin) & ~bins_.holds[:, e]
        if ok.any():
            bins_.add(int(np.argmin(np.where(ok, bins_.weight, np.float32(np.inf)))), e)
        else:
            bins_.repair(e)
    return bins_.out


class _DistinctBins:
    """``pack_distinct``'s bins: ``out [bins, per_bin]`` experts (-1 unused), ``fill [bins]``,
    ``weight [bins]`` float32 and ``holds [bins, E]``; ``per_rep [E]`` a replica's weight."""

    def __init__(self, bins: int, per_bin: int, e_num: int, per_rep: np.ndarray):
        self.per_bin = per_bin
        self.per_rep = per_rep
        self.out = np.full((bins, per_bin), -1, dtype=np.int64)
        self.fill = np.zeros(bins, dtype=np.int64)
        self.weight = np.zeros(bins, dtype=np.float32)
        self.holds = np.zeros((bins, e_num), dtype=bool)

    def add(self, b: int, e: int) -> None:
        """A replica of ``e`` into the next free slot of bin ``b``."""
        self.out[b, self.fill[b]] = e
        self.fill[b] += 1
        self.holds[b, e] = True
        self.weight[b] += self.per_rep[e]

    def repair(self, e: int) -> None:
        """Every bin with room holds ``e``: the lightest bin ``b`` without ``e`` hands its lightest
        replica of an expert ``y`` that the first open bin ``g`` lacks over to ``g``; ``e`` takes
        ``y``'s slot on ``b``."""
        g = int(np.flatnonzero(self.fill < self.per_bin)[0])
        b = int(np.argmin(np.where(~self.holds[:, e], self.weight, np.float32(np.inf))))
        movable = [s for s in range(self.per_bin) if not self.holds[g, self.out[b, s]]]
        s = min(movable, key=lambda s: (self.per_rep[self.out[b, s]], s))
        y = self.out[b, s]
        self.add(g, y)
        self.holds[b, y] = False
        self.weight[b] -= self.per_rep[y]
        self.out[b, s] = e
        self.holds[b, e] = True
        self.weight[b] += self.per_rep[e]
