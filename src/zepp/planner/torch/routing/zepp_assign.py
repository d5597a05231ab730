"""Zepp's routing from counts to entries in torch: ``zepp.planner.routing.zepp_assign``, element
for element (the batch's demand in one count, every entry's replica in one gather from a
per-rank table of slots).

The entries of the few (rank, expert) groups split over several replicas are ranked in their
group: with ``sync``, only those (``nonzero`` reads their number); without, every entry of a
several-replica expert is ranked by one stable sort of fixed size (no host read) and the split
ones take their rank's replica.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from zepp.planner.torch._ops import I64, arange, counts
from zepp.planner.torch.routing.base_routing import position_in_group
from zepp.planner.torch.routing.device_placement import DevicePlacement

_SPLIT = -2  # a table cell whose group is split over several replicas


class EntryKeys(NamedTuple):
    """``index [R, n]`` int64: ``r * (E+1) + e + 1`` per entry (``r * (E+1)`` where missing);
    ``demand [R, E]`` int64 entries per (rank, expert) (``zepp_assign.EntryKeys``)."""

    index: torch.Tensor
    demand: torch.Tensor


def entry_keys(ids: torch.Tensor, dp: DevicePlacement) -> EntryKeys:
    R, E = ids.shape[0], dp.E
    index = ids.reshape(R, -1) + (arange(R, ids.device) * (E + 1) + 1)[:, None]
    return EntryKeys(index, counts(index.reshape(-1), R * (E + 1)).reshape(R, E + 1)[:, 1:])


def assign_entries(keys: EntryKeys, assigned: torch.Tensor | None, dp: DevicePlacement,
                   sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slot [R, n], node [R, n])`` int64: every entry's replica (``-1`` where missing) and its
    node (home where missing); ``assigned [R, M*C]`` the water-fill's counts (``None``: no expert
    has several replicas)."""
    R, dev = keys.index.shape[0], keys.index.device
    slot_tab = dp.slot_of.expand(R, -1).clone()
    node_tab = dp.node_of.expand(R, -1).clone()
    node_tab[:, 0] = arange(R, dev) // dp.L  # a missing entry sits at home
    split = None
    if assigned is not None and dp.M:
        used = assigned.reshape(R, dp.M, dp.C) > 0
        only = used.to(torch.int8).argmax(2)  # the one replica of an unsplit group (the first used)
        split = used.sum(2) > 1  # [R, M]
        m = arange(dp.M, dev)[None, :]
        slot_tab[:, dp.multi + 1] = torch.where(split, _SPLIT, dp.reps_multi[m, only])
        node_tab[:, dp.multi + 1] = dp.multi_nodes[m, only]
    slot = slot_tab.reshape(-1)[keys.index]
    node = node_tab.reshape(-1)[keys.index]
    if split is not None:
        _assign_split(keys, assigned, dp, slot, node, sync)
    return slot, node


def _assign_split(keys: EntryKeys, assigned: torch.Tensor, dp: DevicePlacement, slot: torch.Tensor,
                  node: torch.Tensor, sync: bool) -> None:
    """The entries of split groups (``slot == _SPLIT``), by place in their group in batch order,
    against the cumulative counts (in place)."""
    R, M, C, E1 = keys.index.shape[0], dp.M, dp.C, dp.E + 1
    flat_slot, flat_node, index = slot.reshape(-1), node.reshape(-1), keys.index.reshape(-1)
    if sync:
        where = torch.nonzero(flat_slot == _SPLIT)[:, 0]
    else:  # every entry of a several-replica expert, ranked within its group
        where = arange(index.shape[0], index.device)
    cell = index[where]
    r, m = cell // E1, dp.multi_index[(cell % E1 - 1).clamp_min(0)]  # -1: not several replicas (or missing)
    in_group = (m >= 0) & (cell % E1 > 0)
    group = torch.where(in_group, r * M + m, R * M)
    pos = position_in_group(group, R * M)
    ends = torch.cumsum(assigned.reshape(R * M, C), 1)
    replica = (pos[:, None] >= ends[group.clamp_max(R * M - 1)]).sum(1).clamp_max(C - 1)
    m = m.clamp_min(0)
    take = flat_slot[where] == _SPLIT
    flat_slot[where] = torch.where(take, dp.reps_multi[m, replica], flat_slot[where])
    flat_node[where] = torch.where(take, dp.multi_nodes[m, replica], flat_node[where])
