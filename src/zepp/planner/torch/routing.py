"""Routing in torch: the numpy planner's routing choices (``zepp.planner.routing``), element for element.

This module holds the placement's device tables, the batch check, the ``{name: function}``
table of the torch routings (``TORCH_ROUTINGS`` its names) and the simple choices; Zepp's
water-fill and vacate pass are in ``zepp.planner.torch.zepp_routing``.

Every function takes ``topk_ids [R, T, k]`` as an integer tensor on any device and returns
``slot [R, T, k]`` int32 on the same device, equal to ``zepp.planner.routing.route``'s. An id of ``-1``
is a missing entry (slot ``-1``, no load).

What runs where:

- Per placement, once (``DevicePlacement``): the placement's static tables (replica lists,
  visit orders, replicas per node) are built with numpy on the host and copied
  to the device; a placement changes between batches only after swaps.
- Per batch, on the device: everything else, as tensor operations of fixed shapes with integer
  arithmetic. Loop trip counts depend only on the placement and the shapes: the water-fill runs
  ``(4 C + 4)`` sweeps of ``C`` visit steps (``C`` = most replicas of any expert; the numpy
  planner's bound), the vacate pass ``vacate_rounds`` rounds.

``sync`` chooses whether the planner may read a value back to the host:

- ``sync=False`` (the default while a CUDA graph is being captured): no host read at all, so the routing can be
  captured in a CUDA graph for a fixed batch shape. The water-fill runs its full fixed number of
  steps; steps after the demand is placed take nothing (proved: ``take <= remaining = 0``), and
  a vacate round after the numpy planner would have stopped is masked off by a device flag, so
  the result is the same as the numpy planner's early-exiting loops.
- ``sync=True`` (the default, except while a CUDA graph is being captured): the same loops stop
  as soon as the numpy planner's would (nothing left to place, no vacate move left; a few host
  reads, free on the CPU and a few tens of microseconds each on a GPU, much less than the
  kernel launches of the steps they skip), the vacate pass compacts its candidates like the
  numpy planner, and the batch is checked like ``zepp.planner.routing.check_batch`` (ids in ``[-1, E)``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from zepp.errors import ZeppInputError
from zepp.planner.routing import ROUTINGS
from zepp.planner.routing.base_routing import HASH_ADD, HASH_MOD, HASH_MUL
from zepp.planner.routing.zepp_routing import visit_order
from zepp.planner.routing.zepp_vacate import replica_on_node
from zepp.planner.torch._ops import I64, arange, position_in_group
from zepp.planner.torch.tables import TorchRouting
from zepp.planner.torch.zepp_routing import vacate, water_fill
from zepp.planner.types import Placement


class DevicePlacement:
    """A placement's static tables on ``device`` (built once per placement and device).

    ``replicas [E, C]`` int64 global slots (-1 padded), ``count [E]``, and for the water-fill the experts
    with several replicas ``multi [M]``, ``multi_index [E+1]`` (-1 elsewhere and for id -1),
    ``visit_flat [R, M, C]`` (flat index ``m*C + replica`` of each source's v-th visit) and
    ``valid_multi [M, C]``; for the vacate pass ``replica_on_node [E, N]`` (the lowest slot of e
    on node n, else -1).
    """

    def __init__(self, placement: Placement, device):
        p = placement
        self.placement = p
        self.device = torch.device(device)
        R, S = p.slot_expert.shape
        L = p.gpus_per_node
        E = p.num_experts
        self.R, self.S, self.L, self.N, self.E = R, S, L, R // L, E
        reps = p.replicas.astype(np.int64)
        self.C = reps.shape[1]
        t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=I64, device=self.device)  # noqa: E731
        self.replicas = t(reps)
        self.count = t(p.replica_count)
        multi = np.flatnonzero(p.replica_count > 1)
        self.M = multi.size
        self.multi = t(multi)
        mi = np.full(E + 1, -1, np.int64)
        mi[multi] = np.arange(multi.size)
        self.multi_index = t(mi)
        rm = reps[multi]  # [M, C]
        self.reps_multi = t(rm)
        self.valid_multi = torch.as_tensor(rm >= 0, device=self.device)
        self.visit_flat = t(np.arange(multi.size)[None, :, None] * self.C + visit_order(p, multi))
        self.replica_on_node = t(replica_on_node(p))
        self.any_multi = bool(multi.size)


_CACHE: dict[tuple[int, str], DevicePlacement] = {}


def device_placement(placement: Placement, device) -> DevicePlacement:
    """The cached ``DevicePlacement`` of ``placement`` on ``device`` (8 kept)."""
    key = (id(placement), str(torch.device(device)))
    dp = _CACHE.get(key)
    if dp is None or dp.placement is not placement:
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        dp = _CACHE[key] = DevicePlacement(placement, device)
    return dp


def default_sync(t: torch.Tensor) -> bool:
    """Host reads are allowed unless a CUDA graph is being captured on the current stream."""
    return not (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def check_batch(topk_ids: torch.Tensor, placement: Placement, read_values: bool) -> torch.Tensor:
    """Check ``topk_ids [R, T, k]`` (shape and dtype always; values in ``[-1, E)`` only when
    ``read_values``, which reads the data on the host). Returns it as int64."""
    if not isinstance(topk_ids, torch.Tensor):
        raise ZeppInputError(f"the torch planner takes a torch tensor, got {type(topk_ids).__name__}")
    if topk_ids.dim() != 3:
        raise ZeppInputError(f"batch topk_ids must be [ranks, tokens, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[0] != placement.ranks:
        raise ZeppInputError(f"batch has {topk_ids.shape[0]} ranks but the placement has {placement.ranks}")
    if topk_ids.dtype == torch.bool or topk_ids.is_floating_point() or topk_ids.is_complex():
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {topk_ids.dtype}")
    ids = topk_ids.to(I64)
    if read_values and ids.numel():
        bad = (ids < -1) | (ids >= placement.num_experts)
        if bool(bad.any()):
            r, t, j = (int(v) for v in torch.nonzero(bad)[0])
            raise ZeppInputError(
                f"batch entry (rank {r}, token {t}, choice {j}) has expert id {int(ids[r, t, j])}, outside "
                f"[0, {placement.num_experts}) (-1 marks a missing entry); check --experts")
    return ids


def route(name: str, topk_ids: torch.Tensor, placement: Placement, relaxation: float = 0.25,
          vacate_rounds: int = 3, *, sync: bool | None = None, sweeps: int | None = None) -> TorchRouting:
    """Route ``topk_ids [R, T, k]`` (integer tensor, any device) with routing ``name``;
    ``slot [R, T, k]`` int32 on the same device equals ``zepp.planner.routing.route(name, ...)``'s.

    ``sync``: see the module docstring (default: True, except while a CUDA graph is being
    captured on the current stream). ``sweeps``: water-fill sweeps to run without host reads
    (default and maximum: the numpy planner's bound ``4C+4``). Every recorded batch we tried
    needs one; with fewer than the bound, check ``unplaced`` (a device scalar, 0 when complete)
    and re-plan with the default when it is not 0 (``plan_batch`` does).
    """
    if name not in ROUTINGS:
        raise ZeppInputError(f"unknown routing {name!r}; choose one of {', '.join(ROUTINGS)}")
    router = _TORCH_ROUTERS.get(name)
    if router is None:
        raise ZeppInputError(f"routing {name!r} has no torch planner; the torch planner has "
                             f"{', '.join(TORCH_ROUTINGS)} (use the numpy planner)")
    sync = default_sync(topk_ids) if sync is None else bool(sync)
    ids = check_batch(topk_ids, placement, read_values=sync)
    dp = device_placement(placement, ids.device)
    return router(ids, dp, relaxation, vacate_rounds, sync, sweeps)


def _routing(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float | None = None,
             unplaced: torch.Tensor | None = None) -> TorchRouting:
    """The ``TorchRouting`` of ``slot [R, T, k]`` (``-1`` where an entry is missing); ``relaxation``:
    the C whose bounds the routing promises (``zepp.planner.routing.base_routing.slot_routing``)."""
    return TorchRouting(ids.to(torch.int32), torch.where(ids < 0, -1, slot).to(torch.int32), dp.placement, relaxation,
                        unplaced)


# ------------------------------------------------------------------------------------ simple choices


def _route_home(ids, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    return _routing(ids, dp.replicas[ids.clamp_min(0), 0], dp)


def _route_replica_rr(ids, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    flat = ids.reshape(-1)
    key = torch.where(flat >= 0, flat, dp.E)
    pos = position_in_group(key, dp.E + 1)
    e = flat.clamp_min(0)
    idx = pos % dp.count[e]
    return _routing(ids, dp.replicas[e, idx].reshape(ids.shape), dp)


def _chooser(prefer_local: bool, per_source: bool) -> Callable:
    """The router of a ``_choice`` routing (``locality``, ``fixed``, ``dynamic``, ``random``)."""
    def router(ids, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
        return _routing(ids, _choice(ids.clamp_min(0), dp, prefer_local, per_source), dp)
    return router


def entry_hash(index: torch.Tensor) -> torch.Tensor:
    """``zepp.planner.routing.entry_hash`` in torch: ``[n]`` int64 -> ``[n]`` int64 in ``[0, 2**31)``."""
    x = index.to(I64) % HASH_MOD
    for _ in range(2):
        x = (x * HASH_MUL + HASH_ADD) % HASH_MOD
        x = x ^ (x >> 16)
    return x


def _choice(e: torch.Tensor, dp: DevicePlacement, prefer_local: bool, per_source: bool) -> torch.Tensor:
    """``zepp.planner.routing.simple_routing._choice``: candidates (all replicas, or the nearest
    level), the pick ``source rank mod count`` (``per_source``) or ``entry_hash mod count``."""
    R, T, k = e.shape
    ef = e.reshape(-1)
    n = ef.shape[0]
    src = arange(n, e.device) // (T * k)
    h = src if per_source else entry_hash(arange(n, e.device))
    reps = dp.replicas[ef]  # [n, C]
    valid = reps >= 0
    if prefer_local:
        rr = torch.where(valid, reps // dp.S, -1)
        level = torch.where(rr == src[:, None], 0, torch.where(rr // dp.L == (src // dp.L)[:, None], 1, 2))
        level = torch.where(valid, level, 3)
        valid = level == level.min(dim=1, keepdim=True).values
    cnt = valid.sum(dim=1)
    pick = h % cnt
    nth = torch.cumsum(valid.to(I64), dim=1) - 1
    col = (valid & (nth == pick[:, None])).to(torch.int8).argmax(dim=1)
    return reps.gather(1, col[:, None]).reshape(R, T, k)


def _route_zepp(ids, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    slot, unplaced = water_fill(ids, dp, relaxation, sync, sweeps)
    return _routing(ids, vacate(ids, slot, dp, relaxation, vacate_rounds, sync), dp, relaxation, unplaced)


# name -> router(ids [R, T, k] int64, DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting;
# ``moonep`` has no torch planner.
_TORCH_ROUTERS = {
    "home": _route_home,
    "replica-rr": _route_replica_rr,
    "locality": _chooser(prefer_local=True, per_source=True),
    "fixed": _chooser(prefer_local=False, per_source=True),
    "dynamic": _chooser(prefer_local=True, per_source=False),
    "random": _chooser(prefer_local=False, per_source=False),
    "zepp": _route_zepp,
}
TORCH_ROUTINGS = tuple(_TORCH_ROUTERS)
