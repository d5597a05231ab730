"""vLLM's hash replica choice in torch (the twin of ``zepp.planner.routing.vllm_routing``'s
``route_vllm_hash``; what it picks is said there). No host read."""

from __future__ import annotations

import torch

from zepp.planner.routing.vllm_routing import KNUTH, MASK32
from zepp.planner.torch.routing.base_routing import slot_routing
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.torch.types import TorchRouting


def route_vllm_hash(ids: torch.Tensor, dp: DevicePlacement, relaxation, vacate_rounds, sync, sweeps) -> TorchRouting:
    rows = torch.cumsum((ids >= 0).any(dim=2).to(torch.int64), dim=1) - 1  # [R, T]: present tokens in order
    e = ids.clamp_min(0)
    col = ((rows[:, :, None] * KNUTH) & MASK32) % dp.count[e].clamp_min(1)
    return slot_routing(ids, dp.replicas[e, col], dp)
