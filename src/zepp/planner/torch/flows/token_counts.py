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

from zepp.planner.torch._ops import I64, arange, counts, select, take
from zepp.planner.torch.types import TorchRouting


class TokenCounts:
    """The counts of ``routing`` (``zepp.planner.flows.token_counts.TokenCounts``): ``R``, ``T``,
    ``k``, ``L``, ``N``; per entry column ``comp`` / ``node [k, G]`` (``-1`` where missing),
    ``first_c`` / ``first_n [k, G]``, ``owner [G]``; ``entries``, ``pairs [R, R]``, ``union [R, N]``."""

    def __init__(self, routing: TorchRouting):
        p = routing.placement
        self.R, self.T, self.k = routing.slot.shape
        self.L, self.S, self.N = p.gpus_per_node, p.slots_per_rank, p.nodes
        R, N, L, dev = self.R, self.N, self.L, routing.slot.device
        self.device = dev
        self.comp = torch.div(routing.slot.to(I64).reshape(-1, self.k).t(), self.S, rounding_mode="floor").contiguous()
        self.node = torch.div(self.comp, L, rounding_mode="floor")
        self.owner = arange(R * self.T, dev) // self.T
        self.first_c, self.first_n = _first_of_token(self.comp), _first_of_token(self.node)
        key = ((self.owner * (R + 1) + 1 + self.comp) * 4 + self.first_c + 2 * self.first_n).reshape(-1)
        c = counts(key, R * (R + 1) * 4).reshape(R, R + 1, 4)[:, 1:]
        self.entries = c.sum(2)
        self.pairs = c[:, :, 1] + c[:, :, 3]
        self.union = (c[:, :, 2] + c[:, :, 3]).reshape(R, N, L).sum(2)

    def beyond(self, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(beyond [R, N, T] bool, place [R, N, T])``: the token-node pairs of each segment
        (owner, node) past its first ``kept [R, N]`` in token order, and every pair's place in
        its segment (``TokenCounts.rows_beyond`` of numpy, marked instead of listed)."""
        R, N, T = self.R, self.N, self.T
        token = (arange(R * T, self.device) % T)[None, :]
        cell = select(self.first_n, (self.owner * N + self.node.clamp_min(0)) * T + token, R * N * T)
        present = counts(cell.reshape(-1), R * N * T).reshape(R, N, T)
        place = torch.cumsum(present, 2) - 1
        return (present > 0) & (place >= kept[:, :, None]), place

    def pair_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """``[k, G]``: ``grid [R, N, T]`` read at each entry's (owner, node, token) (0 where missing)."""
        T = self.T
        token = (arange(self.R * T, self.device) % T)[None, :]
        at = (self.owner * self.N + self.node.clamp_min(0)) * T + token
        return select(self.comp >= 0, take(grid, at), 0)


def _first_of_token(col: torch.Tensor) -> torch.Tensor:
    """``[k, G]`` bool: the entry is present and no earlier entry of its token has its value."""
    first = col >= 0
    for i in range(1, col.shape[0]):
        for j in range(i):
            first[i] &= col[i] != col[j]
    return first
