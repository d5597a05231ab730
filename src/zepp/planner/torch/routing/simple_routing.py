"""The routings that pick a replica per entry from the placement alone, in torch (the twins of
``zepp.planner.routing.simple_routing``: ``home``, ``replica-rr``, ``locality``, ``fixed``,
``dynamic``, ``random``; what each picks is said there).

Each ``route_<name>(ids [R, T, k] int64, dp: DevicePlacement, relaxation, vacate_rounds, sync,
sweeps)`` returns a ``TorchRouting`` whose ``slot`` equals the numpy router's; the arguments after
``dp`` are the stage's, unused here. No host read.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I64, arange
from zepp.planner.torch.routing.base_routing import entry_hash, position_in_group, slot_routing
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.torch.types import TorchRouting


def route_home(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    return slot_routing(ids, dp.replicas[ids.clamp_min(0), 0], dp)


def route_replica_rr(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    flat = ids.reshape(-1)
    key = torch.where(flat >= 0, flat, dp.E)  # missing entries: a group of their own
    pos = position_in_group(key, dp.E + 1)
    e = flat.clamp_min(0)
    idx = pos % dp.count[e]
    return slot_routing(ids, dp.replicas[e, idx].reshape(ids.shape), dp)


def route_locality(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    return slot_routing(ids, _choice(ids, dp, prefer_local=True, per_source=True), dp)


def route_fixed(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    return slot_routing(ids, _choice(ids, dp, prefer_local=False, per_source=True), dp)


def route_dynamic(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    return slot_routing(ids, _choice(ids, dp, prefer_local=True, per_source=False), dp)


def route_random(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    return slot_routing(ids, _choice(ids, dp, prefer_local=False, per_source=False), dp)


def _choice(ids: torch.Tensor, dp: DevicePlacement, prefer_local: bool, per_source: bool) -> torch.Tensor:
    """The numpy planner's ``_choice``: candidates (all replicas, or the nearest level), the pick
    ``source rank mod count`` (``per_source``) or ``entry_hash mod count``. ``[R, T, k]`` slots."""
    R, T, k = ids.shape
    ef = ids.clamp_min(0).reshape(-1)
    n = ef.shape[0]
    src = arange(n, ids.device) // (T * k)
    h = src if per_source else entry_hash(arange(n, ids.device))
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
