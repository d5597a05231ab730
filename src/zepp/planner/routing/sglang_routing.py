"""SGLang's replica choice with an all-to-all backend (DeepEP), as SGLang 0.5.23 makes it.

What SGLang does (read in its wheel: ``sglang/srt/eplb/expert_location.py``,
``expert_location_dispatch.py``), in our words; tests/engines checks every function here against
SGLang's own on random placements:

- **Candidate lists.** Loading a ``physical_to_logical_map`` (``--init-expert-location``), every
  rank lists each expert's copies in ascending physical id and, with an all-to-all backend,
  shrinks its own list to one nearby copy: the only copy if there is one, else the first copy on
  its own GPU, else the first copy on its node where that excludes some copies; a rank with no
  nearby copy keeps every copy (``candidate_lists``). An EPLB rebalance (``--enable-eplb``)
  replaces the lists with unshrunk ones (not modelled here).
- **static** (the default): one fixed copy per (rank, expert), the rank's nearby copy; a rank
  without one gets a *fair* pick: for each expert (layers in order, experts in order) whose
  remaining ranks are ``k``, the copies are repeated ``k // c`` times, ``k mod c`` more are sampled
  without replacement and the list is shuffled, all from one ``random.Random(42)`` per rank and
  map computation; remaining ranks take the shuffled list in rank order (``static_dispatch_map``).
  A rank's stream only advances on the experts it has no nearby copy of.
- **dynamic**: per entry ``draw mod len(list)`` over the rank's list, ``draw`` a uniform 16-bit
  integer (SGLang: ``torch.randint(0, 65536)``; here the routing's integer entry hash, so every
  rank draws the same) (``dynamic_pick``).
- **lp**: the LP over every copy (``zepp.planner.routing.lp_routing.lp_shares``), each entry
  drawing from its rank's list with the LP's shares (a shrunk list: its one copy).

A placement here is one layer (``Placement``); the routings model it as the first MoE layer of
the map, where SGLang's ``Random(42)`` starts (``static_dispatch_map`` takes every layer of a map).
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np

from zepp.planner.routing.base_routing import entry_hash, slot_routing
from zepp.planner.types import Placement, Routing

__all__ = ["candidate_lists", "nearest_copy", "static_dispatch_map", "fair_choices", "dynamic_pick",
           "route_sglang_static", "route_sglang_dynamic", "route_sglang_lp", "SEED"]

SEED = 42  # SGLang's compute_logical_to_rank_dispatch_physical_map default
DRAW_SHIFT = 15  # entry_hash is in [0, 2**31): its top 16 bits are the dynamic draw


def nearest_copy(p2l: np.ndarray, num_experts: int, ranks: int, gpus_per_node: int) -> np.ndarray:
    """``[R, E]`` each rank's nearby copy of each expert in one layer's map ``p2l [P]`` (global
    slot ids, rank-major, ``P / R`` per rank): the only copy, else the first (lowest) on the
    rank's GPU, else the first on its node when the node holds some but not all copies; ``-1``
    where the rank has none."""
    p2l = np.asarray(p2l, np.int64)
    S = p2l.size // ranks
    reps = Placement(p2l.reshape(ranks, S), num_experts, gpus_per_node).replicas.astype(np.int64)  # [E, C]
    valid = reps >= 0
    count = valid.sum(1)  # [E]
    gpu = np.where(valid, reps // S, -1)
    node = np.where(valid, gpu // gpus_per_node, -1)
    q = np.arange(ranks)[:, None, None]
    on_gpu = valid[None] & (gpu[None] == q)  # [R, E, C]
    on_node = valid[None] & (node[None] == q // gpus_per_node)
    n_node = on_node.sum(2)
    first = lambda m: np.take_along_axis(np.broadcast_to(reps, m.shape), m.argmax(2)[..., None], 2)[..., 0]  # noqa: E731
    out = np.where(on_gpu.any(2), first(on_gpu), np.where((n_node > 0) & (n_node < count), first(on_node), -1))
    return np.where(count[None] == 1, reps[None, :, 0], out)


def candidate_lists(placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's candidate copies: ``lists [R, E, C]`` global slots (the nearby copy alone, or
    every copy ascending; ``-1`` padded) and ``num_valid [R, E]``."""
    near = nearest_copy(placement.slot_expert.ravel(), placement.num_experts, placement.ranks,
                        placement.gpus_per_node)
    reps = placement.replicas
    full = np.broadcast_to(reps[None], (placement.ranks, *reps.shape))
    alone = np.full_like(full, -1)
    alone[..., 0] = near
    lists = np.where((near >= 0)[..., None], alone, full).astype(np.int32)
    return lists, (lists >= 0).sum(2)


