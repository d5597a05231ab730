"""The gatewayed transports: one NIC crossing per (token, destination node) to a *gateway* GPU of
that node, which forwards over NVLink; and the combines that pre-reduce on those gateways.

Dispatch:

- ``relay``: one NIC crossing per token and destination node (stage 1), to the GPU of the same
  local index (the gateway), which forwards over NVLink to each computing GPU of its node
  (stage 2); same-node computing GPUs get the row straight over NVLink (stage 0).
- ``zepp``: relay, plus the NIC-balanced minimal-move split of each node-to-node stream
  (PAPER.md section 2 item 4: a GPU keeps a prefix of its rows up to its cap and hands the rest,
  stage 0, to GPUs of its node under cap, which *carry* them across), and coalescing of the
  pieces one NIC carries into one message.

Combine (needs a gatewayed dispatch):

- ``reduce``: mirrors the dispatch: partials of a token computed on node m are summed on the
  gateway that received the token there (stage 0), cross the NIC once back to the dispatch's
  carrier (stage 1), which forwards them to the owner (stage 2). With a ``relay`` dispatch the
  carrier is the owner: no stage 2.
- ``reduce-direct``: the pre-reduced rows cross the NIC straight to the owner (stage 1): one
  stage fewer; the sending NICs stay balanced, the receiving NIC is the owner's.

Dispatch builders take ``(x: EntryView, coalesce)`` and return ``(Hops, RemoteRows)``; combine
builders take ``(x, RemoteRows)``. ``nic_split`` is the zepp dispatch's split rule (the validation
checks the caps with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.routing import position_in_group
from zepp.planner.flows.entry_view import EntryView
from zepp.planner.types import Hops


@dataclass
class RemoteRows:
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


def relay_dispatch(x: EntryView, coalesce: bool) -> tuple[Hops, RemoteRows]:
    return _with_rows(x, _relay_rows(x))


def zepp_dispatch(x: EntryView, coalesce: bool) -> tuple[Hops, RemoteRows]:
    """``coalesce``: pieces one NIC carries to one node travel as one message (else one each)."""
    return _with_rows(x, _zepp_rows(x, coalesce))


def _with_rows(x: EntryView, rr: RemoteRows) -> tuple[Hops, RemoteRows]:
    """A gatewayed dispatch's hops and the union rows its combine reduces back through."""
    return _gatewayed_dispatch(x, rr), rr


def reduce_combine(x: EntryView, rr: RemoteRows) -> Hops:
    near, gather = _reduce_on_gateways(x, rr)
    back = Hops.make(1, rr.gateway, rr.carrier, rr.owner, rr.token, msg=rr.msg)
    # One forward per (token, landing GPU): pieces from several nodes landing on one GPU are summed.
    L, T = x.L, x.T
    need = rr.carrier != rr.owner
    landed = np.zeros((x.ranks * T, L), bool)
    landed[rr.owner[need].astype(np.int64) * T + rr.token[need], rr.carrier[need] % L] = True
    g, local = np.nonzero(landed)
    f_owner = (g // T).astype(np.int32)
    forward = Hops.make(2, (f_owner // L) * L + local, f_owner, f_owner, g % T)
    return Hops.concat([near, gather, back, forward])


def reduce_direct_combine(x: EntryView, rr: RemoteRows) -> Hops:
    near, gather = _reduce_on_gateways(x, rr)
    return Hops.concat([near, gather, Hops.make(1, rr.gateway, rr.owner, rr.owner, rr.token)])


# --------------------------------------------------------------------------- union rows


def nic_split(volume: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The NIC-balanced minimal-move split of node-to-node streams.

    ``volume [P, L]``: union rows of each stream from each local GPU. Returns ``cap [P, L]``
    (rows NIC ``i`` carries: ``floor(V/L) + [i < V mod L]``) and ``kept [P, L]`` (rows GPU
    ``i`` sends through its own NIC, ``min(V_i, cap_i)``); the excess moves to GPUs under cap.
    """
    P, L = volume.shape
    total = volume.sum(1, keepdims=True)
    cap = total // L + (np.arange(L)[None, :] < total % L)
    return cap, np.minimum(volume, cap)


def _remote_union(x: EntryView):
    remote = x.tn_node != x.tn_owner // x.L  # [Q] union rows: one per (token, remote node)
    return remote, x.tn_owner[remote], x.tn_token[remote], x.tn_node[remote]


def _relay_rows(x: EntryView) -> RemoteRows:
    remote, owner, token, dst_node = _remote_union(x)
    gateway = (dst_node * x.L + owner % x.L).astype(np.int32)  # same local index
    gop = np.full(x.tn_node.shape[0], -1, np.int32)
    gop[remote] = gateway
    return RemoteRows(owner, token, owner.astype(np.int32), gateway, np.zeros(owner.size, np.int32),
                      np.zeros(0, np.int64), gop)


def _zepp_rows(x: EntryView, coalesce: bool) -> RemoteRows:
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
    return RemoteRows(owner, token, carrier, gateway, msg, donated, gop)


# --------------------------------------------------------------------------- hop groups


def _gatewayed_dispatch(x: EntryView, rr: RemoteRows) -> Hops:
    m = np.flatnonzero(x.same_node_pairs())
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


def _reduce_on_gateways(x: EntryView, rr: RemoteRows) -> tuple[Hops, Hops]:
    """Stage 0 of both reducing combines: same-node partials straight to the owner, remote ones
    summed on the gateway that received their token."""
    m = np.flatnonzero(x.same_node_pairs())
    near = Hops.make(0, x.tc_comp[m], x.tc_owner[m], x.tc_owner[m], x.tc_token[m])
    r = x.remote_pairs()
    gw = rr.gateway_of_pair[x.tc_pair_node[r]]
    sel = np.flatnonzero(r)[x.tc_comp[r] != gw]
    gather = Hops.make(0, x.tc_comp[sel], rr.gateway_of_pair[x.tc_pair_node[sel]], x.tc_owner[sel], x.tc_token[sel])
    return near, gather
