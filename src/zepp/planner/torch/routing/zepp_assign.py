"""Zepp's routing from counts to entries in torch: ``zepp.planner.routing.zepp_assign``, element
for element (the batch's demand in one count, every entry's replica in one gather from a
per-rank table of slots).

The entries of the few (rank, expert) groups split over several replicas are ranked in their
group: with ``sync``, only those (``nonzero`` reads their number); without, every entry of a
several-replica expert is put in group order by one stable sort of fixed size, and the groups'
replica counts, expanded in the same order (``repeat_interleave`` of fixed output size), are
scattered back (no host read).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from zepp.planner.torch._ops import I32, arange, counts, select, sort_order, take
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
    """``(slot [R, n], node [R, n])`` int32: every entry's replica (``-1`` where missing) and its
    node (home where missing); ``assigned [R, M*C]`` the water-fill's counts (``None``: no expert
    has several replicas)."""
    R, dev = keys.index.shape[0], keys.index.device
    slot_tab = dp.slot_of.to(I32).expand(R, -1).clone()
    node_tab = dp.node_of.to(I32).expand(R, -1).clone()
    node_tab[:, 0] = (arange(R, dev) // dp.L).to(I32)  # a missing entry sits at home
    split = None
    if assigned is not None and dp.M:
        used = assigned.reshape(R, dp.M, dp.C) > 0
        only = used.to(torch.int8).argmax(2)  # the one replica of an unsplit group (the first used)
        split = used.sum(2) > 1  # [R, M]
        m = arange(dp.M, dev)[None, :]
        slot_tab[:, dp.multi + 1] = torch.where(split, _SPLIT, dp.reps_multi[m, only]).to(I32)
        node_tab[:, dp.multi + 1] = dp.multi_nodes[m, only].to(I32)
    slot, node = take(slot_tab, keys.index), take(node_tab, keys.index)
    if split is not None:
        if sync:
            _assign_split(keys, assigned, dp, slot, node)
        else:
            slot, node = _assign_sorted(keys, assigned, dp, slot, node)
    return slot, node


def _assign_split(keys: EntryKeys, assigned: torch.Tensor, dp: DevicePlacement, slot: torch.Tensor,
                  node: torch.Tensor) -> None:
    """The entries of split groups (``slot == _SPLIT``), by place in their group in batch order,
    against the cumulative counts (in place; ``nonzero`` reads their number)."""
    R, M, C, E1 = keys.index.shape[0], dp.M, dp.C, dp.E + 1
    flat_slot, flat_node, index = slot.reshape(-1), node.reshape(-1), keys.index.reshape(-1)
    where = torch.nonzero(flat_slot == _SPLIT)[:, 0]
    cell = index[where]
    r, m = cell // E1, dp.multi_index[cell % E1 - 1]
    group = r * M + m
    pos = position_in_group(group, R * M)
    ends = torch.cumsum(assigned.reshape(R * M, C), 1)
    replica = (pos[:, None] >= ends[group]).sum(1)
    flat_slot[where] = dp.reps_multi[m, replica].to(I32)
    flat_node[where] = dp.multi_nodes[m, replica].to(I32)


def _assign_sorted(keys: EntryKeys, assigned: torch.Tensor, dp: DevicePlacement, slot: torch.Tensor,
                   node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Without host reads: every entry of a several-replica expert, in the stable order of its
    (rank, expert) group, takes the replicas the cumulative counts give its place (one sort of
    fixed size, the counts expanded by ``repeat_interleave`` of fixed output size, one scatter)."""
    R, M, C = keys.index.shape[0], dp.M, dp.C
    dev = keys.index.device
    n = keys.index.numel()
    group_tab = torch.full((R, dp.E + 1), R * M, dtype=I32, device=dev)
    group_tab[:, dp.multi + 1] = (arange(R, dev)[:, None] * M + arange(M, dev)[None, :]).to(I32)
    group = take(group_tab, keys.index).reshape(-1)
    order = sort_order(group, R * M)
    per_replica = assigned.reshape(-1)  # [R*M*C]: groups in order, replicas in order
    repeats = torch.cat([per_replica, (n - per_replica.sum()).reshape(1)])  # the rest: entries of no group
    out = []
    for value, base in ((dp.reps_multi, slot), (dp.multi_nodes, node)):
        values = torch.cat([value.expand(R, M, C).reshape(-1), value.new_full((1,), -1)]).to(I32)
        in_order = torch.repeat_interleave(values, repeats, output_size=n)
        mine = torch.empty_like(in_order).scatter_(0, order, in_order).reshape(base.shape)
        out.append(select((group < R * M).reshape(base.shape), mine, base))
    return out[0], out[1]
