"""Zepp's routing from counts to entries in torch: ``zepp.planner.routing.zepp_assign``, element
for element (the batch's demand in one count, every entry's replica in one gather from a
per-rank table of slots).

The entries of the few (rank, expert) groups split over several replicas are ranked in their
group: with ``sync``, only those (``nonzero`` reads their number); without, either

- ``bounded`` (the short, capturable form, with ``sweeps``): the same, listed in a fixed-capacity
  list of ``n / _SPLIT_SHARE`` entries (at least ``_MIN_SPLIT``; on the recorded traces, K2 and
  Qwen3 at 4 to 32 nodes x 4 GPUs, 1 and 16 MB per GPU, at most 1 entry in 38 is in a split
  group; the K2 batch at 16 x 4, 16 MB: 6,923 of 598,016, 1 in 86); a batch with more sets the
  ``overflow`` flag (the routing's; ``plan_batch(..., host=True)`` re-plans with the default
  bound); or
- every entry of a several-replica expert is put in group order by one stable sort of fixed
  size, and the groups' replica counts, expanded in the same order (``repeat_interleave`` of
  fixed output size), are scattered back (no host read).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from zepp.planner.torch._ops import I32, I64, arange, counts, list_token_major, select, sort_order, take
from zepp.planner.torch.routing.base_routing import position_in_group
from zepp.planner.torch.routing.device_placement import DevicePlacement

_SPLIT = -2  # a table cell whose group is split over several replicas
_SPLIT_SHARE = 24  # bounded: entries of split groups listed, at most one in _SPLIT_SHARE
_MIN_SPLIT = 1024  # bounded: ... and never fewer than this


class EntryKeys(NamedTuple):
    """Per entry, column by column (``[k, G]``: entry ``j`` of every token contiguous, the layout
    of the vacate pass and the token counts): ``index [k, G]`` int32 (int64 past 2**31 cells),
    ``r * (E+1) + e + 1`` (``r * (E+1)`` where missing), and ``ids [k, G]`` int32 the expert ids;
    ``demand [R, E]`` int64 entries per (rank, expert) (``zepp_assign.EntryKeys``)."""

    index: torch.Tensor
    demand: torch.Tensor
    ids: torch.Tensor


def entry_keys(ids: torch.Tensor, dp: DevicePlacement) -> EntryKeys:
    R, T, k = ids.shape
    E = dp.E
    dtype = I32 if R * (E + 1) < 1 << 31 else ids.dtype
    columns = torch.empty((k, R * T), dtype=dtype, device=ids.device)
    columns.copy_(ids.reshape(R * T, k).t())  # one transpose of the batch, into a contiguous [k, G]
    offset = (arange(R, ids.device) * (E + 1) + 1).to(dtype).repeat_interleave(T, output_size=R * T)
    index = columns + offset[None, :]
    return EntryKeys(index, counts(index.reshape(-1), R * (E + 1)).reshape(R, E + 1)[:, 1:], columns)


def assign_entries(keys: EntryKeys, assigned: torch.Tensor | None, dp: DevicePlacement, sync: bool,
                   bounded: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(slot [k, G], node [k, G], overflow)``: every entry's replica (int32, ``-1`` where
    missing) and its node (int32, home where missing), column by column; ``assigned [R, M*C]`` the water-fill's
    counts (``None``: no expert has several replicas); ``bounded``: list the entries of split
    groups in a fixed-capacity list (module docstring) whose ``overflow`` (0-d bool, else
    ``None``) says it was too short."""
    R, dev = dp.R, keys.index.device
    slot_tab = dp.slot_of.to(I32).expand(R, -1).clone()
    node_tab = dp.node_of.to(I32).expand(R, -1).clone()
    node_tab[:, 0] = (arange(R, dev) // dp.L).to(I32)  # a missing entry sits at home
    split = None
    if assigned is not None and dp.M:
        used = assigned.reshape(R, dp.M, dp.C) > 0
        only = used.to(torch.int8).argmax(2)  # the one replica of an unsplit group (the first used)
        split = used.sum(2) > 1  # [R, M]
        m = arange(dp.M, dev)[None, :]
        bounded = bounded and not sync
        # a split group's cells say _SPLIT, except in the bounded form: there they hold its first
        # replica, so an entry a too-short list leaves out still has a valid slot (flagged)
        slot_tab[:, dp.multi + 1] = (dp.reps_multi[m, only] if bounded else
                                     torch.where(split, _SPLIT, dp.reps_multi[m, only])).to(I32)
        node_tab[:, dp.multi + 1] = dp.multi_nodes[m, only].to(I32)
    slot, node = take(slot_tab, keys.index), take(node_tab, keys.index)
    overflow = None
    if split is not None:
        if sync:
            _assign_split(keys, assigned, dp, slot, node)
        elif bounded:
            split_tab = torch.zeros(R, dp.E + 1, dtype=torch.bool, device=dev)
            split_tab[:, dp.multi + 1] = split
            n = slot.numel()
            slot, node, overflow = _assign_split(keys, assigned, dp, slot, node,
                                                 min(n, max(n // _SPLIT_SHARE, _MIN_SPLIT)),
                                                 take(split_tab, keys.index))
        else:
            slot, node = _assign_sorted(keys, assigned, dp, slot, node)
    return slot, node, overflow


def _assign_split(keys: EntryKeys, assigned: torch.Tensor, dp: DevicePlacement, slot: torch.Tensor,
                  node: torch.Tensor, capacity: int | None = None, split: torch.Tensor | None = None):
    """The entries of split groups (``split [k, G]``, else ``slot == _SPLIT``), by place in their
    group in batch order (token-major), against the cumulative counts: listed exactly
    (``capacity=None``: in place, ``nonzero`` reads their number), or in a fixed list of
    ``capacity`` (no host read; returns ``(slot, node, overflow)``, the padded list entries
    writing a spare cell)."""
    R, M, C, E1 = dp.R, dp.M, dp.C, dp.E + 1
    k, G = slot.shape
    flat_slot, flat_node, index = slot.reshape(-1), node.reshape(-1), keys.index.reshape(-1)
    if split is None:
        split = slot == _SPLIT
    n = k * G
    if capacity is None:
        gi, ki = torch.nonzero(split.t()).t()  # token-major: batch order
        where = ki * G + gi
        valid = None
    else:
        where, total = list_token_major(split, capacity)  # n past the end: the spare cell
        valid = where < n
        spare = flat_slot.new_zeros(1)
        flat_slot, flat_node = torch.cat([flat_slot, spare]), torch.cat([flat_node, spare])
    cell = index.index_select(0, where.clamp_max(n - 1)).to(I64)
    r, m = cell // E1, take(dp.multi_index, cell % E1 - 1 + E1 * (cell % E1 == 0)).clamp_min(0)
    group = r * M + m
    if valid is not None:
        group = select(valid, group, R * M)
    pos = position_in_group(group, R * M)
    ends = torch.cumsum(assigned.reshape(R * M, C), 1)
    replica = (pos[:, None] >= ends.index_select(0, group.clamp_max(R * M - 1))).sum(1).clamp_max(C - 1)
    at = m * C + replica
    flat_slot.index_copy_(0, where, take(dp.reps_multi, at).to(I32))
    flat_node.index_copy_(0, where, take(dp.multi_nodes, at).to(I32))
    if capacity is not None:
        return flat_slot[:n].view(slot.shape), flat_node[:n].view(node.shape), total > capacity


def _assign_sorted(keys: EntryKeys, assigned: torch.Tensor, dp: DevicePlacement, slot: torch.Tensor,
                   node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Without host reads: every entry of a several-replica expert, in the stable order of its
    (rank, expert) group, takes the replicas the cumulative counts give its place (one sort of
    fixed size, the counts expanded by ``repeat_interleave`` of fixed output size, one scatter)."""
    R, M, C = dp.R, dp.M, dp.C
    dev = keys.index.device
    n = keys.index.numel()
    group_tab = torch.full((R, dp.E + 1), R * M, dtype=I32, device=dev)
    group_tab[:, dp.multi + 1] = (arange(R, dev)[:, None] * M + arange(M, dev)[None, :]).to(I32)
    group = take(group_tab, keys.index.t()).reshape(-1)  # in batch order (token-major)
    order = sort_order(group, R * M)
    per_replica = assigned.reshape(-1)  # [R*M*C]: groups in order, replicas in order
    repeats = torch.cat([per_replica, (n - per_replica.sum()).reshape(1)])  # the rest: entries of no group
    out = []
    for value, base in ((dp.reps_multi, slot), (dp.multi_nodes, node)):
        values = torch.cat([value.expand(R, M, C).reshape(-1), value.new_full((1,), -1)]).to(I32)
        in_order = torch.repeat_interleave(values, repeats, output_size=n)
        mine = torch.empty_like(in_order).scatter_(0, order, in_order).view(base.shape[::-1]).t()
        out.append(select((group < R * M).view(base.shape[::-1]).t(), mine, base))
    return out[0], out[1]
