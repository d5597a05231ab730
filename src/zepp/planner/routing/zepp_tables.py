"""A placement's static tables for Zepp's routing (``zepp_assign``, ``zepp_vacate``), built once
per placement and cached: which experts have several replicas, each expert's first replica and
its node, the replicas per node (``replica_on_node``) and as node bit masks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.placement_cache import PlacementCache
from zepp.planner.types import Placement

MASK_NODES = 62  # node bit masks fit an int64 (the torch twin's) up to here


@dataclass(frozen=True)
class ZeppTables:
    """A placement's static tables for Zepp's routing (``zepp_tables`` caches them).

    ``multi [M]``: experts with several replicas; ``slot_of [E+1]`` int32 and ``node_of [E+1]``:
    per expert at index ``e + 1``, its replica 0 and that replica's node (index 0: a missing
    entry, slot ``-1``); ``node_code_of [E+1]``: ``node_of`` with the sign bit set where the expert has
    a single replica (``single_bit``: the vacate pass reads which entries can never move off the same
    gather as their nodes); ``multi_slots [M, C]`` int32: the replicas of ``multi`` (``-1`` padded)
    and ``multi_nodes [M, C]`` their nodes; ``replica_on_node [E, N]`` (``replica_on_node``) and
    ``node_mask [E]`` uint64, bit ``n`` set where expert ``e`` has a replica on node ``n`` (only
    where ``N <= MASK_NODES``, else ``None``).
    """

    placement: Placement
    multi: np.ndarray
    slot_of: np.ndarray
    node_of: np.ndarray
    node_code_of: np.ndarray
    multi_slots: np.ndarray
    multi_nodes: np.ndarray
    replica_on_node: np.ndarray
    node_mask: np.ndarray | None


_TABLES = PlacementCache()


def zepp_tables(placement: Placement) -> ZeppTables:
    """The cached ``ZeppTables`` of ``placement`` (8 kept)."""
    return _TABLES.get(placement, lambda: _build_tables(placement))


def _build_tables(placement: Placement) -> ZeppTables:
    SL = placement.slots_per_rank * placement.gpus_per_node
    node_dtype = np.int8 if placement.nodes < 127 else np.int16
    multi = np.flatnonzero(placement.replica_count > 1)
    slot_of = np.concatenate(([-1], placement.replicas[:, 0])).astype(np.int32)
    multi_slots = placement.replicas[multi].astype(np.int32)
    ron = replica_on_node(placement)
    mask = None
    if placement.nodes <= MASK_NODES:
        mask = ((ron >= 0).astype(np.uint64) << np.arange(placement.nodes, dtype=np.uint64)).sum(1, np.uint64)
    node_of = (np.maximum(slot_of, 0) // SL).astype(node_dtype)
    code = node_of.copy()
    code[1:][placement.replica_count == 1] |= single_bit(node_dtype)
    return ZeppTables(placement, multi, slot_of, node_of, code, multi_slots,
                      (np.maximum(multi_slots, 0) // SL).astype(node_dtype), ron, mask)


def single_bit(dtype) -> int:
    """The sign bit of the signed integer type ``dtype``: set in a node code where the entry's
    expert has a single replica (the node is the code with it cleared)."""
    return np.iinfo(dtype).min


def replica_on_node(placement: Placement) -> np.ndarray:
    """``[E, N]`` int32: the lowest global slot of expert ``e`` on node ``n``, or ``-1``."""
    S, L, E = placement.slots_per_rank, placement.gpus_per_node, placement.num_experts
    N = placement.ranks // L
    reps = placement.replicas
    rep_node = np.where(reps >= 0, reps // S // L, N)
    table = np.full((E, N + 1), -1, np.int32)
    ee = np.repeat(np.arange(E), reps.shape[1])
    order = np.argsort(-reps.ravel(), kind="stable")  # highest slot first, so the lowest wins
    table[ee[order], rep_node.ravel()[order]] = reps.ravel()[order]
    return table[:, :N]
