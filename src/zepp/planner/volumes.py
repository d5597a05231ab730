"""A plan's flows as counts: rows per (stage, source, destination, message, owner node) of one
phase (``Volumes``), what the planner decides before any per-row hop table exists.

A ``Hops`` table (``zepp.planner.types``) lists every row a phase moves; its ``Volumes`` are that
table counted: one *cell* per distinct ``(stage, src, dst, msg, owner node)`` (the owner node:
the node of the rank whose token the row is) with the number of hops in it, cells in ascending
key order. Hops sharing ``(stage, src, dst, msg)`` travel as one message whatever their owner
node, so a message is the sum of its cells; executors that split messages by the owner's node
(``zepp.planner.overlap.grouping``) read the cells. The flow builders
(``zepp.planner.flows``) compute volumes from a routing's counts directly; ``volumes_of_hops``
counts a hop table (the proof that both agree, and the path for a plan given as hops).
``LinkStats`` is a plan's byte and message accounting (``volume_stats`` from volumes,
``link_stats`` from a hop table: the same figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zepp.planner.intsort import sorted_with_order
from zepp.planner.types import Hops, PlanInvariantError

_FIELDS = ("stage", "src", "dst", "msg", "owner_node")


@dataclass(frozen=True)
class Volumes:
    """One phase's cells ``[c]``, ascending by ``(stage, src, dst, msg, owner_node)``, each with
    ``rows > 0``: ``stage`` int8, ``src`` / ``dst`` / ``msg`` / ``owner_node`` int32, ``rows`` int64."""

    stage: np.ndarray  # the key, int8 / int32 columns
    src: np.ndarray
    dst: np.ndarray
    msg: np.ndarray
    owner_node: np.ndarray
    rows: np.ndarray  # the count, int64

    size = property(lambda self: int(self.rows.shape[0]))
    num_stages = property(lambda self: int(self.stage.max()) + 1 if self.size else 0)

    @staticmethod
    def of_cells(stage, src, dst, msg, owner_node, rows, ranks: int, nodes: int) -> "Volumes":
        """Volumes from unordered cells (arrays or scalars broadcast to ``rows``): the rows of one
        key summed (a negative count corrects another cell of its key), keys whose sum is 0 dropped."""
        rows = np.asarray(rows, np.int64).ravel()
        cols = [np.broadcast_to(v, rows.shape) for v in (stage, src, dst, msg, owner_node)]
        return Volumes.of_parts([(*cols, rows)], ranks, nodes)

    @staticmethod
    def of_parts(parts, ranks: int, nodes: int) -> "Volumes":
        """``of_cells`` of several parts ``(stage, src, dst, msg, owner_node, rows)`` together (arrays
        or scalars, broadcast within a part): each part is keyed on its own, so no column is
        broadcast or concatenated, only one int64 key and the rows per part."""
        mmax = max(int(np.max(p[3], initial=0)) for p in parts) + 1 if parts else 1
        keys, counts = [], []
        for stage, src, dst, msg, owner_node, rows in parts:
            key = (((np.asarray(stage, np.int64) * ranks + src) * ranks + dst) * mmax + msg) * nodes + owner_node
            shape = np.broadcast_shapes(np.shape(key), np.shape(rows))
            keys.append(np.broadcast_to(key, shape).ravel())
            counts.append(np.broadcast_to(np.asarray(rows, np.int64), shape).ravel())
        uniq, total = _sum_by_key(np.concatenate(keys), np.concatenate(counts))
        if (total < 0).any():
            raise PlanInvariantError("a flow cell ended with a negative row count")
        uniq, total = uniq[total > 0], total[total > 0]
        owner_node = uniq % nodes
        rest = uniq // nodes
        msg, rest = rest % mmax, rest // mmax
        return Volumes(stage=(rest // (ranks * ranks)).astype(np.int8), src=((rest // ranks) % ranks).astype(np.int32),
                       dst=(rest % ranks).astype(np.int32), msg=msg.astype(np.int32),
                       owner_node=owner_node.astype(np.int32), rows=total)

    @staticmethod
    def concat(parts: list["Volumes"], ranks: int, nodes: int) -> "Volumes":
        """The cells of ``parts`` together (cells of one key summed)."""
        cols = [np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS + ("rows",)]
        return Volumes.of_cells(*cols, ranks=ranks, nodes=nodes)


def _sum_by_key(key: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(uniq, total)``: the distinct non-negative ``key`` values of non-zero sums, ascending, and
    the sum of ``rows`` per key (through a table where the keys fit one, else a sort; keys whose
    rows sum to 0 may be left out)."""
    if key.size == 0:
        return key, rows
    # cells of no rows may carry any key; the sort below also skips them
    if int(key.min()) < 0 or int(key.max()) >= max(1 << 22, 8 * key.size):
        nz = rows != 0
        key, rows = key[nz], rows[nz]
        if key.size == 0:
            return key, rows
    hi = int(key.max()) + 1
    if hi <= max(1 << 22, 8 * key.size):
        total = np.bincount(key, weights=rows, minlength=hi)
        uniq = np.flatnonzero(total != 0)  # (a bool array: numpy's nonzero of floats is slow)
        return uniq, total[uniq].astype(np.int64)
    ks, order = sorted_with_order(key)
    first = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1])))
    return ks[first], np.add.reduceat(rows[order], first).astype(np.int64)


