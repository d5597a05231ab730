"""The direct transports in torch: the twins of ``zepp.planner.flows.direct_flows`` (``a2av``,
``dedup``, ``allgather``; one stage, every row straight between owner and computing GPU).

Dispatch builders take ``(x: EntryView, coalesce)`` and return ``(HopParts, None)`` (no
gateways); combine builders take ``(x, remote_rows)`` and return ``HopParts``; ``coalesce`` and
``remote_rows`` are unused here.
"""

from __future__ import annotations

from zepp.planner.torch.flows.entry_view import EntryView
from zepp.planner.torch.flows.hop_parts import HopParts


def a2av_dispatch(x: EntryView, coalesce: bool) -> tuple[HopParts, None]:
    d = HopParts(x.device)
    d.add(x.valid_b & (x.comp_b != x.owner), 0, x.owner, x.comp_b, x.owner, x.token)
    return d, None


def dedup_dispatch(x: EntryView, coalesce: bool) -> tuple[HopParts, None]:
    d = HopParts(x.device)
    d.add(x.tc & (x.comp != x.owner), 0, x.owner, x.comp, x.owner, x.token)
    return d, None


def allgather_dispatch(x: EntryView, coalesce: bool) -> tuple[HopParts, None]:
    """No hop table (COMET's dense all-gather)."""
    return HopParts(x.device), None


def a2av_combine(x: EntryView, remote_rows) -> HopParts:
    c = HopParts(x.device)
    c.add(x.valid_b & (x.comp_b != x.owner), 0, x.comp_b, x.owner, x.owner, x.token, entry=x.entry)
    return c


def dedup_combine(x: EntryView, remote_rows) -> HopParts:
    c = HopParts(x.device)
    c.add(x.tc & (x.comp != x.owner), 0, x.comp, x.owner, x.owner, x.token)
    return c
