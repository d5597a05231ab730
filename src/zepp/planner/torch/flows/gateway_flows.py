"""The gatewayed transports in torch: the twins of ``zepp.planner.flows.gateway_flows`` (dispatch
``relay``, ``zepp``; combine ``reduce``, ``reduce-direct``; ``nic_split``), element for element.

Dispatch builders take ``(x: EntryView, coalesce)`` and return ``(HopParts, RemoteRows)``;
combine builders take ``(x, RemoteRows)`` and return ``HopParts``. The union rows live on the
sorted grid ``[G, k]`` of ``EntryView`` as masks; the hop groups are added in the numpy
planner's order, so the packed tables equal its tables row for row.
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import I64, arange, counts
from zepp.planner.torch.flows.entry_view import EntryView
from zepp.planner.torch.flows.hop_parts import HopParts
from zepp.planner.torch.routing.base_routing import position_in_group


class RemoteRows:
    """Union rows of a gatewayed dispatch on the sorted grid ``[G, k]``: ``mask`` (one per token
    and remote node), ``carrier``, ``carrier_local``, ``gateway``, ``msg``, ``donated``;
    ``gateway_of_pair [G, k]``: per token-GPU position, the gateway of its token-node pair."""

    def __init__(self, x: EntryView, mask, carrier_local, msg, donated):
        self.mask = mask
        self.carrier_local = carrier_local
        self.carrier = x.onode * x.L + carrier_local
        self.gateway = x.node * x.L + carrier_local
        self.msg = msg
        self.donated = donated
        gw = torch.where(mask, self.gateway, -1)
        self.gateway_of_pair = gw.gather(1, x.pair_j)


def relay_dispatch(x: EntryView, coalesce: bool) -> tuple[HopParts, RemoteRows]:
    rr = _relay_rows(x)
    return _gatewayed_dispatch(x, rr), rr


def zepp_dispatch(x: EntryView, coalesce: bool) -> tuple[HopParts, RemoteRows]:
    """``coalesce``: pieces one NIC carries to one node travel as one message (else one each)."""
    rr = _zepp_rows(x, coalesce)
    return _gatewayed_dispatch(x, rr), rr


def reduce_combine(x: EntryView, rr: RemoteRows) -> HopParts:
    c = _reduce_on_gateways(x, rr)
    c.add(rr.mask, 1, rr.gateway, rr.carrier, x.owner, x.token, msg=rr.msg)
    # One forward per (token, landing GPU), in (token, local GPU) order.
    L = x.L
    need = rr.mask & (rr.carrier != x.owner)
    g = arange(x.G, x.device)[:, None]
    landed = counts(torch.where(need, g * L + rr.carrier_local, x.G * L).reshape(-1), x.G * L).reshape(x.G, L) > 0
    local = arange(L, x.device)[None, :]
    c.add(landed, 2, x.onode * L + local, x.owner, x.owner, x.token)
    return c


def reduce_direct_combine(x: EntryView, rr: RemoteRows) -> HopParts:
    c = _reduce_on_gateways(x, rr)
    c.add(rr.mask, 1, rr.gateway, x.owner, x.owner, x.token)
    return c


# --------------------------------------------------------------------------- union rows


def nic_split(volume: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The numpy planner's ``nic_split`` in torch: ``volume [P, L]`` int64 -> ``(cap [P, L],
    kept [P, L])``."""
    P, L = volume.shape
    total = volume.sum(1, keepdim=True)
    cap = total // L + (arange(L, volume.device)[None, :] < total % L).to(I64)
    return cap, torch.minimum(volume, cap)


def _remote_union(x: EntryView) -> torch.Tensor:
    return x.tn & x.pair_remote


def _relay_rows(x: EntryView) -> RemoteRows:
    mask = _remote_union(x)
    local = (x.owner % x.L).expand(x.G, x.k)
    return RemoteRows(x, mask, local, 0, torch.zeros_like(mask))


def _zepp_rows(x: EntryView, coalesce: bool) -> RemoteRows:
    """The NIC-balanced minimal-move split (the numpy ``_zepp_rows``) on the grid."""
    L, N, R = x.L, x.N, x.R
    mask = _remote_union(x)
    src_local = (x.owner % L).expand(x.G, x.k)
    stream = (x.onode * N + x.node).clamp_min(0)  # [G, k], meaningful where mask
    idx = stream * L + src_local
    volume = counts(torch.where(mask, idx, N * N * L).reshape(-1), N * N * L).reshape(N * N, L)
    cap, kept = nic_split(volume)
    excess, deficit = volume - kept, cap - kept
    # Position of each row inside its (owner, node) segment, in token order: a GPU keeps a prefix.
    pos = position_in_group(torch.where(mask, x.owner * N + x.node, R * N).reshape(-1), R * N).reshape(x.G, x.k)
    kept_e = kept.reshape(-1)[idx]
    keep = pos < kept_e
    donated = mask & ~keep
    excess_before = torch.cumsum(excess, 1) - excess
    xi = excess_before.reshape(-1)[idx] + pos - kept_e
    # The carrier of a donated row: how many of its stream's cumulative deficits it has passed
    # (one 1-D binary search: streams laid end to end, each offset past every row index).
    big = x.G * x.k + 1
    deficit_end = torch.cumsum(deficit, 1) + arange(N * N, x.device)[:, None] * big  # [N*N, L], ascending
    moved_to = torch.searchsorted(deficit_end.reshape(-1), stream * big + xi, right=True) - stream * L
    carrier_local = torch.where(donated, moved_to, src_local)
    msg = 0 if coalesce else src_local
    return RemoteRows(x, mask, carrier_local, msg, donated)


# --------------------------------------------------------------------------- hop groups


def _gatewayed_dispatch(x: EntryView, rr: RemoteRows) -> HopParts:
    d = HopParts(x.device)
    d.add(x.same_node, 0, x.owner, x.comp, x.owner, x.token)
    d.add(rr.donated, 0, x.owner, rr.carrier, x.owner, x.token, msg=rr.msg)
    d.add(rr.mask, 1, rr.carrier, rr.gateway, x.owner, x.token, msg=rr.msg)
    # Stage-2 NVLink forwards on the destination node: one row per (token, computing GPU)
    # other than the gateway that received the token.
    gw = rr.gateway_of_pair
    d.add(x.remote_tc & (x.comp != gw), 2, gw, x.comp, x.owner, x.token)
    return d


def _reduce_on_gateways(x: EntryView, rr: RemoteRows) -> HopParts:
    """Stage 0 of both reducing combines: same-node partials straight to the owner, remote ones
    summed on the gateway that received their token."""
    c = HopParts(x.device)
    c.add(x.same_node, 0, x.comp, x.owner, x.owner, x.token)
    gw = rr.gateway_of_pair
    c.add(x.remote_tc & (x.comp != gw), 0, x.comp, gw, x.owner, x.token)
    return c
