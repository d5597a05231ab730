"""Flows in torch: the numpy planner's hop tables (``zepp.planner.flows.build_flows``), element for element.

Each hop group of the numpy planner (same-node sends, hand-offs, NIC crossings, fan-outs,
gathers, forwards) is built here as a *masked candidate list* of fixed length, laid out on a
grid whose row-major order is the numpy planner's table order:

- per entry, ``[G, k]`` in batch order (``G = R*T`` tokens): ``a2av`` rows;
- per token with its ``k`` computing ranks sorted, ``[G, k]``: a position is a token-GPU pair
  where its rank differs from its left neighbour, a token-node pair where its node does (the
  numpy planner's ``EntryView``, which keeps exactly these positions in this order);
- per token and local GPU, ``[G, L]``: the combine forwards of ``reduce``.

``HopParts.pack`` concatenates the groups in the numpy planner's order and compacts the kept
rows to the front of a fixed-capacity buffer (a prefix sum and a scatter), so a whole phase is
built without any value read back to the host; only the row count of each table is data-
dependent (``TorchHops.count``, a device scalar).
"""

from __future__ import annotations

import torch

from zepp.errors import ZeppInputError
from zepp.planner.flows import check_transports as numpy_check_transports
from zepp.planner.torch._ops import I64, arange, counts, first_in_row, position_in_group
from zepp.planner.torch.tables import HopParts, TorchFlowPlan, TorchRouting


def check_transports(dispatch: str, combine: str | None) -> tuple[str, str]:
    """Validate a (dispatch, combine) pair as ``zepp.planner.flows`` does; ``None`` takes the natural
    combine; refuse pairs without a torch planner."""
    dispatch, combine = numpy_check_transports(dispatch, combine)
    if dispatch not in TORCH_DISPATCH or combine not in TORCH_COMBINE:
        raise ZeppInputError(f"transport {dispatch}/{combine} has no torch planner")
    return dispatch, combine


