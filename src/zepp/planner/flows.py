"""Flows: the dispatch and combine hop tables of a routing, one transport per phase.

Transport names and their one-line meanings are in ``zepp.registry`` (``DISPATCH_TRANSPORTS``,
``COMBINE_TRANSPORTS``); see ``zepp.planner.types.Hops`` for what a hop means and the stage rules.

Dispatch:

- ``a2av``: one row per entry, owner -> computing rank (stage 0), no dedup.
- ``dedup``: one row per (token, computing rank), owner -> computing rank (stage 0).
- ``relay``: one NIC crossing per token and destination node (stage 1), to the GPU of the same
  local index (the *gateway*), which forwards over NVLink to each computing GPU of its node
  (stage 2); same-node computing GPUs get the row straight over NVLink (stage 0).
- ``zepp``: relay, plus the NIC-balanced minimal-move split of each node-to-node stream
  (PAPER.md section 2 item 4: a GPU keeps a prefix of its rows up to its cap and hands the rest,
  stage 0, to GPUs of its node under cap, which *carry* them across), and coalescing of the
  pieces one NIC carries into one message.
- ``allgather``: COMET's dense all-gather; routing-oblivious, no hop table (the simulator
  models it with the ``comet-allgather`` plug-in).

Combine:

- ``a2av``: one row per entry, computing rank -> owner (stage 0).
- ``dedup``: per (token, computing rank), the rank's entries summed there, straight to the owner.
- ``reduce`` (needs a ``relay`` or ``zepp`` dispatch): mirrors the dispatch: partials of a token
  computed on node m are summed on the gateway that received the token there (stage 0), cross
  the NIC once back to the dispatch's carrier (stage 1), which forwards them to the owner
  (stage 2). With a ``relay`` dispatch the carrier is the owner: no stage 2.
- ``reduce-direct`` (same need): the pre-reduced rows cross the NIC straight to the owner
  (stage 1): one stage fewer; the sending NICs stay balanced, the receiving NIC is the owner's.

Missing entries (id ``-1``, slot ``-1``) move nothing. Everything is vectorised numpy over rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.types import EntryView, FlowPlan, Hops, Routing, nic_split
from zepp.registry import COMBINE_TRANSPORTS, DEFAULT_COMBINE, DISPATCH_TRANSPORTS
from zepp.planner.routing import position_in_group

__all__ = ["build_flows", "check_transports", "transport_pairs", "nic_split", "DISPATCH_TRANSPORTS",
           "COMBINE_TRANSPORTS"]

_REDUCING = ("reduce", "reduce-direct")
_GATEWAYED = ("relay", "zepp")


def check_transports(dispatch: str, combine: str | None) -> tuple[str, str]:
    """Validate a (dispatch, combine) pair; ``combine=None`` takes the dispatch's natural one."""
    if dispatch not in DISPATCH_TRANSPORTS:
        raise ZeppInputError(f"unknown dispatch transport {dispatch!r}; choose one of {', '.join(DISPATCH_TRANSPORTS)}")
    combine = DEFAULT_COMBINE[dispatch] if combine is None else combine
    if combine not in COMBINE_TRANSPORTS:
        raise ZeppInputError(f"unknown combine transport {combine!r}; choose one of {', '.join(COMBINE_TRANSPORTS)}")
    if combine in _REDUCING and dispatch not in _GATEWAYED:
        raise ZeppInputError(f"combine {combine!r} pre-reduces on the dispatch's gateways; it needs a "
                             f"{' or '.join(_GATEWAYED)} dispatch, not {dispatch!r}")
    return dispatch, combine


def transport_pairs(with_hops: bool = True) -> list[tuple[str, str]]:
    """Every valid (dispatch, combine) pair; ``with_hops`` leaves out ``allgather`` (no hop table,
    so no real executor runs it)."""
    out = []
    for d in DISPATCH_TRANSPORTS:
        if with_hops and d == "allgather":
            continue
        for c in COMBINE_TRANSPORTS:
            if c not in _REDUCING or d in _GATEWAYED:
                out.append((d, c))
    return out


