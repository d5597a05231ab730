"""``zepp-table`` in torch: what one rank computes alone at run time, on the device (the twin of
``zepp.planner.routing.table_routing``'s lookup; the table itself is built with numpy, once per
placement).

``table_tensors(table, device)`` copies a ``zepp.planner.routing.RoutingTable``'s ``choices`` and
``shares [G, E, m]`` to ``device`` once per placement. ``rank_slots(ids [T, k], rank,
tables)`` is ``zepp.planner.routing.rank_slots`` as tensor operations of fixed shapes: a gather
of the rank's rows, the integer entry hash, a compare against the cumulative shares and a
gather of the pick. No host read (it can be captured in a CUDA graph), and the result equals
the numpy one element for element (``tests/planner/test_planner_table_routing.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from zepp.planner.routing.table_routing import HASH_SHIFT, RoutingTable
from zepp.planner.torch._ops import I64
from zepp.planner.torch.routing.base_routing import entry_hash


class TableTensors(NamedTuple):
    """A routing table on a device: ``choices`` and ``shares [G, E, m]`` int64."""

    choices: torch.Tensor
    shares: torch.Tensor


def table_tensors(table: RoutingTable, device) -> TableTensors:
    """``table``'s arrays on ``device`` (once per placement, before any batch)."""
    return TableTensors(torch.as_tensor(table.choices, dtype=I64, device=device),
                        torch.as_tensor(table.shares, dtype=I64, device=device))


def rank_slots(ids: torch.Tensor, rank: int, tables: TableTensors) -> torch.Tensor:
    """Slots ``[T, k]`` int32 of rank ``rank``'s entries ``ids [T, k]`` (integer tensor on the
    tables' device; ``-1`` ids give ``-1``)."""
    T, k = ids.shape
    e = ids.to(I64).clamp_min(0)
    index = rank * T * k + torch.arange(T * k, dtype=I64, device=ids.device).reshape(T, k)
    u = entry_hash(index) >> HASH_SHIFT
    shares = tables.shares[rank][e]  # [T, k, m]
    pick = (shares <= u[..., None]).sum(-1, keepdim=True)
    slot = tables.choices[rank][e].gather(-1, pick)[..., 0]
    return torch.where(ids < 0, torch.full_like(slot, -1), slot).to(torch.int32)
