"""SGLang's static dispatch in torch (the twin of ``zepp.planner.routing.sglang_routing``'s
``route_sglang_static``; what it picks is said there): the per-placement map is computed once on
the host with numpy and kept on the device with the placement's tables, a batch is one gather."""

from __future__ import annotations

import torch

from zepp.planner.routing.sglang_routing import _static_table
from zepp.planner.torch._ops import I64, arange
from zepp.planner.torch.routing.base_routing import slot_routing
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.torch.types import TorchRouting


def route_sglang_static(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync,
                        sweeps) -> TorchRouting:
    table = getattr(dp, "sglang_static", None)
    if table is None:  # [R, E], built once per placement and device
        table = dp.sglang_static = torch.as_tensor(_static_table(dp.placement), dtype=I64, device=dp.device)
    R, T, k = ids.shape
    src = (arange(R * T * k, ids.device) // (T * k)).reshape(ids.shape)
    return slot_routing(ids, table[src, ids.clamp_min(0)], dp)
