"""A FlowPlan's flows for the simulator, from counts: each phase as *cells* and the stage links
between cells, instead of per-row hop tables.

A cell is the plan's volume of one ``(stage, src, dst, msg, owner node)`` (``zepp.planner.volumes``),
here with a ``free`` flag (rows that leave during planning, ``zepp.sim.predispatch``). The layer
builder splits cells into messages the way it splits hops (by owner node, coarse group or wave,
free rows: the same message keys) and orders stages by *links*: cell ``a`` (earlier stage)
delivers to its destination a row that cell ``b`` carries on from there. Links follow from the
transports' structure and the routing's counts (``links``):

- NIC crossing -> forward on the destination node (dispatch stage 1 -> 2), and gather -> NIC
  crossing back (combine stage 0 -> 1): a token carried by local GPU ``cl`` of its owner's node
  to node ``n`` has an entry on GPU ``c`` there other than the gateway; from the token-GPU pairs
  of rows kept by their owner's NIC and, for the few rows handed to another NIC, from the rows;
- hand-off or same-node send -> NIC crossing (dispatch stage 0 -> 1) and NIC crossing back ->
  forward to the owner (combine stage 1 -> 2): from the handed rows.

The messages and their stage pairs are then exactly those of the hop tables (``messages`` of
``zepp.planner.overlap.grouping`` and ``zepp.sim.joins.stage_message_pairs``), so the task graph
is the same, built without a per-row table (``tests/sim`` checks both paths give the same layer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from zepp.planner.volumes import Volumes

_COLUMNS = ("stage", "src", "dst", "msg", "owner_node", "free")


@dataclass
class CellFlows:
    """One phase's cells ``[c]``: ``stage``, ``src``, ``dst``, ``msg``, ``owner_node``, ``free``
    (int64 each; ``free`` 0/1) and ``rows``; ``links = (a, b)``, each a dict of the same columns
    ``[p]``: the endpoints of the stage links (see the module docstring); ``gpus_per_node``."""

    stage: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    msg: np.ndarray
    owner_node: np.ndarray
    free: np.ndarray
    rows: np.ndarray
    links: tuple
    gpus_per_node: int

    @property
    def size(self) -> int:
        return int(self.rows.size)

    @property
    def owner(self) -> np.ndarray:
        """``owner_of`` each cell: what the layer builder's per-owner rules read."""
        return CellFlows.owner_of(self.__dict__, self.gpus_per_node)

    @staticmethod
    def owner_of(cols: dict, gpus_per_node: int) -> np.ndarray:
        """A rank standing for the owners of cells (or link ends) ``cols``: on their owner node,
        never their destination (no row is sent to its own owner in a dispatch), so the rules
        that read an owner (its node; whether it computes the row itself) read the cell right."""
        L = gpus_per_node
        return np.asarray(cols["owner_node"], np.int64) * L + (np.asarray(cols["dst"], np.int64) + 1) % L

    @property
    def num_stages(self) -> int:
        return int(self.stage.max()) + 1 if self.size else 0

    def refined(self, key_of) -> "CellFlows":
        """Messages keyed further by ``key_of(columns) -> [n]`` (ints >= 0; ``columns``: a dict of
        a cell's or link end's columns): ``msg * (max key + 1) + key``, the max over the cells
        (``zepp.planner.overlap.grouping.split_by_key``)."""
        if self.size == 0:
            return self
        cols = {c: getattr(self, c) for c in _COLUMNS}
        span = int(np.max(key_of(cols))) + 1

        def split(d: dict) -> dict:
            return dict(d, msg=d["msg"] * span + key_of(d))

        a, b = self.links
        out = split(cols)
        return replace(self, msg=out["msg"], links=(split(a), split(b)))

    def stage_pairs(self, msg_keys: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
        """The message pairs ``(a, b)`` (sorted, distinct) of the links (``msg_keys``: the messages'
        keys, ``zepp.planner.overlap.grouping.Messages.keys`` of ``messages(cells, R, cells.rows)``)."""
        a, b = self.links
        if a["stage"].size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ia = np.searchsorted(msg_keys, self._key(a, ranks))
        ib = np.searchsorted(msg_keys, self._key(b, ranks))
        pair = np.unique(ia * msg_keys.size + ib)
        return pair // msg_keys.size, pair % msg_keys.size

    def _span(self) -> int:
        return int(self.msg.max(initial=0)) + 1

    def _key(self, d: dict, ranks: int) -> np.ndarray:
        R = ranks
        return ((np.asarray(d["stage"], np.int64) * R + d["src"]) * R + d["dst"]) * self._span() + d["msg"]

    def column_slices(self, splits: int) -> "CellFlows":
        """``zepp.sim.layer_builder.column_slices`` on cells: every cell repeated as ``splits``
        slices, slice ``c`` in message ``msg * splits + c``."""
        rep = {c: np.repeat(getattr(self, c), splits) for c in _COLUMNS}
        rep["msg"] = rep["msg"] * splits + np.tile(np.arange(splits, dtype=np.int64), self.size)
        return CellFlows(**rep, rows=np.repeat(self.rows, splits), links=self.links, gpus_per_node=self.gpus_per_node)


def cells_of(v: Volumes, free_rows: Volumes | None, links: tuple, gpus_per_node: int) -> CellFlows:
    """A phase's ``CellFlows`` from its volumes; ``free_rows``: the volumes of its free rows
    (each cell then splits into its free and other rows)."""
    cols = [np.asarray(getattr(v, c), np.int64) for c in ("stage", "src", "dst", "msg", "owner_node")]
    rows = v.rows.astype(np.int64)
    free = np.zeros(v.size, np.int64)
    if free_rows is not None and free_rows.size:
        fcols = [np.asarray(getattr(free_rows, c), np.int64) for c in ("stage", "src", "dst", "msg", "owner_node")]
        span = [int(max(a.max(initial=0), b.max(initial=0))) + 1 for a, b in zip(cols, fcols)]
        at = np.searchsorted(_flat(cols, span), _flat(fcols, span))
        nfree = np.zeros(v.size, np.int64)
        nfree[at] = free_rows.rows
        keep = nfree > 0
        cols = [np.concatenate([c, c[keep]]) for c in cols]
        free = np.concatenate([np.zeros(v.size, np.int64), np.ones(int(keep.sum()), np.int64)])
        rows = np.concatenate([rows - nfree, nfree[keep]])
        nz = rows > 0
        cols, free, rows = [c[nz] for c in cols], free[nz], rows[nz]
    return CellFlows(*cols, free=free, rows=rows, links=links, gpus_per_node=gpus_per_node)


def _flat(cols, span) -> np.ndarray:
    key = np.zeros(cols[0].size, np.int64)
    for c, s in zip(cols, span):
        key = key * s + c
    return key
