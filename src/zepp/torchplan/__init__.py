"""The planner on the device: routing and flows as torch code, equal to the numpy planner.

``route`` and ``build_flows`` here take the numpy planner's arguments and pick the backend by
the input's type (a ``torch.Tensor`` plans in torch on its device, a numpy array with the numpy
planner) or by ``backend="torch"`` / ``"numpy"``. ``plan_batch`` is the one call the runtime's
Dispatcher makes. See ``zepp.torchplan.routing`` and ``zepp.torchplan.flows`` for what runs
where and what can be captured in a CUDA graph.
"""

from __future__ import annotations

from zepp.torchplan.api import build_flows, plan_batch, plan_batch_numpy, route
from zepp.torchplan.routing import TORCH_ROUTINGS, DevicePlacement, device_placement, entry_hash
from zepp.torchplan.flows import TORCH_COMBINE, TORCH_DISPATCH
from zepp.torchplan.tables import IncompletePlan, TorchFlowPlan, TorchHops, TorchRouting

__all__ = ["route", "build_flows", "plan_batch", "plan_batch_numpy", "IncompletePlan", "TorchRouting", "TorchHops", "TorchFlowPlan", "DevicePlacement",
           "device_placement", "entry_hash", "TORCH_ROUTINGS", "TORCH_DISPATCH", "TORCH_COMBINE"]
