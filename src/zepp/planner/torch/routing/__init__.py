"""Routing in torch: the numpy planner's routing choices (``zepp.planner.routing``), element for element.

The tree mirrors the numpy one module for module and name for name: ``base_routing`` (the batch
check, the routing record, grouping and hashing), ``simple_routing`` (``route_home`` ...
``route_random``), ``zepp_routing`` and ``zepp_vacate`` (Zepp's water-fill and vacate pass),
``table_routing`` (a rank's table lookup, ``rank_slots``); ``device_placement`` (torch only) holds
the placement's device tables. ``route`` runs a choice by name: the numpy record's ``twin()``
(``zepp.planner.choices``), so there is no second table of names; a choice whose record has no
torch twin (``moonep``, ``lp``, the table routings) is refused.

Every router takes ``topk_ids [R, T, k]`` as an integer tensor on any device and returns
``slot [R, T, k]`` int32 on the same device, equal to ``zepp.planner.routing.route``'s. An id of
``-1`` is a missing entry (slot ``-1``, no load).

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

import dataclasses

import torch

from zepp.errors import ZeppInputError
from zepp.planner.routing import ROUTINGS
from zepp.planner.torch.routing.base_routing import as_device_ids, check_batch, default_sync, entry_hash
from zepp.planner.torch.routing.device_placement import DevicePlacement, device_placement
from zepp.planner.torch.types import TorchRouting
from zepp.planner.types import Placement

__all__ = ["route", "as_device_ids", "check_batch", "default_sync", "entry_hash", "DevicePlacement",
           "device_placement"]


def route(name: str, topk_ids: torch.Tensor, placement: Placement, relaxation: float = 0.25,
          vacate_rounds: int = 3, *, sync: bool | None = None, sweeps: int | None = None) -> TorchRouting:
    """Route ``topk_ids [R, T, k]`` (integer tensor, any device) with routing ``name``;
    ``slot [R, T, k]`` int32 on the same device equals ``zepp.planner.routing.route(name, ...)``'s.

    ``sync``: see the module docstring (default: True, except while a CUDA graph is being
    captured on the current stream). ``sweeps``: water-fill sweeps to run without host reads
    (default and maximum: the numpy planner's bound ``4C+4``). Every recorded batch we tried
    needs one; with fewer than the bound, check ``unplaced`` (a device scalar, 0 when complete)
    and re-plan with the default when it is not 0 (``plan_batch`` does). With ``sweeps`` the
    routing is ``short``: the vacate pass, the assignment and the flows built from it without
    ``sync`` use short fixed-capacity lists, whose overflow is flagged in ``TorchRouting.overflow``
    (the routing's lists) and ``TorchVolumes.overflow`` (the flows').
    """
    choice = ROUTINGS.choice(name)
    if not choice.torch_twin:
        raise ZeppInputError(f"routing {name!r} has no torch planner; the torch planner has "
                             f"{', '.join(ROUTINGS.having('torch_twin'))} (use the numpy planner)")
    sync = default_sync(topk_ids) if sync is None else bool(sync)
    ids = check_batch(topk_ids, placement, read_values=sync)
    dp = device_placement(placement, ids.device)
    routing = choice.twin()(ids, dp, relaxation, vacate_rounds, sync, sweeps)
    return routing if sweeps is None else dataclasses.replace(routing, short=True)
