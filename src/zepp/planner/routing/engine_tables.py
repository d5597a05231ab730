"""Zepp's routing handed to an engine in the engine's own tables, planned once per placement from
the history's expected demand ``demand [G, E]`` (entries per step from source GPU ``g`` to expert
``e``) under Zepp's relaxed replica-load bound ``ceil((1+C) q)``, ``q = D_e / c_e``, with the
busiest NIC or the busiest GPU in mind (``zepp_assignment``, the table routing's water-fill turned
into an integer assignment that also chooses among remote copies by their GPU's load): experts by
falling demand; per expert the sources nearest a copy first (own GPU, then own node), largest
first; each source fills its nearest copies up to the bound (least loaded first), then the remote
copies whose GPU so far receives least from other nodes (a decode deployment: DeepEP's
low-latency kernels write every entry over the NIC) or computes fewest rows (a prefill
deployment: the GEMMs dominate), and what fits nowhere goes to the least loaded copy.

- ``StaticTable`` (SGLang's static dispatch: ``logical_to_rank_dispatch_physical_map``): each
  (source GPU, expert) whole to one copy (``build_static_table``). A pair without demand takes
  the nearest copy (own GPU, own node, else the ``(source mod count)``-th).
- ``HashTable`` (vLLM's ``logical_to_physical_map`` row and ``logical_replica_count`` per rank):
  sources may split over copies; each (source, expert)'s shares in whole positions of a row
  ``width`` long (a power of two, at most vLLM's map width; ``build_hash_table``). vLLM takes
  position ``((t * 2654435769) mod 2**32) mod width`` for the rank's token row ``t``, which for a
  power-of-two width is ``t * 2654435769 mod width``, a bijection of ``t mod width``: the row is
  laid out so that token row ``t`` meets copy ``j`` where the bit-reversal of ``(t + e) mod width``
  falls in copy ``j``'s share, so every run of consecutive token rows takes each copy in
  proportion to its share. A pair with one copy gets a row of one (count 1).

``route_sglang_table`` / ``route_vllm_table`` route a batch exactly as the engine does with the
tables; ``hash_rows`` writes one rank's vLLM rows (tests/engines passes them through vLLM's own
kernel, and the SGLang map through SGLang's dispatch). Every rank computes the same tables:
integer arithmetic throughout (the demand in units of its total / 2**24).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.routing.base_routing import slot_routing
from zepp.planner.routing.table_routing import _check_demand, _demand_units, _locality_pick
from zepp.planner.routing.vllm_routing import KNUTH, local_rows
from zepp.planner.types import Placement, Routing, expert_load_bounds

__all__ = ["StaticTable", "HashTable", "build_static_table", "build_hash_table", "build_prefill_static_table",
           "build_prefill_hash_table", "zepp_assignment", "hash_rows", "route_sglang_table", "route_vllm_table",
           "VLLM_WIDTH", "OBJECTIVES"]

VLLM_WIDTH = 1024  # vLLM 0.33.0's logical_to_physical_map width (MAX_EXPERT_REDUNDANCY + 1)
# what a table balances among remote copies: the GPU's inflow from other nodes (a decode deployment:
# DeepEP's low-latency kernels write every entry over the NIC) or its rows (a prefill deployment:
# the GEMMs dominate); rows of ``zepp_assignment``'s per-GPU load
OBJECTIVES = {"nic": 0, "rows": 1}


@dataclass(frozen=True)
class StaticTable:
    """``slot [G, E]`` int32: the physical (global slot) id each source GPU sends expert ``e`` to."""

    slot: np.ndarray
    relaxation: float
    placement: Placement


@dataclass(frozen=True)
class HashTable:
    """Per (source GPU, expert): ``choices [G, E, m]`` int32 global slots (``-1`` padded) and
    ``counts [G, E, m]`` int32 positions of each in the rank's row; a row of several copies is
    ``width`` long (``counts`` sum to ``width``), a row of one copy is one long."""

    choices: np.ndarray
    counts: np.ndarray
    width: int
    relaxation: float
    placement: Placement
    objective: str = "nic"  # what it was planned with (OBJECTIVES): a re-plan plans the same way


def build_static_table(placement: Placement, demand: np.ndarray, relaxation: float, gpus_per_node: int,
                       objective: str = "nic") -> StaticTable:
    """SGLang's static dispatch map from Zepp's bounds: ``zepp_assignment`` with whole sources."""
    amount = zepp_assignment(placement, demand, relaxation, gpus_per_node, split=False, objective=objective)
    col = amount.argmax(2)
    slot = np.where(amount.sum(2) > 0, placement.replicas[np.arange(placement.num_experts)[None, :], col],
                    _locality_pick(placement))
    return StaticTable(slot.astype(np.int32), float(relaxation), placement)


def zepp_assignment(placement: Placement, demand: np.ndarray, relaxation: float, gpus_per_node: int,
                    split: bool, objective: str = "nic") -> np.ndarray:
    """``[G, E, C]`` int64 units of each source's expected demand sent to each copy (column ``c`` of
    ``placement.replicas``) under Zepp's upper bounds (see the module docstring). ``split``: a
    source may spread over several copies (vLLM's shares); else each source goes whole to one copy
    (SGLang's map). ``objective``: among remote copies, the one whose GPU so far receives least
    from other nodes (``"nic"``) or computes fewest rows (``"rows"``)."""
    units = _demand_units(_check_demand(placement, demand, gpus_per_node))  # [G, E] int64
    G, E = units.shape
    reps = placement.replicas.astype(np.int64)
    node = np.arange(G) // placement.gpus_per_node
    home = reps[:, 0] // placement.slots_per_rank  # [E] the GPU of each expert's first copy
    amount = np.zeros((G, E, reps.shape[1]), np.int64)
    single = placement.replica_count == 1
    amount[:, single, 0] = units[:, single]
    far = node[:, None] != node[home][None, :]  # [G, E]
    # per GPU: [entries from other nodes, rows] so far, the experts with one copy first
    gpu_load = np.stack([np.bincount(home[single], weights=(units * far)[:, single].sum(0), minlength=G),
                         np.bincount(home[single], weights=units[:, single].sum(0), minlength=G)]).astype(np.int64)
    key = OBJECTIVES[objective]
    multi = np.flatnonzero(~single)
    for e in multi[np.argsort(-units[:, multi].sum(0), kind="stable")]:
        amount[:, e] = _assign_expert(units[:, e], reps[e][reps[e] >= 0], placement, relaxation, gpu_load, key,
                                      split)
    return amount


def _assign_expert(d: np.ndarray, reps: np.ndarray, placement: Placement, relaxation: float, gpu_load: np.ndarray,
                   key: int, split: bool) -> np.ndarray:
    """One expert's ``[G, C]`` units per (source, copy) from the demand ``d [G]`` over its copies
    ``reps [c]``; ``gpu_load [2, G]`` (inflow from other nodes, rows) gains what each copy's GPU gets;
    remote copies are chosen by ``gpu_load[key]``."""
    S, L = placement.slots_per_rank, placement.gpus_per_node
    gpus = reps // S
    _, upper = expert_load_bounds(np.array([d.sum()]), np.array([reps.size]), relaxation)
    cap = int(upper[0])
    load = np.zeros(reps.size, np.int64)
    out = np.zeros((d.size, placement.replicas.shape[1]), np.int64)
    src = np.arange(d.size)
    level = np.where(gpus[None, :] == src[:, None], 0, np.where(gpus[None, :] // L == (src // L)[:, None], 1, 2))
    for g in np.lexsort((-d, level.min(1))):  # the nearest sources first, the largest first within a level
        left = int(d[g])
        for lev in range(int(level[g].min()), 3):
            while left > 0:
                room = cap - load
                fits = (level[g] == lev) & ((room > 0) if split else (room >= left))
                if not fits.any():
                    break
                cand = np.flatnonzero(fits)
                i = int(cand[np.argmin(gpu_load[key, gpus[cand]] if lev == 2 else load[cand])])
                left -= _give(out, load, gpu_load, g, i, min(left, int(room[i])), gpus, lev == 2)
        if left > 0:
            i = int(np.argmin(load))
            _give(out, load, gpu_load, g, i, left, gpus, level[g, i] == 2)
    return out


def _give(out, load, gpu_load, g: int, i: int, units: int, gpus, remote: bool) -> int:
    out[g, i] += units
    load[i] += units
    gpu_load[0, gpus[i]] += units if remote else 0
    gpu_load[1, gpus[i]] += units
    return units


def build_hash_table(placement: Placement, demand: np.ndarray, relaxation: float, gpus_per_node: int,
                     width: int = VLLM_WIDTH, objective: str = "nic") -> HashTable:
    """vLLM's per-rank rows: ``zepp_assignment`` with split sources, each (source, expert)'s shares
    in whole positions of a row ``width`` long (a power of two); see the module docstring."""
    if width < 1 or width & (width - 1):
        raise ValueError(f"width must be a power of two, got {width}")
    amount = zepp_assignment(placement, demand, relaxation, gpus_per_node, split=True, objective=objective)
    total = amount.sum(2, keepdims=True)
    cum = np.cumsum(amount, axis=2) * width // np.maximum(total, 1)
    counts = np.diff(cum, axis=2, prepend=0)
    G, E, C = amount.shape
    choices = np.broadcast_to(placement.replicas[None], (G, E, C)).astype(np.int64)
    none = total[:, :, 0] == 0  # no expected demand: the nearest copy
    choices = np.where(none[:, :, None], -1, choices)
    choices[:, :, 0] = np.where(none, _locality_pick(placement), choices[:, :, 0])
    counts[none] = 0
    keep = counts > 0
    keep[:, :, 0] |= none
    order = np.argsort(~keep, axis=2, kind="stable")  # copies with positions first
    counts = np.take_along_axis(np.where(keep, counts, 0), order, 2)
    choices = np.where(np.take_along_axis(keep, order, 2), np.take_along_axis(choices, order, 2), -1)
    counts[(counts > 0).sum(2) <= 1] = 0
    counts[:, :, 0] = np.where((choices >= 0).sum(2) == 1, 1, counts[:, :, 0])
    m = max(1, int((choices >= 0).sum(2).max()))
    return HashTable(choices[:, :, :m].astype(np.int32), counts[:, :, :m].astype(np.int32), int(width),
                     float(relaxation), placement, objective)


def build_prefill_static_table(placement: Placement, demand: np.ndarray, relaxation: float,
                               gpus_per_node: int) -> StaticTable:
    """``build_static_table`` for a prefill deployment (remote copies by their GPU's rows)."""
    return build_static_table(placement, demand, relaxation, gpus_per_node, objective="rows")


def build_prefill_hash_table(placement: Placement, demand: np.ndarray, relaxation: float,
                             gpus_per_node: int) -> HashTable:
    """``build_hash_table`` for a prefill deployment (remote copies by their GPU's rows)."""
    return build_hash_table(placement, demand, relaxation, gpus_per_node, objective="rows")


def _bit_reverse(x: np.ndarray, bits: int) -> np.ndarray:
    x = np.asarray(x, np.int64)
    out = np.zeros_like(x)
    for b in range(bits):
        out |= ((x >> b) & 1) << (bits - 1 - b)
    return out


def _hash_choice(table: HashTable, src: np.ndarray, e: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The copy's column in ``table.choices[src, e]`` for token rows ``rows`` (all ``[n]``)."""
    W = table.width
    cnt = table.counts[src, e]  # [n, m]
    quantile = _bit_reverse((rows + e) % W, W.bit_length() - 1)
    col = (np.cumsum(cnt, axis=1) <= quantile[:, None]).sum(1)
    return np.where(cnt.sum(1) == 1, 0, np.minimum(col, cnt.shape[1] - 1))


def hash_rows(table: HashTable, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s vLLM maps: ``logical_to_physical_map [E, width]`` (``-1`` padded) and
    ``logical_replica_count [E]`` int64."""
    E, W = table.choices.shape[1], table.width
    count = table.counts[rank].sum(1).astype(np.int64)  # 1 or W
    inverse = pow(KNUTH, -1, W)
    p = np.arange(W)
    t0 = (p * inverse) % W  # the token rows (mod W) that land on position p
    e = np.repeat(np.arange(E), W)
    col = _hash_choice(table, np.full(e.size, rank), e, np.tile(t0, E)).reshape(E, W)
    l2p = np.take_along_axis(table.choices[rank].astype(np.int64), col, 1)
    l2p[:, 1:] = np.where(count[:, None] > 1, l2p[:, 1:], -1)
    return l2p, count


def route_sglang_table(topk_ids: np.ndarray, table: StaticTable) -> Routing:
    R, T, k = topk_ids.shape
    src = np.repeat(np.arange(R), T * k).reshape(topk_ids.shape)
    return slot_routing(topk_ids, table.slot[src, np.maximum(topk_ids, 0)], table.placement)


def route_vllm_table(topk_ids: np.ndarray, table: HashTable) -> Routing:
    R, T, k = topk_ids.shape
    src = np.repeat(np.arange(R), T * k)
    e = np.maximum(topk_ids, 0).ravel().astype(np.int64)
    rows = np.repeat(local_rows(topk_ids).ravel(), k)
    col = _hash_choice(table, src, e, rows)
    return slot_routing(topk_ids, table.choices[src, e, col].reshape(topk_ids.shape), table.placement)
