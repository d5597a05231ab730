"""Zepp's routing handed to an engine in the engine's own tables, planned once per placement from
the history's expected demand ``demand [G, E]`` (entries per step from source GPU ``g`` to expert
``e``) under Zepp's relaxed replica-load bounds ``[(1-C) q, (1+C) q]``, ``q = D_e / c_e``:

- ``StaticTable`` (SGLang's static dispatch: ``logical_to_rank_dispatch_physical_map``): one copy
  per (source GPU, expert), an integer assignment (``build_static_table``). Experts by falling
  demand; per expert, the sources on a copy's GPU, then on a copy's node, take that copy while it
  stays under ``ceil((1+C) q)``; every other source, largest first, takes the copy under the bound
  whose GPU receives least from other nodes so far (the busiest NIC carries least), or the least
  loaded copy when none is under it. A pair without demand takes the nearest copy (own GPU, own
  node, else the ``(source mod count)``-th).
- ``HashTable`` (vLLM's ``logical_to_physical_map`` row and ``logical_replica_count`` per rank):
  Zepp's fractional routing table (``table_routing.build_routing_table``: water-fill over the
  expected demand, in locality order) with each (source, expert)'s shares in whole positions of
  a row ``width`` long (a power of two, at most vLLM's map width; ``build_hash_table``). vLLM
  takes position ``((t * 2654435769) mod 2**32) mod width`` for the rank's token row ``t``, which
  for a power-of-two width is ``t * 2654435769 mod width``, a bijection of ``t mod width``: the
  row is laid out so that token row ``t`` meets copy ``j`` where the bit-reversal of
  ``(t + e) mod width`` falls in copy ``j``'s share, so every run of consecutive token rows takes
  each copy in proportion to its share. A pair with one copy gets a row of one (count 1).

``route_sglang_table`` / ``route_vllm_table`` route a batch exactly as the engine does with the
tables; ``hash_rows`` writes one rank's vLLM rows (tests/engines passes them through vLLM's own
kernel). Every rank computes the same tables (integer arithmetic after the water-fill's units).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.routing.base_routing import slot_routing
from zepp.planner.routing.table_routing import (SHARE_ONE, _check_demand, _demand_units, _locality_pick,
                                                build_routing_table)
from zepp.planner.routing.vllm_routing import KNUTH, local_rows
from zepp.planner.types import Placement, Routing, expert_load_bounds

__all__ = ["StaticTable", "HashTable", "build_static_table", "build_hash_table", "hash_rows", "route_sglang_table",
           "route_vllm_table", "VLLM_WIDTH"]

VLLM_WIDTH = 1024  # vLLM 0.33.0's logical_to_physical_map width (MAX_EXPERT_REDUNDANCY + 1)


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


def build_static_table(placement: Placement, demand: np.ndarray, relaxation: float,
                       gpus_per_node: int) -> StaticTable:
    """SGLang's static dispatch map from Zepp's bounds (see the module docstring)."""
    units = _demand_units(_check_demand(placement, demand, gpus_per_node))  # [G, E] int64
    slot = _locality_pick(placement).astype(np.int64)  # pairs without demand: the nearest copy
    gpu_of = np.arange(placement.slot_expert.size) // placement.slots_per_rank
    single = placement.replica_count == 1
    node = np.arange(placement.ranks) // placement.gpus_per_node
    # what the experts with one copy bring to each GPU from other nodes (dispatch in, combine out)
    far = node[:, None] != node[gpu_of[placement.replicas[:, 0]]][None, :]  # [G, E]
    inflow = np.bincount(gpu_of[placement.replicas[single, 0]],
                         weights=(units[:, single] * far[:, single]).sum(0), minlength=placement.ranks)
    multi = np.flatnonzero(~single)
    for e in multi[np.argsort(-units[:, multi].sum(0), kind="stable")]:
        _assign_expert(e, units[:, e], placement, relaxation, slot, inflow)
    return StaticTable(slot.astype(np.int32), float(relaxation), placement)


def _assign_expert(e: int, d: np.ndarray, placement: Placement, relaxation: float, slot: np.ndarray,
                   inflow: np.ndarray) -> None:
    """Assign every source with demand ``d [G]`` of expert ``e`` to one copy (``slot[:, e]``),
    adding the remote demand to ``inflow [G]`` per receiving GPU."""
    reps = placement.replicas[e][placement.replicas[e] >= 0].astype(np.int64)
    S, L = placement.slots_per_rank, placement.gpus_per_node
    gpus = reps // S
    _, upper = expert_load_bounds(np.array([d.sum()]), np.array([reps.size]), relaxation)
    load = np.zeros(reps.size, np.int64)
    src = np.arange(d.size)
    level = np.where(gpus[None, :] == src[:, None], 0, np.where(gpus[None, :] // L == (src // L)[:, None], 1, 2))
    best = level.min(1)  # [G]: 0 own GPU, 1 own node, 2 remote only
    for g in np.lexsort((-d, best)):  # the nearest sources first, the largest first within a level
        if d[g] == 0:
            continue
        near = np.flatnonzero((level[g] == best[g]) & (load + d[g] <= upper[0])) if best[g] < 2 else []
        if len(near):
            i = int(near[np.argmin(load[near])])
        else:
            fits = np.flatnonzero((level[g] == 2) & (load + d[g] <= upper[0]))
            i = int(fits[np.argmin(inflow[gpus[fits]])]) if fits.size else int(np.argmin(load))
        load[i] += d[g]
        if gpus[i] // L != g // L:
            inflow[gpus[i]] += d[g]
        slot[g, e] = reps[i]


def build_hash_table(placement: Placement, demand: np.ndarray, relaxation: float, gpus_per_node: int,
                     width: int = VLLM_WIDTH) -> HashTable:
    """vLLM's per-rank rows from Zepp's routing table (see the module docstring); ``width`` a
    power of two."""
    if width < 1 or width & (width - 1):
        raise ValueError(f"width must be a power of two, got {width}")
    t = build_routing_table(placement, demand, relaxation, gpus_per_node)
    cum = np.rint(t.shares.astype(np.int64) * width / SHARE_ONE).astype(np.int64)  # [G, E, m]
    counts = np.diff(cum, axis=2, prepend=0) * (t.choices >= 0)
    keep = counts > 0
    order = np.argsort(~keep, axis=2, kind="stable")  # copies with positions first, in visit order
    counts = np.take_along_axis(counts, order, 2)
    choices = np.where(np.take_along_axis(keep, order, 2), np.take_along_axis(t.choices, order, 2), -1)
    alone = (counts > 0).sum(2) == 1
    counts[alone, 0] = 1
    m = max(1, int((choices >= 0).sum(2).max()))
    return HashTable(choices[:, :, :m].astype(np.int32), counts[:, :, :m].astype(np.int32), int(width),
                     float(relaxation), placement)


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
