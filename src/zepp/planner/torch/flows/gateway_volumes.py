"""The gatewayed transports' volumes in torch: ``zepp.planner.flows.gateway_volumes``, with fixed
shapes (no host read).

The split is decided on the same counts; the rows a GPU hands another NIC are marks on the
``[N, R, T]`` grid of token-node pairs (``TokenCounts.beyond``) with their carrier, read back
entry by entry for the forwards that start on their new gateway (a correction of ``-1`` at the
old gateway, ``+1`` at the new one, summed into the same cells as the numpy planner's). Where
the counts are ``sync`` the marked rows are listed exactly (``nonzero``), as numpy does; where
the routing is ``short`` (planned with ``sweeps``), in a short fixed-capacity list whose
overflow the volumes carry (``TorchVolumes.overflow``); else they stay marks on the grid.

Dispatch builders take ``(tc: TokenCounts, coalesce)`` and return ``(TorchVolumes, Gateways)``;
combine builders take ``(tc, Gateways)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zepp.planner.torch._ops import I32, I64, arange, counts, list_true, select, take
from zepp.planner.torch.flows.direct_volumes import pair_cells
from zepp.planner.torch.flows.gateway_flows import nic_split
from zepp.planner.torch.flows.token_counts import TokenCounts
from zepp.planner.torch.volumes import TorchVolumes


_HANDED_SHARE = 32  # short lists (a short routing, no sync): up to G * N / _HANDED_SHARE handed rows
_MIN_HANDED = 1024  # ... and never fewer than this


@dataclass
class Gateways:
    """``zepp.planner.flows.gateway_volumes.Gateways`` on fixed grids: ``carried [R, N, L]``,
    ``by_owner_local``; the handed rows as ``handed [N, R, T]`` bool with ``carrier_local
    [N, R, T]`` (meaningful where handed), or where the counts are ``sync`` or ``short``,
    ``listed``: ``(owner, token, node, carrier_local, valid)`` ``[d]`` each, as in numpy
    (``_listed``), with the short list's ``overflow``; ``fan``: the forwards' parts once built
    (``_fan_parts``)."""

    carried: torch.Tensor
    by_owner_local: bool
    handed: torch.Tensor | None
    carrier_local: torch.Tensor | None
    fan: list | None = None
    listed: tuple | None = None
    overflow: torch.Tensor | None = None


def relay_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[TorchVolumes, Gateways]:
    R, L, N = tc.R, tc.L, tc.N
    carried = torch.zeros(R, N, L, dtype=I64, device=tc.device)
    r = arange(R, tc.device)
    carried[r, :, r % L] = _remote_union(tc)
    gw = Gateways(carried, False, None, None)
    return _gatewayed_dispatch(tc, gw), gw


def zepp_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[TorchVolumes, Gateways]:
    gw = _split(tc, not coalesce)
    v = _gatewayed_dispatch(tc, gw)
    v.overflow = gw.overflow
    return v, gw


def reduce_combine(tc: TokenCounts, gw: Gateways) -> TorchVolumes:
    R, L = tc.R, tc.L
    v = _reduce_on_gateways(tc, gw)
    r, n, cl = _rnc(tc)
    v.add(1, n * L + cl, (r // L) * L + cl, _msg(gw, r), r // L, gw.carried)
    if gw.handed is not None or gw.listed is not None:  # one forward per (token, landing GPU) other than the owner
        T = tc.T
        if gw.listed is not None:
            owner, token, _, carrier, valid = gw.listed
            key = (owner * T + token) * L + carrier
            landed = counts(key if valid is None else select(valid, key, R * T * L), R * T * L) > 0
        else:
            g = arange(R * T, tc.device).to(I32).reshape(1, R, T)
            landed = counts(select(gw.handed, g * L + gw.carrier_local, R * T * L).reshape(-1), R * T * L) > 0
        per = landed.reshape(R, T, L).sum(1)  # [R, L]
        rr, local = arange(R, tc.device)[:, None], arange(L, tc.device)[None, :]
        v.add(2, (rr // L) * L + local, rr, 0, rr // L, per)
    return v


def reduce_direct_combine(tc: TokenCounts, gw: Gateways) -> TorchVolumes:
    L = tc.L
    v = _reduce_on_gateways(tc, gw)
    r, n, cl = _rnc(tc)
    v.add(1, n * L + cl, r, 0, r // L, gw.carried)
    return v


def _remote_union(tc: TokenCounts) -> torch.Tensor:
    r = arange(tc.R, tc.device)
    return torch.where(r[:, None] // tc.L == arange(tc.N, tc.device)[None, :], 0, tc.union)


def _rnc(tc: TokenCounts):
    """Index grids ``(r, n, cl)`` of the ``[R, N, L]`` cube."""
    dev = tc.device
    return (arange(tc.R, dev)[:, None, None], arange(tc.N, dev)[None, :, None], arange(tc.L, dev)[None, None, :])


def _split(tc: TokenCounts, by_owner_local: bool) -> Gateways:
    """``gateway_volumes._split``: the split on counts, the handed rows marked."""
    R, L, N = tc.R, tc.L, tc.N
    volume = _remote_union(tc).reshape(N, L, N).permute(0, 2, 1).reshape(N * N, L)
    cap, kept = nic_split(volume)
    excess, deficit = volume - kept, cap - kept
    ex_end, de_end = torch.cumsum(excess, 1), torch.cumsum(deficit, 1)
    handed = torch.minimum(ex_end[:, :, None], de_end[:, None, :]) - torch.maximum((ex_end - excess)[:, :, None],
                                                                                (de_end - deficit)[:, None, :])
    carried = handed.clamp_min(0) + torch.diag_embed(kept)  # [stream, from, to]
    carried = carried.reshape(N, N, L, L).permute(0, 2, 1, 3).reshape(R, N, L)
    kept_rn = kept.reshape(N, N, L).permute(0, 2, 1).reshape(R, N)
    r = arange(R, tc.device)
    kept_rn = torch.where(r[:, None] // L == arange(N, tc.device)[None, :], tc.T, kept_rn)  # home: none handed
    beyond, place = tc.beyond(kept_rn.to(I32))
    stream = ((r // L)[:, None] * N + arange(N, tc.device)[None, :])  # [R, N]
    local = (r % L)[:, None].expand(R, N)
    first = ((ex_end - excess)[stream, local] - kept[stream, local]).to(I32)  # [R, N]: a segment's first excess row
    ends = de_end[stream].to(I32)  # [R, N, L]
    if tc.sync or tc.short:
        listed, overflow = _listed(tc, beyond, place, first, ends)
        return Gateways(carried, by_owner_local, None, None, listed=listed, overflow=overflow)
    xi = first.t()[:, :, None] + place  # [N, R, T]
    # the carrier of a handed row: how many of its stream's cumulative deficits it has passed
    carrier_local = torch.zeros_like(xi)
    ends = ends.permute(1, 0, 2)  # [N, R, L]
    for cl in range(L):
        carrier_local += xi >= ends[:, :, cl:cl + 1]
    return Gateways(carried, by_owner_local, beyond, carrier_local)


def _listed(tc: TokenCounts, beyond, place, first, ends) -> tuple[tuple, torch.Tensor | None]:
    """The handed rows listed, ``((owner, token, node, carrier_local, valid) [d], overflow)``:
    exactly with ``sync`` (``nonzero``; ``valid`` and ``overflow`` ``None``), else in a short
    fixed-capacity list (``_handed_capacity``; ``valid`` marks the listed rows, the padding has
    owner ``R``; ``overflow``: 0-d bool, the list was too short)."""
    T, R, N = tc.T, tc.R, tc.N
    flat = beyond.reshape(-1)
    valid = overflow = None
    if tc.sync:
        at = torch.nonzero(flat)[:, 0]
    else:
        cap = _handed_capacity(tc)
        at, total = list_true(flat, cap)
        valid, overflow = at < flat.shape[0], total > cap
        at = at.clamp_max(flat.shape[0] - 1)
    if flat.shape[0] < 1 << 31:
        at = at.to(I32)  # the listed rows' arithmetic in int32 (several times faster than int64 on the CPU)
    nr, token = at // T, at % T
    node, owner = nr // R, nr % R
    rn = owner * N + node
    xi = take(first, rn) + take(place, at)
    carrier = (xi[:, None] >= ends.reshape(N * R, -1).index_select(0, rn)).sum(1, dtype=at.dtype)
    if valid is not None:
        owner = select(valid, owner, R)
    return (owner, token, node, carrier, valid), overflow


def _handed_capacity(tc: TokenCounts) -> int:
    """The short list's length: ``G * N / _HANDED_SHARE`` handed rows (``G`` tokens, ``N``
    nodes), at least ``_MIN_HANDED``. The share grows with the nodes: on the recorded traces (K2
    and Qwen3, 1 and 16 MB per GPU) at most 1 row in 15 tokens at 4 nodes, 6.7 at 8, 3.5 at 16,
    2.1 at 32 (the small batches; at 16 MB, 1 in 7 to 83); the K2 batch at 16 x 4, 16 MB hands
    6,431 rows of 74,752 tokens."""
    G = tc.R * tc.T
    return min(G * tc.N, max(G * tc.N // _HANDED_SHARE, _MIN_HANDED))


def _msg(gw: Gateways, owner):
    return owner % gw.carried.shape[2] if gw.by_owner_local else 0


def _volumes(tc: TokenCounts, gw: Gateways) -> TorchVolumes:
    v = TorchVolumes.zeros(tc.R, tc.N, tc.L if gw.by_owner_local else 1, tc.device)
    v.overflow = gw.overflow
    return v


def _gatewayed_dispatch(tc: TokenCounts, gw: Gateways) -> TorchVolumes:
    L = tc.L
    v = _volumes(tc, gw)
    near = _near(tc)
    pair_cells(v, near, 0, tc)
    r, n, cl = _rnc(tc)
    msg, home = _msg(gw, r), (r // L) * L
    v.add(0, r, home + cl, msg, r // L, torch.where(cl != r % L, gw.carried, 0))
    v.add(1, home + cl, n * L + cl, msg, r // L, gw.carried)
    for src, dst, onode, rows in _fan_parts(tc, gw):
        v.add(2, src, dst, 0, onode, rows)
    return v


def _reduce_on_gateways(tc: TokenCounts, gw: Gateways) -> TorchVolumes:
    v = _volumes(tc, gw)
    pair_cells(v, _near(tc), 0, tc, back=True)
    for src, dst, onode, rows in _fan_parts(tc, gw):
        v.add(0, dst, src, 0, onode, rows)
    return v


def _near(tc: TokenCounts) -> torch.Tensor:
    r = arange(tc.R, tc.device)
    return torch.where((r[:, None] // tc.L == r[None, :] // tc.L) & (r[:, None] != r[None, :]), tc.pairs, 0)


def _fan_parts(tc: TokenCounts, gw: Gateways) -> list[tuple]:
    """The stage-2 forwards as parts ``(src, dst, owner node, rows)``: every token-GPU pair on
    another node from the owner's NIC's gateway, corrected where the row was handed (the
    corrections counted per (owner node, old or new gateway, GPU) in one count each)."""
    if gw.fan is not None:
        return gw.fan
    R, L, N = tc.R, tc.L, tc.N
    r = arange(R, tc.device)
    c = r[None, :]
    remote = (r[:, None] // L) != (c // L)
    gateway = (c // L) * L + (r % L)[:, None]
    gw.fan = [(gateway, c, (r // L)[:, None], torch.where(remote & (c != gateway), tc.pairs, 0))]
    if gw.listed is not None:
        gw.fan.append((r[None, :, None], r[None, None, :], arange(N, tc.device)[:, None, None], _listed_fan(tc, gw)))
    elif gw.handed is not None:
        onode = tc.onode[None, :]
        moved = tc.first_c & (tc.node != onode) & tc.pair_grid(gw.handed)  # [k, G] handed remote token-GPU pairs
        cells = R * R * N
        base = tc.node * L
        per = 0
        for sign, local in ((-1, (tc.owner % L)[None, :]), (1, tc.pair_grid(gw.carrier_local).to(I32))):
            src = base + local
            key = select(moved & (tc.comp != src), (onode * R + src) * R + tc.comp, cells)
            per = per + sign * counts(key.reshape(-1), cells).reshape(N, R, R)  # [owner node, gateway, GPU]
        gw.fan.append((r[None, :, None], r[None, None, :], arange(N, tc.device)[:, None, None], per))
    return gw.fan


def _listed_fan(tc: TokenCounts, gw: Gateways) -> torch.Tensor:
    """``[N, R, R]``: the forwards' corrections of the listed handed rows (numpy's ``gpus_on``:
    each row's token's GPUs on its node, from the old gateway and from the new one)."""
    R, L, N, T = tc.R, tc.L, tc.N, tc.T
    owner, token, node, carrier, valid = gw.listed
    g = owner * T + token
    if valid is not None:
        g = g.clamp_max(R * T - 1)
    comp = tc.comp.index_select(1, g)  # [k, d]
    gpus = tc.first_c.index_select(1, g) & (tc.node.index_select(1, g) == node)
    if valid is not None:
        gpus &= valid
    onode, cells = owner // L, R * R * N
    per = 0
    for sign, local in ((-1, owner % L), (1, carrier)):
        src = node * L + local
        key = select(gpus & (comp != src), (onode * R + src) * R + comp, cells)
        per = per + sign * counts(key.reshape(-1), cells).reshape(N, R, R)
    return per
