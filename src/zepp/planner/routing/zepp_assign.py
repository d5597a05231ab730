"""Zepp's routing from counts to entries: the batch's demand per (source rank, expert) in one
count, then every entry given its replica in one pass (after ``zepp_routing``'s water-fill has
decided, per source rank and expert, how many entries each replica takes).

An entry of rank ``r`` for expert ``e`` gets its replica by its place among ``r``'s entries of
``e`` in batch order: the first ``assigned[r, e, 0]`` entries take replica 0 (the ``replicas``
order), the next ``assigned[r, e, 1]`` replica 1, and so on. Almost every (rank, expert) group
goes to one replica, so the pass is one gather from a per-rank table of slots (``[R, E+1]``);
only the entries of the few groups split over several replicas are ranked in their group (a
stable sort of those entries alone). ``zepp_tables.ZeppTables`` holds what a placement
contributes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.intsort import sorted_unique
from zepp.planner.routing.base_routing import position_in_group
from zepp.planner.routing.zepp_tables import ZeppTables

_SPLIT = -2  # a table cell whose group is split over several replicas


@dataclass(frozen=True)
class EntryKeys:
    """A batch's entries by source rank: ``index [R, n]`` int64 (``n = T*k``, batch order) is
    ``r * (E+1) + e + 1`` for an entry of rank ``r`` and expert ``e`` (``r * (E+1)`` where
    missing); ``demand [R, E]`` int64 entries per (rank, expert)."""

    index: np.ndarray
    demand: np.ndarray


def entry_keys(topk_ids: np.ndarray, num_experts: int) -> EntryKeys:
    """The keys and the demand of ``topk_ids [R, T, k]`` (one pass, one count)."""
    R = topk_ids.shape[0]
    index = topk_ids.reshape(R, -1).astype(np.int64)  # intp: no casts in the count and the gathers
    index += (np.arange(R, dtype=np.int64) * (num_experts + 1) + 1)[:, None]  # (in place: faster than a mixed add)
    demand = np.bincount(index.ravel(), minlength=R * (num_experts + 1)).reshape(R, num_experts + 1)[:, 1:]
    return EntryKeys(index, demand.astype(np.int64, copy=False))


def assign_entries(keys: EntryKeys, assigned: np.ndarray | None, tables: ZeppTables, with_node: bool = False):
    """``slot [R, n]`` int32: every entry on its replica (``-1`` where missing); with
    ``with_node``, also ``node [R, n]``: its replica's node code (the home node where missing; the
    sign bit set where the entry's expert has a single replica: ``zepp_tables.single_bit``).

    ``assigned [R, M, C]``: how many of rank ``r``'s entries of ``multi[m]`` replica ``c`` takes
    (``None``: no expert has several replicas)."""
    R = keys.index.shape[0]
    L = tables.placement.gpus_per_node
    slot_tab = np.broadcast_to(tables.slot_of, (R, tables.slot_of.size)).copy()
    node_tab = np.broadcast_to(tables.node_code_of, slot_tab.shape).copy()
    node_tab[:, 0] = np.arange(R) // L  # a missing entry sits at home
    split = np.zeros((R, 0), bool)
    if assigned is not None and tables.multi.size:
        used = assigned > 0
        only = used.argmax(2)  # the one replica of an unsplit group
        split = only != used.shape[2] - 1 - used[:, :, ::-1].argmax(2)  # [R, M]: first and last used differ
        m = np.arange(tables.multi.size)
        slot_tab[:, tables.multi + 1] = np.where(split, _SPLIT, tables.multi_slots[m, only])
        node_tab[:, tables.multi + 1] = tables.multi_nodes[m, only]
    slot = slot_tab.ravel().take(keys.index)
    node = node_tab.ravel().take(keys.index) if with_node else None
    if split.any():
        _assign_split(keys, assigned, tables, slot, node)
    return (slot, node) if with_node else slot


def _assign_split(keys: EntryKeys, assigned: np.ndarray, tables: ZeppTables, slot: np.ndarray, node) -> None:
    """Give the entries of groups split over several replicas (``slot == _SPLIT``) their
    replicas: by place in the group, in batch order, against the cumulative counts."""
    E1 = tables.slot_of.size
    where = np.flatnonzero(slot.ravel() == _SPLIT)
    cell = keys.index.ravel()[where]  # r * (E+1) + e + 1
    m_of = np.full(E1, -1, np.int64)
    m_of[tables.multi + 1] = np.arange(tables.multi.size)
    r, m = cell // E1, m_of[cell % E1]
    group = r * tables.multi.size + m
    pos = position_in_group(group, assigned.shape[0] * assigned.shape[1])
    # the cumulative counts of the split groups only, one replica column at a time
    groups = sorted_unique(group)
    ends = np.cumsum(assigned.reshape(-1, assigned.shape[2])[groups], axis=1).T  # [C, split groups]
    at = np.searchsorted(groups, group)
    replica = np.zeros(group.size, np.intp)
    for end in ends:
        replica += pos >= end.take(at)
    slot.ravel()[where] = tables.multi_slots[m, replica]
    if node is not None:
        node.ravel()[where] = tables.multi_nodes[m, replica]
