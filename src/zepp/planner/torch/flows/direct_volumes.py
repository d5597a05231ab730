"""The direct transports' volumes in torch: ``zepp.planner.flows.direct_volumes``, as fixed-shape
``TorchVolumes`` (``zepp.planner.torch.types``).

Dispatch builders take ``(tc: TokenCounts, coalesce)`` and return ``(TorchVolumes, None)``;
combine builders take ``(tc, gateways)``.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import arange
from zepp.planner.torch.flows.token_counts import TokenCounts
from zepp.planner.torch.volumes import TorchVolumes


def pair_cells(v: TorchVolumes, counts: torch.Tensor, stage: int, tc: TokenCounts, back: bool = False) -> None:
    """Add ``counts [R, R]`` rows from owner ``r`` to rank ``c`` (``back``: ``c`` to ``r``) in
    ``stage`` to ``v``, leaving out a rank's rows to itself."""
    r = arange(tc.R, tc.device)
    rows = torch.where(r[:, None] != r[None, :], counts, 0)
    src, dst = (r[None, :], r[:, None]) if back else (r[:, None], r[None, :])
    v.add(stage, src, dst, 0, (r // tc.L)[:, None], rows)


def _one(tc: TokenCounts, counts: torch.Tensor | None, back: bool) -> TorchVolumes:
    v = TorchVolumes.zeros(tc.R, tc.N, 1, tc.device)
    if counts is not None:
        pair_cells(v, counts, 0, tc, back)
    return v


def a2av_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[TorchVolumes, None]:
    return _one(tc, tc.entries, False), None


def dedup_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[TorchVolumes, None]:
    return _one(tc, tc.pairs, False), None


def allgather_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[TorchVolumes, None]:
    return _one(tc, None, False), None


def a2av_combine(tc: TokenCounts, gateways) -> TorchVolumes:
    return _one(tc, tc.entries, True)


def dedup_combine(tc: TokenCounts, gateways) -> TorchVolumes:
    return _one(tc, tc.pairs, True)