def build_flows(routing: Routing, dispatch: str, row_bytes: int, combine: str | None = None,
                coalesce: bool = True) -> FlowPlan:
    """The FlowPlan of ``routing`` with ``dispatch`` and ``combine`` transports (``combine``
    defaults to the dispatch's natural one: a2av->a2av, dedup->dedup, relay->dedup,
    zepp->reduce). ``row_bytes``: bytes of one hidden row.

    ``coalesce`` (``zepp`` dispatch only): pieces one NIC carries to one node travel as one
    message; without it, each piece keeps its own message (for ablation).
    """
    dispatch, combine = check_transports(dispatch, combine)
    x = EntryView(routing)
    if dispatch == "a2av":
        d, relay = _a2av_dispatch(x), None
    elif dispatch == "dedup":
        d, relay = _dedup_dispatch(x), None
    elif dispatch == "allgather":
        d, relay = Hops.empty(), None
    else:
        relay = _relay_rows(x) if dispatch == "relay" else _zepp_rows(x, coalesce)
        d = _gatewayed_dispatch(x, relay)
    if combine == "a2av":
        c = _a2av_combine(x)
    elif combine == "dedup":
        c = _dedup_combine(x)
    else:
        c = _reduce_combine(x, relay, direct=combine == "reduce-direct")
    return FlowPlan(routing, d, c, routing.placement.gpus_per_node, int(row_bytes), dispatch, combine)


# ---------------------------------------------------------------------------------------------
# direct transports


def _a2av_dispatch(x: EntryView) -> Hops:
    away = x.comp != x.owner
    return Hops.make(0, x.owner[away], x.comp[away], x.owner[away], x.token[away])


def _a2av_combine(x: EntryView) -> Hops:
    away = x.comp != x.owner
    return Hops.make(0, x.comp[away], x.owner[away], x.owner[away], x.token[away], entry=x.entry[away])


def _away_pairs(x: EntryView) -> np.ndarray:
    return x.tc_comp != x.tc_owner


def _dedup_dispatch(x: EntryView) -> Hops:
    m = _away_pairs(x)
    return Hops.make(0, x.tc_owner[m], x.tc_comp[m], x.tc_owner[m], x.tc_token[m])


def _dedup_combine(x: EntryView) -> Hops:
    m = _away_pairs(x)
    return Hops.make(0, x.tc_comp[m], x.tc_owner[m], x.tc_owner[m], x.tc_token[m])


# ---------------------------------------------------------------------------------------------
# gatewayed transports (relay, zepp)


@dataclass
class _RemoteRows:
    """The union rows of a gatewayed dispatch: one per (token, remote node), ``[V]`` each.

    ``owner``, ``token``: the token; ``carrier``: the GPU of the owner's node whose NIC carries
    it (the owner itself for ``relay``); ``gateway``: the GPU of the destination node it lands
    on; ``msg``: message key; ``donated``: indices of rows handed to another carrier first.
    ``gateway_of_pair [Q]``: per token-node pair of ``EntryView``, its gateway (-1: home node).
    """

    owner: np.ndarray
    token: np.ndarray
    carrier: np.ndarray
    gateway: np.ndarray
    msg: np.ndarray
    donated: np.ndarray
    gateway_of_pair: np.ndarray


def _remote_union(x: EntryView):
    remote = x.tn_node != x.tn_owner // x.L  # [Q] union rows: one per (token, remote node)
    return remote, x.tn_owner[remote], x.tn_token[remote], x.tn_node[remote]


def _relay_rows(x: EntryView) -> _RemoteRows:
    remote, owner, token, dst_node = _remote_union(x)
    gateway = (dst_node * x.L + owner % x.L).astype(np.int32)  # same local index
    gop = np.full(x.tn_node.shape[0], -1, np.int32)
    gop[remote] = gateway
    return _RemoteRows(owner, token, owner.astype(np.int32), gateway, np.zeros(owner.size, np.int32),
                       np.zeros(0, np.int64), gop)


