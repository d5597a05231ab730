"""``zepp``: Zepp's history-driven placement (PAPER.md section 2.1).

Replicas from node demand, at most one per node, snake-dealt to GPUs; on a node that is a whole
NVLink rack (more than ``BOARD_GPUS`` GPUs: GB200 NVL72 and its kin), at most one per GPU instead
(``copies_per_node``). Every decision is exact:
loads per replica ``l / c`` are compared as the integers ``l * (M // c)``, ``M = lcm(1..N)``
(Python ints, no overflow), so every rank computes the same placement.
"""

from __future__ import annotations

import heapq

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.placement.base_placement import check_divisible, check_extra, check_hist, lcm_scale
from zepp.planner.types import Placement

# A node of at most this many GPUs is a board (HGX / DGX, the paper's 4-GPU nodes): a second copy of
# an expert on the node saves no NIC bytes, so Zepp keeps one copy per node and spends the slots
# on other experts. A node of more GPUs is a rack-scale NVLink domain (NVL32 / NVL72): its GPUs
# exchange rows over NVLink at about ten times the NIC's rate, the busiest GPU's GEMM is what is
# scarce, and a hot expert gets copies on several of the rack's GPUs (at most one per GPU).
BOARD_GPUS = 8


def copies_per_node(gpus_per_node: int) -> int:
    """Most copies of one expert on one node: 1 on a board, one per GPU on a rack-scale node."""
    return 1 if gpus_per_node <= BOARD_GPUS else int(gpus_per_node)


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

    On a rack-scale node (``gpus_per_node > BOARD_GPUS``) "node" reads "GPU of the node" in the
    caps: step 1 caps ``c_e`` at ``N * L``, steps 2-3 let a node take up to ``L`` copies of an
    expert, and step 4 deals each node's copies greedily (next copy in descending share to the GPU
    with the lowest accumulated share, then the fewest filled slots, then the lowest index, among
    those with a free slot not holding the expert yet: longest-processing-time-first packing), so
    the copies of an expert sit on different GPUs and the GPUs' shares come out even.

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
    h = check_hist(hist, gpus_per_node)
    extra = check_extra(extra)
    n_nodes, e_num = h.shape
    per = check_divisible(e_num, n_nodes * int(gpus_per_node))
    return zepp_slots(h, int(gpus_per_node), per + extra)


