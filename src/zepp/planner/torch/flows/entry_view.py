"""The flat view of a routing that the torch flow builders read: the twin of
``zepp.planner.flows.entry_view``, laid out as fixed grids instead of compacted lists.

Each hop group of the numpy planner (same-node sends, hand-offs, NIC crossings, fan-outs,
gathers, forwards) is built as a *masked candidate list* of fixed length on a grid whose
row-major order is the numpy planner's table order:

- per entry, ``[G, k]`` in batch order (``G = R*T`` tokens): ``a2av`` rows;
- per token with its ``k`` computing ranks sorted, ``[G, k]``: a position is a token-GPU pair
  where its rank differs from its left neighbour, a token-node pair where its node does (the
  numpy ``EntryView`` keeps exactly these positions, in this order);
- per token and local GPU, ``[G, L]``: the combine forwards of ``reduce``.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I64, arange, first_in_row, row_cummax
from zepp.planner.torch.types import TorchRouting


class EntryView:
    """The flat views of a routing as fixed grids (the twin of the numpy ``EntryView``).

    Batch order ``[G, k]``: ``comp_b`` computing rank (-1 missing), ``valid_b``, ``entry`` (the
    column). Sorted per token ``[G, k]``: ``comp``, ``node`` (-1 for missing entries, sorted
    first), ``tc`` (token-GPU pair positions), ``tn`` (token-node pair positions), ``pair_j``
    (column of the token-node pair of each position), ``pair_remote`` (on another node than the
    owner's), ``same_node`` / ``remote_tc`` (the numpy ``same_node_pairs()`` / ``remote_pairs()``
    as masks). Per token ``[G, 1]``: ``owner``, ``token``, ``onode``.
    """

    def __init__(self, routing: TorchRouting):
        p = routing.placement
        R, T, k = routing.slot.shape
        self.R, self.T, self.k, self.L = R, T, k, p.gpus_per_node
        self.N = R // self.L
        self.G = G = R * T
        dev = self.device = routing.slot.device
        s = routing.slot.to(I64).reshape(G, k)
        self.valid_b = s >= 0
        self.comp_b = torch.where(self.valid_b, s // p.slots_per_rank, -1)
        g = arange(G, dev)[:, None]
        self.owner = g // T
        self.token = g - self.owner * T
        self.onode = self.owner // self.L
        self.comp = torch.sort(self.comp_b, dim=1).values
        self.node = torch.div(self.comp, self.L, rounding_mode="floor")
        present = self.comp >= 0
        self.tc = first_in_row(self.comp) & present
        self.tn = first_in_row(self.node) & present
        cols = arange(k, dev)[None, :].expand(G, k)
        self.pair_j = row_cummax(torch.where(self.tn, cols, 0))
        self.pair_remote = self.node != self.onode
        self.same_node = self.tc & ~self.pair_remote & (self.comp != self.owner)
        self.remote_tc = self.tc & self.pair_remote
        self.entry = cols
