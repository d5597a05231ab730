"""A placement's static tables on a device: the torch planner's per-placement state (torch-only).

Built with numpy on the host once per placement and device (``visit_order`` of
``zepp.planner.routing.zepp_routing``, ``replica_on_node`` of ``zepp.planner.routing.zepp_tables``)
and copied to the device; a placement changes between batches only after swaps, so build it
before capturing a CUDA graph (``device_placement`` caches it).
"""

from __future__ import annotations

import numpy as np
import torch

from zepp.planner.placement_cache import PlacementCache
from zepp.planner.routing.zepp_routing import visit_order
from zepp.planner.routing.zepp_tables import zepp_tables
from zepp.planner.torch._ops import I64
from zepp.planner.types import Placement


class DevicePlacement:
    """A placement's static tables on ``device`` (built once per placement and device).

    ``replicas [E, C]`` int64 global slots (-1 padded), ``count [E]``, and for the water-fill the experts
    with several replicas ``multi [M]``, ``multi_index [E+1]`` (-1 elsewhere and for id -1),
    ``visit_flat [R, M, C]`` (flat index ``m*C + replica`` of each source's v-th visit) and
    ``valid_multi [M, C]``; for the assignment ``slot_of`` / ``node_of [E+1]`` and ``multi_nodes
    [M, C]`` (``zepp.planner.routing.zepp_tables.ZeppTables``); for the vacate pass
    ``replica_on_node [E, N]`` (the lowest slot of e on node n, else -1), ``node_mask [E]`` (its
    nodes as bits, ``None`` above ``MASK_NODES`` nodes) and ``several [E]`` (several replicas).
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
        zt = zepp_tables(p)
        self.slot_of, self.node_of, self.multi_nodes = t(zt.slot_of), t(zt.node_of), t(zt.multi_nodes)
        self.replica_on_node = t(zt.replica_on_node)
        self.node_mask = None if zt.node_mask is None else t(zt.node_mask.astype(np.int64))
        self.several = torch.as_tensor(p.replica_count > 1, device=self.device)
        self.any_multi = bool(multi.size)


_CACHE = PlacementCache()


def device_placement(placement: Placement, device) -> DevicePlacement:
    """The cached ``DevicePlacement`` of ``placement`` on ``device`` (8 kept)."""
    return _CACHE.get(placement, lambda: DevicePlacement(placement, device), str(torch.device(device)))
