"""A routing's entries counted per token in torch: ``zepp.planner.flows.token_counts``, with fixed
shapes (no host read).

``entries``, ``pairs [R, R]`` and ``union [R, N]`` as in numpy (one count over the entries held
column by column, ``[k, G]``). Where the numpy planner lists the token-node pairs past a
segment's kept prefix (``rows_beyond``), this marks them on the dense ``[N, R, T]`` grid of
token-node pairs (``beyond``, with each pair's place in its segment; node-major, so a node's
marks are ``N`` column comparisons and a segment's places one prefix sum along ``T``), and the
count-level builders read the marks entry by entry (``pair_grid``). Comparisons run on the
ranks and nodes in the narrowest integer type (int8 comparisons are several times faster than
int32 ones on the CPU).
"""

from __future__ import annotations

from functools import cached_property

import torch

from zepp.planner.torch._ops import I32, arange, counts, select, take
from zepp.planner.torch.types import TorchRouting


def _narrow(col: torch.Tensor, largest: int) -> torch.Tensor:
    """``col`` (values in ``[-1, largest]``) in the narrowest signed integer type that holds them."""
    return col.to(torch.int8 if largest < 1 << 7 else torch.int16 if largest < 1 << 15 else I32)


class TokenCounts:
    """The counts of ``routing`` (``zepp.planner.flows.token_counts.TokenCounts``): ``R``, ``T``,
    ``k``, ``L``, ``N``; per entry column ``comp`` / ``node [k, G]`` int32 (``-1`` where missing),
    ``first_c`` / ``first_n [k, G]``, ``owner`` / ``onode [G]`` int32; ``entries``, ``pairs [R, R]``,
    ``union [R, N]``; ``at [k, G]`` int32: each entry's cell ``(node, owner, token)`` of the
    ``[N, R, T]`` grid of token-node pairs (node 0 where missing); ``sync``: the builders may
    list data-dependent rows (host reads), as the numpy planner does; ``short``: the routing's
    (the builders list them in short fixed-capacity lists instead)."""

    def __init__(self, routing: TorchRouting, sync: bool = False):
        p = routing.placement
        self.sync, self.short = sync, routing.short
        self.R, self.T, self.k = routing.slot.shape
        self.L, self.S, self.N = p.gpus_per_node, p.slots_per_rank, p.nodes
        R, N, L, T, dev = self.R, self.N, self.L, self.T, routing.slot.device
        self.device = dev
        columns = routing.columns if routing.columns is not None else routing.slot.reshape(-1, self.k).t()
        slot = columns.to(I32) + 1  # [k, G], 0 where missing
        rank_of = torch.div(arange(R * self.S + 1, dev) - 1, self.S, rounding_mode="floor").to(I32)
        self.comp = take(rank_of, slot)
        self.node = take(torch.div(rank_of, L, rounding_mode="floor"), slot)
        self.owner = arange(R * T, dev).to(I32) // T
        self.onode = self.owner // L
        self.node_narrow = _narrow(self.node, N)
        self.first_c, self.first_n = _first_of_token(_narrow(self.comp, R)), _first_of_token(self.node_narrow)
        key = torch.add(((self.owner * (R + 1) + 1) * 4)[None, :], self.comp, alpha=4)  # int32 throughout
        key += self.first_c
        key += self.first_n
        key += self.first_n
        c = counts(key.reshape(-1), R * (R + 1) * 4).reshape(R, R + 1, 4)[:, 1:]
        self.entries = c.sum(2)
        self.pairs = c[:, :, 1] + c[:, :, 3]
        self.union = (c[:, :, 2] + c[:, :, 3]).reshape(R, N, L).sum(2)

    @cached_property
    def at(self) -> torch.Tensor:
        g = arange(self.R * self.T, self.device).to(I32)
        return torch.add(g[None, :], self.node.clamp_min(0), alpha=self.R * self.T)

    def beyond(self, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(beyond [N, R, T] bool, place [N, R, T] int32)``: the token-node pairs of each segment
        (owner, node) past its first ``kept [R, N]`` in token order, and every pair's place in
        its segment (``TokenCounts.rows_beyond`` of numpy, marked instead of listed)."""
        R, N, T = self.R, self.N, self.T
        nodes = arange(N, self.device).to(self.node_narrow.dtype)[:, None].expand(N, R * T).contiguous()
        present = torch.zeros(N, R * T, dtype=torch.bool, device=self.device)
        for col in self.node_narrow:  # each column against every node (tensor operands: the fast CPU kernels)
            present |= col[None, :] == nodes
        present = present.view(N, R, T)
        place = torch.cumsum(present, 2, dtype=I32) - 1
        return present & (place >= kept.t()[:, :, None]), place

    def pair_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """``[k, G]``: ``grid [N, R, T]`` read at each entry's (node, owner, token) (0 where missing)."""
        return select(self.comp >= 0, take(grid, self.at), 0)


def _first_of_token(col: torch.Tensor) -> torch.Tensor:
    """``[k, G]`` bool: the entry is present and no earlier entry of its token has its value
    (every comparison between tensors: the CPU kernels comparing with a scalar are slower)."""
    first = col >= torch.zeros_like(col[0])[None, :]
    for i in range(1, col.shape[0]):
        for j in range(i):
            first[i] &= col[i] != col[j]
    return first
