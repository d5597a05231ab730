"""The routings that pick a replica per entry from the placement alone (no load bounds):

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

Each ``route_<name>(topk_ids [R, T, k], placement, relaxation, vacate_rounds)`` returns a
``Routing``; ``relaxation`` and ``vacate_rounds`` are the stage's arguments, unused here.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.base_routing import entry_hash, position_in_group, slot_routing
from zepp.planner.types import Placement, Routing


def route_home(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    return slot_routing(topk_ids, placement.replicas[topk_ids, 0], placement)


def route_replica_rr(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    flat = topk_ids.ravel()
    key = np.where(flat >= 0, flat, placement.num_experts)  # missing entries: a group of their own
    pos = position_in_group(key, placement.num_experts + 1)
    e = np.maximum(flat, 0)
    idx = pos % placement.replica_count[e]
    return slot_routing(topk_ids, placement.replicas[e, idx].reshape(topk_ids.shape).astype(np.int32), placement)


def route_locality(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    return slot_routing(topk_ids, _choice(topk_ids, placement, prefer_local=True, per_source=True), placement)


def route_fixed(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    return slot_routing(topk_ids, _choice(topk_ids, placement, prefer_local=False, per_source=True), placement)


def route_dynamic(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    return slot_routing(topk_ids, _choice(topk_ids, placement, prefer_local=True, per_source=False), placement)


def route_random(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    return slot_routing(topk_ids, _choice(topk_ids, placement, prefer_local=False, per_source=False), placement)


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
    their global slots ``[n]``. The candidates depend on (source rank, expert) only, so they are
    laid out once per pair (``[R, E, C]``, in replica order) and each entry picks one by index."""
    if not prefer_local:  # every replica, in replica order: the valid ones are a prefix
        return placement.replicas[e, h % placement.replica_count[e]]
    S, L = placement.slots_per_rank, placement.gpus_per_node
    reps = placement.replicas  # [E, C] global slots, -1 padded
    rank = np.arange(placement.ranks)[:, None, None]
    rr = np.where(reps >= 0, reps // S, -1)[None]  # [1, E, C]
    level = np.where(rr == rank, 0, np.where(rr // L == rank // L, 1, 2))
    level = np.where(reps[None] >= 0, level, 3)
    valid = level == level.min(axis=2, keepdims=True)  # [R, E, C]
    order = np.argsort(~valid, axis=2, kind="stable")  # the candidates first, in replica order
    cand = np.take_along_axis(np.broadcast_to(reps, valid.shape), order, axis=2)
    pair = src * placement.num_experts + e
    cnt = valid.sum(axis=2).ravel()[pair]
    C = reps.shape[1]
    return cand.reshape(-1)[pair * C + h % cnt]