def _zepp_rows(x: EntryView, coalesce: bool) -> _RemoteRows:
    L, N = x.L, x.N
    remote, owner, token, dst_node = _remote_union(x)
    src_node, src_local = owner // L, owner % L
    stream = src_node.astype(np.int64) * N + dst_node
    volume = np.bincount(stream * L + src_local, minlength=N * N * L).reshape(N * N, L)
    cap, kept = nic_split(volume)
    excess, deficit = volume - kept, cap - kept
    # Position of each row inside its (owner, node) segment, in token order: a GPU keeps a prefix.
    pos = position_in_group(owner.astype(np.int64) * N + dst_node, x.ranks * N)
    keep = pos < kept[stream, src_local]
    # Excess rows, numbered per stream in (donor GPU, token) order, fill deficits in GPU order,
    # so each stream splits into at most 2L-1 pieces.
    excess_before = np.cumsum(excess, axis=1) - excess
    donated = np.flatnonzero(~keep)
    xi = excess_before[stream[donated], src_local[donated]] + pos[donated] - kept[stream[donated], src_local[donated]]
    deficit_end = np.cumsum(deficit, axis=1)
    carrier_local = src_local.copy()
    carrier_local[donated] = (xi[:, None] >= deficit_end[stream[donated]]).sum(1)
    carrier = (src_node * L + carrier_local).astype(np.int32)
    gateway = (dst_node * L + carrier_local).astype(np.int32)
    msg = np.zeros_like(carrier) if coalesce else src_local.astype(np.int32)
    gop = np.full(x.tn_node.shape[0], -1, np.int32)
    gop[remote] = gateway
    return _RemoteRows(owner, token, carrier, gateway, msg, donated, gop)


def _same_node_pairs(x: EntryView) -> np.ndarray:
    return np.flatnonzero(x.same_node_pairs())


def _gatewayed_dispatch(x: EntryView, rr: _RemoteRows) -> Hops:
    m = _same_node_pairs(x)
    near = Hops.make(0, x.tc_owner[m], x.tc_comp[m], x.tc_owner[m], x.tc_token[m])
    dn = rr.donated
    handoff = Hops.make(0, rr.owner[dn], rr.carrier[dn], rr.owner[dn], rr.token[dn], msg=rr.msg[dn])
    cross = Hops.make(1, rr.carrier, rr.gateway, rr.owner, rr.token, msg=rr.msg)
    # Stage-2 NVLink forwards on the destination node: one row per (token, computing GPU)
    # other than the gateway that received the token.
    r = np.flatnonzero(x.remote_pairs())
    gw = rr.gateway_of_pair[x.tc_pair_node[r]]
    away = x.tc_comp[r] != gw
    sel = r[away]
    fan = Hops.make(2, gw[away], x.tc_comp[sel], x.tc_owner[sel], x.tc_token[sel])
    return Hops.concat([near, handoff, cross, fan])


def _reduce_combine(x: EntryView, rr: _RemoteRows, direct: bool) -> Hops:
    L, T = x.L, x.T
    m = _same_node_pairs(x)
    near = Hops.make(0, x.tc_comp[m], x.tc_owner[m], x.tc_owner[m], x.tc_token[m])
    r = x.remote_pairs()
    gw = rr.gateway_of_pair[x.tc_pair_node[r]]
    sel = np.flatnonzero(r)[x.tc_comp[r] != gw]
    gather = Hops.make(0, x.tc_comp[sel], rr.gateway_of_pair[x.tc_pair_node[sel]], x.tc_owner[sel], x.tc_token[sel])
    if direct:
        return Hops.concat([near, gather, Hops.make(1, rr.gateway, rr.owner, rr.owner, rr.token)])
    back = Hops.make(1, rr.gateway, rr.carrier, rr.owner, rr.token, msg=rr.msg)
    # One forward per (token, landing GPU): pieces from several nodes landing on one GPU are summed.
    need = rr.carrier != rr.owner
    landed = np.zeros((x.ranks * T, L), bool)
    landed[rr.owner[need].astype(np.int64) * T + rr.token[need], rr.carrier[need] % L] = True
    g, local = np.nonzero(landed)
    f_owner = (g // T).astype(np.int32)
    forward = Hops.make(2, (f_owner // L) * L + local, f_owner, f_owner, g % T)
    return Hops.concat([near, gather, back, forward])
