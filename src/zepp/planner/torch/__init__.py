"""The planner on the device: routing and flows as torch code, equal to the numpy planner.

``route`` and ``build_flows`` here are the torch twins of ``zepp.planner.routing.route`` and
``zepp.planner.flows.build_flows`` (the ids a tensor on any device); callers plan a batch through
``zepp.planner.plan_batch`` with ``backend="torch"`` (or a tensor of ids), which calls them.

The package mirrors the numpy planner file for file and name for name: ``types`` (``TorchRouting``,
``TorchHops``, ``TorchFlowPlan``), ``routing/`` (``base_routing``, ``simple_routing``,
``zepp_routing``, ``zepp_vacate``, ``table_routing``) and ``flows/`` (``entry_view``,
``direct_flows``, ``gateway_flows``); the twin of ``zepp.planner.X.Y.f`` is
``zepp.planner.torch.X.Y.f`` (``zepp.planner.choices.Choice.twin``, which ``route`` and
``build_flows`` use). Torch-only helpers: ``_ops`` (tensor building blocks),
``routing/device_placement`` (a placement's device tables), ``flows/hop_parts`` (filling a
fixed-capacity hop table) and ``host_traffic`` (the check, on any device, that a call does
nothing a CUDA graph cannot capture).

The outputs equal the numpy planner's element for element (``tests/planner/test_planner_torch.py``):
``slot [R, T, k]`` and every column of both hop tables, in the same order and dtypes.

What a CUDA graph can capture (``sync=False``; the default while capturing), for a fixed
``[R, T, k]`` and placement:

- Routing (every choice) and flows (every dispatch/combine pair): yes, after one warm-up call
  (checked on the CPU by ``host_traffic.forbid_host_traffic``, ``tests/planner/
  test_planner_torch_capture.py``; captured and replayed on an H200 by
  ``benchmarks/planner/plan_speed_torch.py --device cuda``). Integer tensor ops of
  fixed shapes; loop trip counts fixed by the placement and shapes (water-fill ``sweeps`` x
  ``C`` steps, ``vacate_rounds`` rounds); early exits replaced by no-op steps (proved) and a
  device flag; hop tables in fixed-capacity buffers with a device ``count``.
- Not captured, by design:
  - ``DevicePlacement`` (the placement's replica lists, visit orders, replica-per-node table):
    built with numpy on the host once per placement and copied to the device; a placement
    changes only between batches (after swaps), so build it before capturing.
  - ``to_numpy()`` / ``sizes()``: a hop table's length is data-dependent, so bringing it to the
    host is one read of the sizes (``dispatch``, ``combine``, ``unplaced``: one 3-element copy)
    plus the copies; the runtime's program compiler is numpy and needs it.
  - Input value checks (ids in ``[-1, E)``): they read the data (only with ``sync=True``).
- Cost of capturability: the water-fill's numpy bound is ``4C+4`` sweeps although every batch
  we tried needs one; ``sweeps=1`` makes the captured graph ``4C+4`` times shorter and reports
  ``unplaced`` (device scalar). With ``sweeps`` the routing is also *short*: the data-dependent
  lists (the vacate pass's candidate tokens and moves, the assignment's entries of split groups,
  the flows' handed rows) live in fixed-capacity lists sized from the shares measured on the
  recorded traces, far below their worst case, and a list that was too short sets a device
  flag (``TorchRouting.overflow``, ``TorchVolumes.overflow``; ``TorchRouting.shortfall()`` sums
  the routing's). ``to_numpy()`` refuses such a plan (``IncompletePlan``) and
  ``plan_batch(..., host=True)`` re-plans the rare incomplete batch with the default bounds
  (lists that hold every entry: no flag, slower).

Outside capture (``sync=True``) the loops stop early, tables are built at their exact size and
the vacate pass and the NIC split list their few moves and handed rows at their exact length,
with a few host reads (free on the CPU, tens of microseconds each on a GPU).

On the CPU, integer comparisons with a Python scalar and ``torch.where`` take kernels several
times slower than comparisons between tensors, narrow (int8) comparisons are several times
faster than int32 ones, and transposes cost a full copy: the per-entry work therefore runs
column by column (``[k, G]``) on int8 ranks and nodes, compares tensors with tensors, and
selects by arithmetic (``_ops.select``).
"""

from __future__ import annotations

from zepp.planner.torch.flows import build_flows
from zepp.planner.torch.routing import DevicePlacement, as_device_ids, device_placement, entry_hash, route
from zepp.planner.torch.types import IncompletePlan, TorchFlowPlan, TorchHops, TorchRouting, route_to_torch

__all__ = ["route", "build_flows", "as_device_ids", "route_to_torch", "IncompletePlan", "TorchRouting", "TorchHops",
           "TorchFlowPlan", "DevicePlacement", "device_placement", "entry_hash"]