def fair_choices(copies: list[int], k: int, rng: random.Random) -> list[int]:
    """``k`` picks from ``copies``, each copy ``k // c`` times plus ``k mod c`` distinct ones drawn
    by ``rng.sample``, then shuffled by ``rng.shuffle`` (the order every rank's stream follows)."""
    whole, extra = divmod(k, len(copies))
    picks = copies * whole + rng.sample(copies, k=extra)
    rng.shuffle(picks)
    return picks


def static_dispatch_map(p2l: np.ndarray, num_experts: int, ranks: int, gpus_per_node: int) -> np.ndarray:
    """SGLang's static dispatch map of every rank for a map ``p2l [layers, P]`` loaded from a
    file: ``[R, layers, E]`` physical ids (what ``logical_to_rank_dispatch_physical_map`` holds on
    each rank). Ranks whose streams visit the same experts share one computation."""
    p2l = np.atleast_2d(np.asarray(p2l, np.int64))
    near = np.stack([nearest_copy(row, num_experts, ranks, gpus_per_node) for row in p2l], 1)  # [R, Lyr, E]
    out = near.copy()
    drawn = near < 0  # [R, Lyr, E]: where a rank draws (its list holds every copy)
    groups: dict[bytes, list[int]] = {}
    for q in range(ranks):
        groups.setdefault(np.packbits(drawn[q]).tobytes(), []).append(q)
    for members in groups.values():
        _draw_group(p2l, near, drawn[members[0]], members, out)
    return out


def _draw_group(p2l: np.ndarray, near: np.ndarray, visits: np.ndarray, members: list[int], out: np.ndarray) -> None:
    """One stream (``Random(SEED)``) over the (layer, expert) pairs in ``visits [Lyr, E]``; each
    member rank takes its place among the expert's remaining ranks."""
    rng = random.Random(SEED)
    for layer, e in zip(*np.nonzero(visits)):
        copies = np.flatnonzero(p2l[layer] == e).tolist()
        remaining = np.flatnonzero(near[:, layer, e] < 0)
        picks = fair_choices(copies, len(remaining), rng)
        where = np.searchsorted(remaining, members)
        out[members, layer, e] = np.asarray(picks, np.int64)[where]


_STATIC_CACHE: OrderedDict = OrderedDict()


def _static_table(placement: Placement) -> np.ndarray:
    """``[R, E]`` the static map of one placement (the map's first layer), cached per placement."""
    key = (placement.slot_expert.tobytes(), placement.slot_expert.shape, placement.num_experts,
           placement.gpus_per_node)
    if key not in _STATIC_CACHE:
        m = static_dispatch_map(placement.slot_expert.ravel()[None], placement.num_experts, placement.ranks,
                                placement.gpus_per_node)[:, 0]
        _STATIC_CACHE[key] = m.astype(np.int32)
        while len(_STATIC_CACHE) > 16:
            _STATIC_CACHE.popitem(last=False)
    return _STATIC_CACHE[key]


def dynamic_pick(lists: np.ndarray, num_valid: np.ndarray, ids: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """One rank's dynamic dispatch: ``ids [...]`` logical ids (``-1``: missing), ``draws [...]``
    integers; ``lists [E, C]`` / ``num_valid [E]`` the rank's candidates. Returns physical ids."""
    e = np.maximum(ids, 0)
    col = np.asarray(draws, np.int64) % num_valid[e]
    return np.where(ids < 0, -1, lists[e, col])


def _sources(topk_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(e [n], src [n])``: each entry's expert (``-1`` as 0) and source rank."""
    R, T, k = topk_ids.shape
    return np.maximum(topk_ids.ravel(), 0).astype(np.int64), np.repeat(np.arange(R, dtype=np.int64), T * k)


def route_sglang_static(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    e, src = _sources(topk_ids)
    return slot_routing(topk_ids, _static_table(placement)[src, e].reshape(topk_ids.shape), placement)


def route_sglang_dynamic(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    lists, num_valid = candidate_lists(placement)
    e, src = _sources(topk_ids)
    draw = entry_hash(np.arange(e.size, dtype=np.int64)) >> DRAW_SHIFT
    col = draw % num_valid[src, e]
    return slot_routing(topk_ids, lists[src, e, col].reshape(topk_ids.shape), placement)


def route_sglang_lp(topk_ids: np.ndarray, placement: Placement, relaxation: float, vacate_rounds: int) -> Routing:
    """SGLang's lp: the LP's shares over every copy, each entry drawing among its rank's candidates
    (``zepp.planner.routing.lp_routing.share_draw``, one candidate list per (rank, expert))."""
    from zepp.planner.routing.lp_routing import lp_shares, share_draw

    share, _ = lp_shares(topk_ids, placement)
    lists, _ = candidate_lists(placement)  # [R, E, C]
    e, src = _sources(topk_ids)
    slot = share_draw(share, lists.reshape(-1, lists.shape[-1]), src * placement.num_experts + e)
    return slot_routing(topk_ids, slot.reshape(topk_ids.shape), placement)