class PlanVolumes(NamedTuple):
    """The ``Volumes`` of a plan's two phases."""

    dispatch: Volumes
    combine: Volumes


def volumes_of_hops(h: Hops, ranks: int, gpus_per_node: int) -> Volumes:
    """A hop table counted into cells (``Volumes``)."""
    return Volumes.of_cells(h.stage, h.src, h.dst, h.msg, h.owner // gpus_per_node, np.ones(h.size, np.int64), ranks,
                            ranks // gpus_per_node)


def volume_stats(v: Volumes, ranks: int, gpus_per_node: int, row_bytes: int, rows_computed: np.ndarray) -> LinkStats:
    """One phase's ``LinkStats`` from its volumes (the same figures as ``link_stats`` of its hops)."""
    L = gpus_per_node
    cross = (v.src // L) != (v.dst // L)
    nic_send = np.bincount(v.src[cross], weights=v.rows[cross], minlength=ranks).astype(np.int64) * row_bytes
    nic_recv = np.bincount(v.dst[cross], weights=v.rows[cross], minlength=ranks).astype(np.int64) * row_bytes
    pair = v.src.astype(np.int64) * ranks + v.dst
    nvlink = np.bincount(pair[~cross], weights=v.rows[~cross], minlength=ranks * ranks).astype(np.int64)
    # one message per distinct (stage, src, dst, msg): cells sorted by key, so a message's cells are adjacent
    key = np.stack([v.stage.astype(np.int64), v.src, v.dst, v.msg])
    first = np.ones(v.size, bool)
    first[1:] = (key[:, 1:] != key[:, :-1]).any(0)
    messages = np.bincount(pair[first], minlength=ranks * ranks).reshape(ranks, ranks)
    return LinkStats(nic_send, nic_recv, (nvlink * row_bytes).reshape(ranks, ranks), messages, np.asarray(rows_computed))


@dataclass(frozen=True)
class LinkStats:
    """Byte and message accounting of one phase (or both phases summed).

    ``nic_send [R]`` / ``nic_recv [R]``: bytes each rank's NIC sends / receives to / from other
    nodes. ``nvlink [R, R]``: bytes from rank i to rank j inside a node (zero across nodes).
    ``messages [R, R]``: messages from i to j (either link). ``rows_computed [R]``: GEMM rows.
    """

    nic_send: np.ndarray
    nic_recv: np.ndarray
    nvlink: np.ndarray
    messages: np.ndarray
    rows_computed: np.ndarray

    @property
    def inter_node_bytes(self) -> int:
        return int(self.nic_send.sum())

    @property
    def busiest_nic_bytes(self) -> int:
        """Largest bytes over any NIC direction (send or receive)."""
        return int(max(self.nic_send.max(initial=0), self.nic_recv.max(initial=0)))

    @property
    def nvlink_bytes(self) -> int:
        return int(self.nvlink.sum())

    def __add__(self, other: "LinkStats") -> "LinkStats":
        return LinkStats(self.nic_send + other.nic_send, self.nic_recv + other.nic_recv,
                         self.nvlink + other.nvlink, self.messages + other.messages, self.rows_computed)


def link_stats(hops: Hops, ranks: int, gpus_per_node: int, row_bytes: int, rows_computed: np.ndarray) -> LinkStats:
    """Aggregate a hop table into per-link bytes and messages (see ``LinkStats``)."""
    cross = (hops.src // gpus_per_node) != (hops.dst // gpus_per_node)
    nic_send = np.bincount(hops.src[cross], minlength=ranks).astype(np.int64) * row_bytes
    nic_recv = np.bincount(hops.dst[cross], minlength=ranks).astype(np.int64) * row_bytes
    pair = hops.src.astype(np.int64) * ranks + hops.dst
    nvlink = (np.bincount(pair[~cross], minlength=ranks * ranks).astype(np.int64) * row_bytes).reshape(ranks, ranks)
    key = (hops.stage.astype(np.int64) * ranks * ranks + pair) * (int(hops.msg.max(initial=0)) + 1) + hops.msg
    unique_msgs = np.unique(key)
    msg_pair = (unique_msgs // (int(hops.msg.max(initial=0)) + 1)) % (ranks * ranks)
    messages = np.bincount(msg_pair, minlength=ranks * ranks).reshape(ranks, ranks)
    return LinkStats(nic_send, nic_recv, nvlink, messages, np.asarray(rows_computed))
