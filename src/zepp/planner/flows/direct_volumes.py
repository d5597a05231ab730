"""The direct transports' volumes (``direct_flows`` counted, from ``TokenCounts``): one stage,
every row straight between owner and computing GPU, so each phase is one ``[R, R]`` count.

- ``a2av``: one row per entry, owner -> computing rank and back (``entries``);
- ``dedup``: one row per (token, computing rank) (``pairs``);
- ``allgather``: no hop table, no volumes (COMET's plug-in models it).

Dispatch builders take ``(tc: TokenCounts, coalesce)`` and return ``(Volumes, None)``; combine
builders take ``(tc, gateways)``; ``coalesce`` and ``gateways`` are unused here.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.flows.token_counts import TokenCounts
from zepp.planner.volumes import Volumes


def pair_cells(counts: np.ndarray, stage: int, tc: TokenCounts, back: bool = False, msg=0) -> Volumes:
    """Cells of ``counts [R, R]`` rows from owner ``r`` to rank ``c`` (``back``: from ``c`` to
    ``r``) in ``stage``, leaving out a rank's rows to itself."""
    R = tc.R
    r, c = np.nonzero(counts * (1 - np.eye(R, dtype=np.int64)))
    src, dst = (c, r) if back else (r, c)
    return Volumes.of_cells(stage, src, dst, msg, r // tc.L, counts[r, c], R, tc.N)


def a2av_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[Volumes, None]:
    return pair_cells(tc.entries, 0, tc), None


def dedup_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[Volumes, None]:
    return pair_cells(tc.pairs, 0, tc), None


def allgather_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[Volumes, None]:
    return pair_cells(np.zeros((tc.R, tc.R), np.int64), 0, tc), None


def a2av_combine(tc: TokenCounts, gateways) -> Volumes:
    return pair_cells(tc.entries, 0, tc, back=True)


def dedup_combine(tc: TokenCounts, gateways) -> Volumes:
    return pair_cells(tc.pairs, 0, tc, back=True)
