"""vLLM's replica choice, as vLLM 0.33.0 makes it.

What vLLM does (read in its wheel: ``vllm/model_executor/layers/fused_moe/router/base_router.py``,
the Triton kernel ``_eplb_map_and_record_i32_kernel``; ``vllm/distributed/eplb/eplb_state.py``,
``compute_logical_maps``), in our words; tests/engines runs vLLM's kernel on the CPU against
``hash_slots``:

- every rank holds ``logical_to_physical_map [E, W]`` (an expert's physical ids, ``-1`` padded;
  vLLM lists the copies in ascending physical id) and ``logical_replica_count [E]``;
- the entry of expert ``e`` in row ``t`` of the rank's own batch (its ``t``-th token) takes the
  physical id ``logical_to_physical_map[e, ((t * 2654435769) mod 2**32) mod count[e]]``.

The same row index on every rank: no locality, and at decode the token rows ``0, 1, ...`` of
every rank pick the same copies. A rank's rows are its present tokens in order (a token whose
ids are all ``-1`` is absent from the engine's batch). ``route_vllm_hash``: EPLB's maps, every
rank the same; Zepp's per-rank rows are ``zepp.planner.routing.engine_tables``.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.base_routing import slot_routing
from zepp.planner.types import Placement, Routing

__all__ = ["KNUTH", "hash_index", "local_rows", "hash_slots", "route_vllm_hash"]

KNUTH = 2654435769  # floor(2**32 / golden ratio), vLLM's multiplier
MASK32 = 0xFFFFFFFF


def hash_index(rows: np.ndarray, count: np.ndarray) -> np.ndarray:
    """vLLM's column ``((rows * 2654435769) mod 2**32) mod count`` (int64 throughout)."""
    return ((np.asarray(rows, np.int64) * KNUTH) & MASK32) % np.maximum(np.asarray(count, np.int64), 1)


def local_rows(topk_ids: np.ndarray) -> np.ndarray:
    """``[R, T]`` each token's row in its rank's batch: the present tokens (any id ``>= 0``) counted in order."""
    present = (np.asarray(topk_ids) >= 0).any(axis=2)
    return np.cumsum(present, axis=1) - 1


def hash_slots(ids: np.ndarray, rows: np.ndarray, l2p: np.ndarray, count: np.ndarray) -> np.ndarray:
    """One rank's physical ids: ``ids [T, k]`` logical (``-1``: missing), ``rows [T]`` the tokens'
    rows, ``l2p [E, W]`` and ``count [E]`` the rank's maps."""
    e = np.maximum(ids, 0)
    col = hash_index(np.broadcast_to(np.asarray(rows)[:, None], ids.shape), count[e])
    return np.where(ids < 0, -1, l2p[e, col])


def route_vllm_hash(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    """vLLM over EPLB's maps: copies in ascending slot order (``placement.replicas``), every rank alike."""
    rows = local_rows(topk_ids)[:, :, None]
    e = np.maximum(topk_ids, 0)
    col = hash_index(rows, placement.replica_count[e])
    return slot_routing(topk_ids, placement.replicas[e, col], placement)
