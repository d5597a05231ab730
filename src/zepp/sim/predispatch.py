"""Pre-dispatch: the rows whose destination no per-batch plan can change leave during planning
(``Mechanics.predispatch``).

A row of token ``(owner, token)`` must reach GPU ``y`` whatever the planner decides when one of
the token's experts has a single copy in the placement and that copy is on ``y``; if ``y`` is
in the owner's node, Zepp's flows send it straight over NVLink (no relay, no NIC split to
choose). Such a row can therefore leave once the gate has chosen the experts and the loads are
gathered, while the planner runs: every receiver learns from the gathered ``[W, E]`` loads
exactly how many rows each sender sends it for each single-copy expert, so it can lay out a
receive region for them before the plan exists (a real implementation: one extra DeepEP-style
intra-node dispatch call, launched after the gather, into a region of the receive buffer sized
from those counts; the planned dispatch fills the rest).
"""

from __future__ import annotations

import numpy as np

from zepp.planner.types import Hops


def single_copy_slots(placement) -> np.ndarray:
    """``[R * S]`` bool: slots holding an expert that has exactly one copy in ``placement``."""
    se = placement.slot_expert.ravel()
    return (se >= 0) & (placement.replica_count[np.maximum(se, 0)] == 1)


def plan_free_hops(h: Hops, owner: np.ndarray, token: np.ndarray, comp: np.ndarray, slot: np.ndarray,
                   single: np.ndarray, ranks: int, tokens: int, gpus_per_node: int) -> np.ndarray:
    """``[M]`` bool: dispatch hops of ``h`` that move a row straight from its owner to a GPU of
    the owner's node holding the single copy of one of the token's experts. Entries: ``owner,
    token, comp, slot [n]``; ``single [R * S]`` (``single_copy_slots``)."""
    fixed = single[slot]
    need = np.unique((comp[fixed].astype(np.int64) * ranks + owner[fixed]) * tokens + token[fixed])
    key = (h.dst.astype(np.int64) * ranks + h.owner) * tokens + h.token
    direct = (h.stage == 0) & (h.src == h.owner) & (h.src // gpus_per_node == h.dst // gpus_per_node)
    return direct & np.isin(key, need)
