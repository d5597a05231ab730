"""A routing's entries counted per token in torch: ``zepp.planner.flows.token_counts``, with fixed
shapes (no host read).

``entries``, ``pairs [R, R]`` and ``union [R, N]`` as in numpy (one count over the entries held
column by column, ``[k, G]``). Where the numpy planner lists the token-node pairs past a
segment's kept prefix (``rows_beyond``), this marks them on the dense ``[R, N, T]`` grid
(``beyond``, with each pair's place in its segment), and the count-level builders read the
marks entry by entry (``pair_grid``).
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I32, arange, counts, select, take
from zepp.planner.torch.types import TorchRouting


class TokenCounts:
    """The counts of ``routing`` (``zepp.planner.flows.token_counts.TokenCounts``): ``R``, ``T``,
    ``k``, ``L``, ``N``; per entry column ``comp`` / ``node [k, G]`` int32 (``-1`` where missing),
    ``first_c`` / ``first_n [k, G]``, ``owner`` / ``onode [G]`` int32; ``entries``, ``pairs [R, R]``,
    ``union [R, N]``; ``at [k, G]`` int32: each entry's cell ``(owner, node, token)`` of the
    ``[R, N, T]`` grid of token-node pairs (node 0 where missing); ``sync``: the builders may
    list data-dependent rows (host reads), as the numpy planner does."""

    def __init__(self, routing: TorchRouting, sync: bool = False):
        p = routing.placement
        self.sync = sync
        self.R, self.T, self.k = routing.slot.shape
        self.L, self.S, self.N = p.gpus_per_node, p.slots_per_rank, p.nodes
        R, N, L, T, dev = self.R, self.N, self.L, self.T, routing.slot.device
        self.device = dev
        slot = routing.slot.reshape(-1, self.k).t().to(I32) + 1  # [k, G], 0 where missing
        rank_of = torch.div(arange(R * self.S + 1, dev) - 1, self.S, rounding_mode="floor").to(I32)
        self.comp = take(rank_of, slot)
        self.node = take(torch.div(rank_of, L, rounding_mode="floor"), slot)
        g = arange(R * T, dev).to(I32)
        self.owner = g // T
        self.onode = self.owner // L
        self.first_c, self.first_n = _first_of_token(self.comp), _first_of_token(self.node)
        self.at = (self.owner * N + self.node.clamp_min(0)) * T + (g - self.owner * T)
        key = ((self.owner * (R + 1) + 1) * 4)[None, :] + self.comp * 4  # int32 throughout
        key += self.first_c
        key += self.first_n
        key += self.first_n
        key = key.reshape(-1)
        c = counts(key, R * (R + 1) * 4).reshape(R, R + 1, 4)[:, 1:]
        self.entries = c.sum(2)
        self.pairs = c[:, :, 1] + c[:, :, 3]
        self.union = (c[:, :, 2] + c[:, :, 3]).reshape(R, N, L).sum(2)

    def beyond(self, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(beyond [R, N, T] bool, place [R, N, T] int32)``: the token-node pairs of each segment
        (owner, node) past its first ``kept [R, N]`` in token order, and every pair's place in
        its segment (``TokenCounts.rows_beyond`` of numpy, marked instead of listed)."""
        R, N, T = self.R, self.N, self.T
        present = counts(select(self.first_n, self.at, R * N * T).reshape(-1), R * N * T).reshape(R, N, T)
        place = torch.cumsum(present, 2, dtype=I32) - 1
        return (present > 0) & (place >= kept[:, :, None]), place

    def pair_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """``[k, G]``: ``grid [R, N, T]`` read at each entry's (owner, node, token) (0 where missing)."""
        return select(self.comp >= 0, take(grid, self.at), 0)


def _first_of_token(col: torch.Tensor) -> torch.Tensor:
    """``[k, G]`` bool: the entry is present and no earlier entry of its token has its value."""
    first = col >= 0
    for i in range(1, col.shape[0]):
        for j in range(i):
            first[i] &= col[i] != col[j]
    return first
