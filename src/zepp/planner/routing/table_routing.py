"""``zepp-table``: Zepp's routing precomputed per placement, so a batch routes by table lookup.

Per placement, from the history's expected demand ``demand [G, E]`` (entries per step that
source GPU ``g`` sends to expert ``e``), ``build_routing_table`` runs Zepp's rotation water-fill
(``zepp_routing._WaterFill``: relaxed replica-load bounds ``[(1-C) q, (1+C) q]``, each source
visiting its own GPU, then its node, then remote nodes) over the *expected* demand instead of a
batch's entries, then spreads each (source node, replica node) block of flows in proportion
(``_spread``: replica loads, node-pair volumes and own-GPU flows unchanged). The result, per
(source GPU, expert), is a short list of replicas with shares:
``choices [G, E, m]`` global slot ids in visit order (own GPU first; ``-1`` padding) and
``shares [G, E, m]`` cumulative thresholds out of ``SHARE_ONE = 65536`` (the last valid one is
``SHARE_ONE``; padding repeats it). The expected load of every replica then respects the bounds
(up to the rounding of the shares, 1/65536 of a source's demand per replica).

At run time an entry ``(rank, token t, choice j)`` of a batch with ``T`` tokens per rank and
``k`` choices picks ``choices[rank, e, i]`` for the first ``i`` with ``u < shares[rank, e, i]``,
where ``u = entry_hash((rank * T + t) * k + j) >> 15`` (in ``[0, 65536)``, the same integer hash
as ``base_routing.entry_hash``): a gather and a compare per entry, on the device, with no
exchange of ids and no per-batch water-fill. Every rank computes the same slots
(``route_by_table`` for all ranks equals ``rank_slots`` of each rank alone); the torch twin is
``zepp.planner.torch.routing.table_routing``. A batch's actual loads scatter around the expected ones,
so its ``Routing`` carries no relaxation (the bounds hold in expectation, not per batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.routing.base_routing import entry_hash, slot_routing
from zepp.planner.routing.zepp_routing import _WaterFill
from zepp.planner.types import Placement, Routing

SHARE_ONE = 1 << 16  # shares are cumulative thresholds out of this
HASH_SHIFT = 15  # entry_hash is in [0, 2**31): its top 16 bits pick the share
DEMAND_UNITS = 1 << 24  # the expected demand is water-filled in integer units of total / 2**24


@dataclass(frozen=True)
class RoutingTable:
    """Per (source GPU, expert), the replicas that serve it and their cumulative shares.

    ``choices [G, E, m]`` int32: global slot ids (``rank * S + local``) in visit order, ``-1``
    padding; ``shares [G, E, m]`` int32: cumulative thresholds out of ``SHARE_ONE`` (non-decreasing,
    the last valid one and every padding one equal ``SHARE_ONE``); ``relaxation``: the C whose
    bounds the expected loads respect; ``placement``: the placement the slots belong to.
    """

    choices: np.ndarray
    shares: np.ndarray
    relaxation: float
    placement: Placement | None = None

    @property
    def ranks(self) -> int:
        return self.choices.shape[0]


def build_routing_table(placement: Placement, demand: np.ndarray, relaxation: float,
                        gpus_per_node: int, lean: bool = False) -> RoutingTable:
    """The routing table of ``placement`` for the expected demand ``demand [G, E]`` (float,
    entries per step from source GPU ``g`` to expert ``e``) under relaxation ``C``.

    Experts with one replica get it with share ``SHARE_ONE``; a (source, expert) pair with no
    expected demand gets SGLang-static's pick (a replica on the source GPU, else on its node,
    else ``source mod count``), so even an expert never seen in the history has a route.

    ``lean``: route over ``lean_placement``'s replicas only (``zepp-table-lean``): at decode a
    GEMM reads the weights of every slot that gets a row, so fewer slots with work per GPU beat
    balanced rows; the bounds then hold for the replicas kept."""
    demand = _check_demand(placement, demand, gpus_per_node)
    full = placement
    if lean:
        placement = lean_placement(placement, demand.sum(0))
    G, E = demand.shape
    units = _demand_units(demand)
    fallback = _locality_pick(placement)  # [G, E]
    multi = np.flatnonzero(placement.replica_count > 1)
    cmax = int(placement.replica_count.max())
    choices = np.full((G, E, cmax), -1, np.int32)
    shares = np.full((G, E, cmax), SHARE_ONE, np.int64)
    choices[:, :, 0] = fallback
    if multi.size:
        fill = _WaterFill(units[:, multi], placement, relaxation, multi)
        fill.run()
        amount = _spread(fill.assigned, placement, multi)  # [G, M, C] float
        visit = fill.visit  # [G, M, C] replica index of each source's v-th visit (``visit_order``)
        got = np.take_along_axis(amount, visit, axis=2)  # [G, M, C] per visit, locality order
        slots = placement.replicas[multi][np.arange(multi.size)[None, :, None], visit]  # [G, M, C]
        total = got.sum(2, keepdims=True)
        thr = np.rint(np.cumsum(got, axis=2) * (SHARE_ONE / np.where(total > 0, total, 1))).astype(np.int64)
        thr = np.minimum(thr, SHARE_ONE)
        thr[:, :, -1] = SHARE_ONE
        keep = np.diff(thr, axis=2, prepend=0) > 0  # replicas with a share of at least 1/65536
        order = np.argsort(~keep, axis=2, kind="stable")  # served replicas first, in visit order
        thr = np.take_along_axis(thr, order, axis=2)
        slots = np.take_along_axis(slots, order, axis=2)
        keep = np.take_along_axis(keep, order, axis=2)
        served = total[:, :, 0] > 0  # [G, M]; pairs without demand keep the fallback
        sub_c = np.where(keep, slots, -1)
        sub_s = np.where(keep, thr, SHARE_ONE)
        cur_c, cur_s = choices[:, multi], shares[:, multi]
        choices[:, multi] = np.where(served[:, :, None], sub_c, cur_c)
        shares[:, multi] = np.where(served[:, :, None], sub_s, cur_s)
    m = max(1, int((choices >= 0).sum(2).max()))
    return RoutingTable(np.ascontiguousarray(choices[:, :, :m]), shares[:, :, :m].astype(np.int32), float(relaxation),
                        full)


def build_lean_routing_table(placement: Placement, demand: np.ndarray, relaxation: float,
                             gpus_per_node: int) -> RoutingTable:
    """``build_routing_table(..., lean=True)`` (``zepp-table-lean``'s table)."""
    return build_routing_table(placement, demand, relaxation, gpus_per_node, lean=True)


def demand_per_gpu(node_hist: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """The expected demand ``[N * L, E]`` float of a history's node histogram ``node_hist [N, E]``
    (``zepp.traces.node_demand``): each GPU of node ``n`` expects ``node_hist[n] / L``."""
    return np.repeat(np.asarray(node_hist, np.float64) / gpus_per_node, gpus_per_node, axis=0)


def lean_placement(placement: Placement, load: np.ndarray) -> Placement:
    """``placement`` with replicas left unused (``-1``) so that the most slots with work on any GPU
    is as small as the greedy finds: while the GPU with the most used slots holds a replica of an
    expert that has another used replica, that replica of the least loaded such expert (``load
    [E]``, ties: lower slot) is dropped; every expert keeps at least one replica. Slot ids are
    unchanged, so a table over it routes on ``placement``."""
    se = placement.slot_expert.copy()
    count = placement.replica_count.astype(np.int64).copy()
    active = (se >= 0).sum(1)
    floor = -(-placement.num_experts // placement.ranks)  # no GPU can do with fewer
    load = np.asarray(load, float)
    while True:
        droppable = (se >= 0) & (count[np.maximum(se, 0)] > 1)
        busy = np.where(droppable.any(1), active, -1)
        g = int(np.argmax(busy))
        if busy[g] <= floor:
            break
        cand = np.flatnonzero(droppable[g])
        s = int(cand[np.argmin(load[se[g, cand]])])
        count[se[g, s]] -= 1
        se[g, s] = -1
        active[g] -= 1
    return Placement(se, placement.num_experts, placement.gpus_per_node)


def route_by_table(topk_ids: np.ndarray, table: RoutingTable) -> Routing:
    """Route a checked batch ``topk_ids [R, T, k]`` int32 by ``table`` (every rank's
    ``rank_slots``); ``-1`` ids get slot ``-1``. The Routing carries no relaxation: the table's
    bounds hold for the expected loads, not for each batch."""
    R, T, k = topk_ids.shape
    if R != table.ranks:
        raise ZeppInputError(f"batch has {R} ranks but the routing table has {table.ranks}")
    src = np.repeat(np.arange(R, dtype=np.int64), T * k).reshape(R, T, k)
    index = np.arange(R * T * k, dtype=np.int64).reshape(R, T, k)
    slot = _lookup(topk_ids, src, index, table)
    return slot_routing(topk_ids, slot, table.placement)


def rank_slots(ids: np.ndarray, rank: int, table: RoutingTable) -> np.ndarray:
    """What rank ``rank`` computes alone for its own ``ids [T, k]`` int32: ``slot [T, k]`` int32,
    equal to its slice of ``route_by_table`` (``-1`` ids give ``-1``)."""
    ids = np.asarray(ids)
    T, k = ids.shape
    index = rank * T * k + np.arange(T * k, dtype=np.int64).reshape(T, k)
    return _lookup(ids, np.full(ids.shape, rank, np.int64), index, table)


def expected_slot_loads(table: RoutingTable, demand: np.ndarray) -> np.ndarray:
    """``[R * S]`` expected entries per global slot when sources send ``demand [G, E]`` by the table."""
    width = np.diff(table.shares.astype(np.int64), axis=2, prepend=0) / SHARE_ONE  # [G, E, m]
    amount = np.asarray(demand, float)[:, :, None] * width
    valid = table.choices >= 0
    return np.bincount(table.choices[valid], weights=amount[valid], minlength=table.placement.slot_expert.size)


def _lookup(ids: np.ndarray, src: np.ndarray, index: np.ndarray, table: RoutingTable) -> np.ndarray:
    """The table's slot of entries ``ids`` from source ranks ``src`` with entry indices ``index``
    (all the same shape); ``-1`` where an id is missing."""
    e = np.maximum(ids, 0)
    u = entry_hash(index.ravel()).reshape(index.shape) >> HASH_SHIFT
    sh = table.shares[src, e]  # [..., m]
    pick = (sh <= u[..., None]).sum(-1)
    slot = np.take_along_axis(table.choices[src, e], pick[..., None], axis=-1)[..., 0]
    return np.where(ids < 0, -1, slot).astype(np.int32)


def _spread(assigned: np.ndarray, placement: Placement, multi: np.ndarray) -> np.ndarray:
    """The water-fill's ``assigned [G, M, C]`` (units per source, expert of ``multi`` and replica)
    with each block of flows from the GPUs of one node to the replicas on one node spread in
    proportion (``rows x columns / total``): every replica keeps its load, every node pair its
    volume and every GPU its own-GPU flows, but a source no longer sends all of an expert to one
    GPU of a node, so no GPU pair's link carries a source's whole demand. Returns float ``[G, M, C]``."""
    G, M, C = assigned.shape
    L, S = placement.gpus_per_node, placement.slots_per_rank
    N = G // L
    reps = placement.replicas[multi]  # [M, C]
    rep_rank = np.where(reps >= 0, reps // S, -1)
    rep_node = np.where(reps >= 0, rep_rank // L, -1)
    own = rep_rank[None] == np.arange(G)[:, None, None]  # [G, M, C]
    flow = np.where(own, 0, assigned).astype(float)
    col = flow.reshape(N, L, M, C).sum(1)  # [N, M, C]: each replica's inflow from each source node
    out = np.where(own, assigned, 0).astype(float)
    for n in range(N):  # destination node
        at_n = (rep_node == n)[None]  # [1, M, C]
        row = np.where(at_n, flow, 0).sum(2)  # [G, M]: each source's flow into node n
        tot = row.reshape(N, L, M).sum(1)  # [N, M]
        frac = np.where(at_n, col, 0) / np.where(tot > 0, tot, 1)[:, :, None]  # [N, M, C]
        out += np.where(at_n, row[:, :, None] * np.repeat(frac, L, axis=0), 0)
    return out


def _check_demand(placement: Placement, demand, gpus_per_node: int) -> np.ndarray:
    d = np.asarray(demand, dtype=float)
    want = (placement.ranks, placement.num_experts)
    if d.shape != want:
        raise ZeppInputError(f"routing table demand has shape {d.shape}, expected [ranks, experts] = {list(want)}")
    if not np.isfinite(d).all() or (d < 0).any():
        raise ZeppInputError("routing table demand must be finite and non-negative")
    if gpus_per_node != placement.gpus_per_node:
        raise ZeppInputError(f"routing table: gpus_per_node={gpus_per_node} but the placement has "
                             f"{placement.gpus_per_node}")
    return d


def _demand_units(demand: np.ndarray) -> np.ndarray:
    """``demand [G, E]`` as int64 units, scaled so the whole demand is ``DEMAND_UNITS``."""
    total = demand.sum()
    if total <= 0:
        return np.zeros(demand.shape, np.int64)
    return np.rint(demand * (DEMAND_UNITS / total)).astype(np.int64)


def _locality_pick(placement: Placement) -> np.ndarray:
    """``[G, E]`` SGLang-static's replica per (source, expert): on the source GPU, else on its
    node, else any; among the nearest level, the ``(source mod count)``-th in replica order."""
    G, E = placement.ranks, placement.num_experts
    S, L = placement.slots_per_rank, placement.gpus_per_node
    reps = placement.replicas  # [E, C]
    valid = reps >= 0
    src = np.arange(G)[:, None, None]
    rr = np.where(valid, reps // S, -1)[None]  # [1, E, C]
    level = np.where(rr == src, 0, np.where(rr // L == src // L, 1, 2))
    level = np.where(valid[None], level, 3)
    near = level == level.min(axis=2, keepdims=True)  # [G, E, C]
    pick = np.arange(G)[:, None] % near.sum(2)
    col = np.argmax(near & (np.cumsum(near, axis=2) - 1 == pick[:, :, None]), axis=2)
    return np.take_along_axis(np.broadcast_to(reps[None], (G, E, reps.shape[1])), col[:, :, None], 2)[:, :, 0]