class Grid:
    """The flat views of a routing as fixed grids (the torch twin of ``zepp.planner.types.EntryView``).

    Batch order ``[G, k]``: ``comp_b`` computing rank (-1 missing), ``valid_b``. Sorted per token
    ``[G, k]``: ``comp``, ``node`` (-1 for missing entries, sorted first), ``tc`` (token-GPU
    pair positions), ``tn`` (token-node pair positions), ``pair_j`` (column of the token-node
    pair of each position). Per token ``[G, 1]``: ``owner``, ``token``, ``onode``.
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
        self.pair_j = torch.cummax(torch.where(self.tn, cols, 0), dim=1).values
        self.pair_remote = self.node != self.onode
        self.same_node = self.tc & ~self.pair_remote & (self.comp != self.owner)
        self.remote_tc = self.tc & self.pair_remote
        self.entry = cols


def build_flows(routing: TorchRouting, dispatch: str, row_bytes: int, combine: str | None = None,
                coalesce: bool = True, *, sync: bool | None = None) -> TorchFlowPlan:
    """The device FlowPlan of ``routing`` (see ``zepp.planner.flows.build_flows``), equal after
    ``to_numpy()`` to the numpy planner's. ``sync=False`` (default while a CUDA graph is being
    captured): hop tables in fixed-capacity buffers, no host read (capturable); ``sync=True``: tables
    of exactly ``count`` rows (``nonzero``; its output size is a host read)."""
    from zepp.planner.torch.routing import default_sync

    dispatch, combine = check_transports(dispatch, combine)
    exact = default_sync(routing.slot) if sync is None else bool(sync)
    x = Grid(routing)
    d = HopParts(x.device)
    rr = _TORCH_DISPATCHES[dispatch](d, x, coalesce)
    c = HopParts(x.device)
    _TORCH_COMBINES[combine](c, x, rr)
    return TorchFlowPlan(routing, d.pack(exact), c.pack(exact), x.L, int(row_bytes), dispatch, combine)


# ------------------------------------------------------------------------------------ direct transports


def _a2av_dispatch(d: HopParts, x: Grid, coalesce: bool) -> None:
    d.add(x.valid_b & (x.comp_b != x.owner), 0, x.owner, x.comp_b, x.owner, x.token)


def _dedup_dispatch(d: HopParts, x: Grid, coalesce: bool) -> None:
    d.add(x.tc & (x.comp != x.owner), 0, x.owner, x.comp, x.owner, x.token)


def _allgather_dispatch(d: HopParts, x: Grid, coalesce: bool) -> None:
    """No hop table (COMET's dense all-gather)."""


def _a2av_combine(c: HopParts, x: Grid, rr) -> None:
    c.add(x.valid_b & (x.comp_b != x.owner), 0, x.comp_b, x.owner, x.owner, x.token, entry=x.entry)


def _dedup_combine(c: HopParts, x: Grid, rr) -> None:
    c.add(x.tc & (x.comp != x.owner), 0, x.comp, x.owner, x.owner, x.token)


# ------------------------------------------------------------------------------------ gatewayed transports


class _RemoteRows:
    """Union rows of a gatewayed dispatch on the sorted grid ``[G, k]``: ``mask`` (one per token
    and remote node), ``carrier``, ``carrier_local``, ``gateway``, ``msg``, ``donated``;
    ``gateway_of_pair [G, k]``: per token-GPU position, the gateway of its token-node pair."""

    def __init__(self, x: Grid, mask, carrier_local, msg, donated):
        self.mask = mask
        self.carrier_local = carrier_local
        self.carrier = x.onode * x.L + carrier_local
        self.gateway = x.node * x.L + carrier_local
        self.msg = msg
        self.donated = donated
        gw = torch.where(mask, self.gateway, -1)
        self.gateway_of_pair = gw.gather(1, x.pair_j)


def _remote_union(x: Grid) -> torch.Tensor:
    return x.tn & x.pair_remote


def _relay_rows(x: Grid) -> _RemoteRows:
    mask = _remote_union(x)
    local = (x.owner % x.L).expand(x.G, x.k)
    return _RemoteRows(x, mask, local, 0, torch.zeros_like(mask))


def _zepp_rows(x: Grid, coalesce: bool) -> _RemoteRows:
    """The NIC-balanced minimal-move split (``zepp.planner.flows._zepp_rows``) on the grid."""
    L, N, R = x.L, x.N, x.R
    mask = _remote_union(x)
    src_local = (x.owner % L).expand(x.G, x.k)
    stream = (x.onode * N + x.node).clamp_min(0)  # [G, k], meaningful where mask
    idx = stream * L + src_local
    volume = counts(torch.where(mask, idx, N * N * L).reshape(-1), N * N * L).reshape(N * N, L)
    total = volume.sum(1, keepdim=True)
    cap = total // L + (arange(L, x.device)[None, :] < total % L).to(I64)
    kept = torch.minimum(volume, cap)
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
    return _RemoteRows(x, mask, carrier_local, msg, donated)


def _relay_dispatch(d: HopParts, x: Grid, coalesce: bool) -> _RemoteRows:
    rr = _relay_rows(x)
    _gatewayed_dispatch(d, x, rr)
    return rr


def _zepp_dispatch(d: HopParts, x: Grid, coalesce: bool) -> _RemoteRows:
    rr = _zepp_rows(x, coalesce)
    _gatewayed_dispatch(d, x, rr)
    return rr


def _gatewayed_dispatch(d: HopParts, x: Grid, rr: _RemoteRows) -> None:
    d.add(x.same_node, 0, x.owner, x.comp, x.owner, x.token)
    d.add(rr.donated, 0, x.owner, rr.carrier, x.owner, x.token, msg=rr.msg)
    d.add(rr.mask, 1, rr.carrier, rr.gateway, x.owner, x.token, msg=rr.msg)
    gw = rr.gateway_of_pair
    d.add(x.remote_tc & (x.comp != gw), 2, gw, x.comp, x.owner, x.token)


def _reduce_combine(c: HopParts, x: Grid, rr: _RemoteRows, direct: bool) -> None:
    L = x.L
    c.add(x.same_node, 0, x.comp, x.owner, x.owner, x.token)
    gw = rr.gateway_of_pair
    c.add(x.remote_tc & (x.comp != gw), 0, x.comp, gw, x.owner, x.token)
    if direct:
        c.add(rr.mask, 1, rr.gateway, x.owner, x.owner, x.token)
        return
    c.add(rr.mask, 1, rr.gateway, rr.carrier, x.owner, x.token, msg=rr.msg)
    # One forward per (token, landing GPU), in (token, local GPU) order.
    need = rr.mask & (rr.carrier != x.owner)
    g = arange(x.G, x.device)[:, None]
    landed = counts(torch.where(need, g * L + rr.carrier_local, x.G * L).reshape(-1), x.G * L).reshape(x.G, L) > 0
    local = arange(L, x.device)[None, :]
    c.add(landed, 2, x.onode * L + local, x.owner, x.owner, x.token)


def _reduce(c: HopParts, x: Grid, rr: _RemoteRows) -> None:
    _reduce_combine(c, x, rr, direct=False)


def _reduce_direct(c: HopParts, x: Grid, rr: _RemoteRows) -> None:
    _reduce_combine(c, x, rr, direct=True)


# The torch builders of ``zepp.planner.flows``' transports, by name: a dispatch adds its hop groups
# to a ``HopParts`` and returns its union rows (gatewayed) or None; a combine adds its groups.
_TORCH_DISPATCHES = {"a2av": _a2av_dispatch, "dedup": _dedup_dispatch, "relay": _relay_dispatch,
                     "zepp": _zepp_dispatch, "allgather": _allgather_dispatch}
_TORCH_COMBINES = {"a2av": _a2av_combine, "dedup": _dedup_combine, "reduce": _reduce, "reduce-direct": _reduce_direct}
TORCH_DISPATCH = tuple(_TORCH_DISPATCHES)
TORCH_COMBINE = tuple(_TORCH_COMBINES)