def build_zepp(hist: np.ndarray, num_experts: int, ranks: int, gpus_per_node: int, extra: int) -> Placement:
    """``make_placement``'s entry (``hist`` checked there)."""
    return place_zepp(hist, gpus_per_node, extra)


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
    load = [int(x) for x in h.sum(axis=0)]
    per_node = copies_per_node(L)
    m = lcm_scale(n_nodes * per_node)
    # 1. Counts, at most one replica per node (per GPU on a rack-scale node).
    planned = _zepp_counts(load, R * S - e_num, n_nodes * per_node, m)
    # 2. Nodes, experts in descending planned share.
    nodes = _NodeFill(h, L * S, per_node)
    share = [load[e] * (m // planned[e]) for e in range(e_num)]
    for e in sorted(range(e_num), key=lambda e: (-share[e], e)):
        for _ in range(planned[e]):
            if nodes.place(e, share[e]) is None:
                break  # dropped copy: every free node already holds e
    # 3. Leftover slots, highest current share first.
    nodes.fill_leftover(load, m)
    # 4. GPUs: each node's replicas dealt snake-wise.
    final_share = [load[e] * (m // nodes.counts[e]) for e in range(e_num)]
    if per_node > 1:
        return Placement(_deal_distinct(nodes.held, final_share, L, S), e_num, L)
    return Placement(_deal_snake(nodes.on_node, final_share, L, S), e_num, L)


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


class _NodeFill:
    """Steps 2 and 3: which node each replica goes to.

    Per node: ``free`` slots, accumulated ``node_load`` (scaled shares), ``held [N, E]`` (copies
    of each expert it holds, at most ``per_node``) and ``on_node [N, E]`` (``held > 0``); per
    expert: ``counts`` (replicas placed so far).
    """

    def __init__(self, h: np.ndarray, node_slots: int, per_node: int = 1):
        n_nodes, e_num = h.shape
        self.n_nodes = n_nodes
        self.per_node = per_node
        self.free = [node_slots] * n_nodes
        self.node_load = [0] * n_nodes
        self.held = np.zeros((n_nodes, e_num), dtype=np.int64)
        self.counts = [0] * e_num
        self.hist_rows = h.T.tolist()  # [E][N] python ints

    def place(self, e: int, add: int) -> int | None:
        """One more replica of ``e`` (share ``add``) on the node that requested ``e`` most among
        those with a free slot not holding it (ties: lower node load, then lower id); ``None``
        when no node qualifies."""
        best, best_key = None, None
        req = self.hist_rows[e]
        for n in range(self.n_nodes):
            if self.free[n] and self.held[n, e] < self.per_node:
                key = (-req[n], self.node_load[n], n)
                if best_key is None or key < best_key:
                    best, best_key = n, key
        if best is not None:
            self.free[best] -= 1
            self.node_load[best] += add
            self.held[best, e] += 1
            self.counts[e] += 1
        return best

    @property
    def on_node(self) -> np.ndarray:
        return self.held > 0

    def fill_leftover(self, load: list[int], m: int) -> None:
        """While a node has a free slot some expert is missing from, the missing expert of highest
        current share ``load / counts`` (ties: lower id) gets one more replica."""
        while True:
            free_nodes = np.array([f > 0 for f in self.free])
            if not free_nodes.any():
                break
            missing = ((self.held < self.per_node) & free_nodes[:, None]).any(axis=0)
            cand = np.flatnonzero(missing)
            if cand.size == 0:
                break
            e = min(cand.tolist(), key=lambda x: (-(load[x] * (m // self.counts[x])), x))
            self.place(e, load[e] * (m // (self.counts[e] + 1)))


def _deal_snake(on_node: np.ndarray, share: list[int], L: int, S: int) -> np.ndarray:
    """``slot_expert [N*L, S]``: each node's experts (``on_node [N, E]``) in descending ``share``
    (ties: lower id) dealt to its GPUs 0..L-1, L-1..0, ...; round ``i`` fills local slot ``i``."""
    n_nodes = on_node.shape[0]
    slot_expert = np.full((n_nodes * L, S), -1, dtype=np.int32)
    for n in range(n_nodes):
        experts = sorted(np.flatnonzero(on_node[n]).tolist(), key=lambda x: (-share[x], x))
        for i, e in enumerate(experts):
            rnd, pos = divmod(i, L)
            gpu = pos if rnd % 2 == 0 else L - 1 - pos
            slot_expert[n * L + gpu, rnd] = e
    return slot_expert


def _deal_distinct(held: np.ndarray, share: list[int], L: int, S: int) -> np.ndarray:
    """``slot_expert [N*L, S]`` for a rack-scale node: each node's copies (``held [N, E]`` per
    expert) in descending ``share`` (ties: lower id), each to the GPU with the lowest accumulated
    share, then the fewest filled slots, then the lowest index, among the GPUs with a free slot
    that do not hold the expert yet (a copy with no such GPU is dropped: its slot stays ``-1``)."""
    n_nodes = held.shape[0]
    slot_expert = np.full((n_nodes * L, S), -1, dtype=np.int32)
    for n in range(n_nodes):
        filled = [0] * L
        acc = [0] * L
        holds = [set() for _ in range(L)]
        experts = sorted(np.flatnonzero(held[n]).tolist(), key=lambda x: (-share[x], x))
        for e in experts:
            for _ in range(int(held[n, e])):
                cand = [g for g in range(L) if filled[g] < S and e not in holds[g]]
                if not cand:
                    break
                g = min(cand, key=lambda g: (acc[g], filled[g], g))
                slot_expert[n * L + g, filled[g]] = e
                filled[g] += 1
                acc[g] += share[e]
                holds[g].add(e)
    return slot_expert
