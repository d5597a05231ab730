"""Moving numpy planner inputs onto a device, for ``zepp.planner.plan_batch``'s torch backend."""

from __future__ import annotations

import numpy as np
import torch

from zepp.errors import ZeppInputError
from zepp.planner.types import Routing
from zepp.planner.torch.tables import TorchRouting


def as_device_ids(topk_ids, device=None) -> torch.Tensor:
    """``topk_ids [R, T, k]`` as an int64 tensor on ``device`` (a tensor stays on its device unless
    ``device`` is given); a numpy batch must hold integers."""
    if isinstance(topk_ids, torch.Tensor):
        return topk_ids if device is None else topk_ids.to(device)
    arr = np.asarray(topk_ids)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {arr.dtype}")
    return torch.as_tensor(arr.astype(np.int64), device=device)


def route_to_torch(routing: Routing, device=None) -> TorchRouting:
    """A numpy ``Routing`` as a ``TorchRouting`` on ``device`` (a copy)."""
    return TorchRouting(torch.as_tensor(routing.topk_ids, device=device),
                        torch.as_tensor(routing.slot.astype(np.int32), device=device),
                        routing.placement, routing.relaxation)
