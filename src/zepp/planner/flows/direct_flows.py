"""The direct transports: one stage, every row straight between owner and computing GPU.

- dispatch ``a2av``: one row per entry, owner -> computing rank (stage 0), no dedup;
  ``dedup``: one row per (token, computing rank), owner -> computing rank (stage 0);
  ``allgather``: COMET's dense all-gather, routing-oblivious, no hop table (the simulator models
  it with the ``comet-allgather`` plug-in).
- combine ``a2av``: one row per entry, computing rank -> owner (stage 0); ``dedup``: per
  (token, computing rank), the rank's entries summed there, straight to the owner.

Dispatch builders take ``(x: EntryView, coalesce)`` and return ``(Hops, None)`` (no gateways);
combine builders take ``(x, remote_rows)``; ``coalesce`` and ``remote_rows`` are unused here.
"""

from __future__ import annotations

from zepp.planner.flows.entry_view import EntryView
from zepp.planner.types import Hops


def a2av_dispatch(x: EntryView, coalesce: bool) -> tuple[Hops, None]:
    away = x.comp != x.owner
    return Hops.make(0, x.owner[away], x.comp[away], x.owner[away], x.token[away]), None


def dedup_dispatch(x: EntryView, coalesce: bool) -> tuple[Hops, None]:
    m = x.tc_comp != x.tc_owner
    return Hops.make(0, x.tc_owner[m], x.tc_comp[m], x.tc_owner[m], x.tc_token[m]), None


def allgather_dispatch(x: EntryView, coalesce: bool) -> tuple[Hops, None]:
    return Hops.empty(), None


def a2av_combine(x: EntryView, remote_rows) -> Hops:
    away = x.comp != x.owner
    return Hops.make(0, x.comp[away], x.owner[away], x.owner[away], x.token[away], entry=x.entry[away])


def dedup_combine(x: EntryView, remote_rows) -> Hops:
    m = x.tc_comp != x.tc_owner
    return Hops.make(0, x.tc_comp[m], x.tc_owner[m], x.tc_owner[m], x.tc_token[m])
