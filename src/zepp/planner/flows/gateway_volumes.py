"""The gatewayed transports' volumes (``gateway_flows`` counted, from ``TokenCounts``).

A gatewayed dispatch sends one row per token and remote node (``union``); the NIC of local GPU
``cl`` of the owner's node carries it to GPU ``cl`` of the destination node (the gateway), which
forwards it over NVLink to the token's other GPUs there (``pairs``). ``relay`` carries every
row on the owner's own NIC; ``zepp`` splits each node-to-node stream over the node's NICs
(``nic_split``): a GPU keeps the first rows of each of its segments up to its cap, in token
order, and its excess, numbered per stream in (GPU, token) order, fills the other GPUs'
deficits in GPU order. The split is decided on counts (``_split``: how many rows each GPU hands
each other GPU, an overlap of intervals); only the handed rows are listed
(``TokenCounts.rows_beyond``), for the forwards that start on their new gateway.

Dispatch builders take ``(tc: TokenCounts, coalesce)`` and return ``(Volumes, Gateways)``;
combine builders take ``(tc, Gateways)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.flows.gateway_flows import nic_split
from zepp.planner.flows.token_counts import TokenCounts
from zepp.planner.intsort import sorted_unique
from zepp.planner.volumes import Volumes


@dataclass
class Gateways:
    """The union rows of a gatewayed dispatch, counted: ``carried [R, N, L]`` rows of owner
    ``r`` to node ``n`` carried by local GPU ``cl`` of ``r``'s node (landing on GPU ``cl`` of node
    ``n``); ``by_owner_local``: messages keyed by the owner's local GPU (``zepp`` without
    coalescing), else one key; the handed rows ``owner``, ``token``, ``node``, ``carrier_local``
    ``[d]`` (carried by another GPU than the owner); ``near [R, R]`` the token-GPU pairs on the
    owner's node and ``fan`` the cells of the forwards from the gateways (``_near_and_fan``)."""

    carried: np.ndarray
    by_owner_local: bool
    owner: np.ndarray
    token: np.ndarray
    node: np.ndarray
    carrier_local: np.ndarray
    near: np.ndarray | None = None
    fan: list | None = None

    def msg_of(self, owner: np.ndarray) -> np.ndarray:
        """The message key of owners' rows (``owner``'s shape): the owner's local GPU where messages
        are keyed by it (``by_owner_local``), else 0."""
        return owner % self.carried.shape[2] if self.by_owner_local else np.zeros_like(owner)


def relay_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[Volumes, Gateways]:
    R, L, N = tc.R, tc.L, tc.N
    carried = np.zeros((R, N, L), np.int64)
    carried[np.arange(R), :, np.arange(R) % L] = _remote_union(tc)
    z = np.zeros(0, np.int64)
    gw = Gateways(carried, False, z, z, z, z)
    return _gatewayed_dispatch(tc, gw), gw


def zepp_dispatch(tc: TokenCounts, coalesce: bool) -> tuple[Volumes, Gateways]:
    """``coalesce``: pieces one NIC carries to one node travel as one message (else one each)."""
    gw = _split(tc, not coalesce)
    return _gatewayed_dispatch(tc, gw), gw


def reduce_combine(tc: TokenCounts, gw: Gateways) -> Volumes:
    L = tc.L
    r, n, cl = np.nonzero(gw.carried)
    back = (1, n * L + cl, (r // L) * L + cl, gw.msg_of(r), r // L, gw.carried[r, n, cl])
    # One forward per (token, landing GPU) other than the owner: pieces from several nodes
    # landing on one GPU are summed there first.
    key = sorted_unique((gw.owner * tc.T + gw.token) * L + gw.carrier_local)
    owner, local = key // L // tc.T, key % L
    forward = (2, (owner // L) * L + local, owner, 0, owner // L, 1)
    return _cells(tc, *_reduce_on_gateways(tc, gw), back, forward)


def reduce_direct_combine(tc: TokenCounts, gw: Gateways) -> Volumes:
    L = tc.L
    r, n, cl = np.nonzero(gw.carried)
    back = (1, n * L + cl, r, 0, r // L, gw.carried[r, n, cl])
    return _cells(tc, *_reduce_on_gateways(tc, gw), back)


# --------------------------------------------------------------------------- the split


def _remote_union(tc: TokenCounts) -> np.ndarray:
    """``[R, N]`` token-node pairs on other nodes than the owner's."""
    u = tc.union.copy()
    u[np.arange(tc.R), np.arange(tc.R) // tc.L] = 0
    return u


def _split(tc: TokenCounts, by_owner_local: bool) -> Gateways:
    """The NIC-balanced minimal-move split on counts, and the handed rows listed."""
    R, L, N = tc.R, tc.L, tc.N
    union = _remote_union(tc)
    volume = union.reshape(N, L, N).transpose(0, 2, 1).reshape(N * N, L)  # [stream (o, n), local]
    cap, kept = nic_split(volume)
    excess, deficit = volume - kept, cap - kept
    ex_end, de_end = np.cumsum(excess, 1), np.cumsum(deficit, 1)
    # rows GPU i hands GPU j: the overlap of i's excess and j's deficit in the stream's numbering
    handed = np.minimum(ex_end[:, :, None], de_end[:, None, :]) - np.maximum((ex_end - excess)[:, :, None],
                                                                          (de_end - deficit)[:, None, :])
    carried = np.maximum(handed, 0)  # [stream, from, to]
    carried[:, np.arange(L), np.arange(L)] += kept
    carried = carried.reshape(N, N, L, L).transpose(0, 2, 1, 3).reshape(R, N, L)  # [owner, node, carrier]
    kept_rn = kept.reshape(N, N, L).transpose(0, 2, 1).reshape(R, N)
    kept_rn[np.arange(R), np.arange(R) // L] = np.iinfo(np.int64).max  # the home node: no rows handed
    owner, token, node, place = tc.rows_beyond(kept_rn)
    stream, local = (owner // L) * N + node, owner % L
    xi = (ex_end - excess)[stream, local] + place - kept[stream, local]
    carrier_local = np.zeros(xi.size, np.int64)
    for end in de_end.T:  # the GPU whose deficit interval holds xi (one column of L at a time)
        carrier_local += xi >= end.take(stream)
    return Gateways(carried, by_owner_local, owner, token, node, carrier_local)


# --------------------------------------------------------------------------- cells


def _cells(tc: TokenCounts, *parts) -> Volumes:
    """One phase's ``Volumes`` from parts ``(stage, src, dst, msg, owner_node, rows)`` (arrays or
    scalars, broadcast within a part)."""
    return Volumes.of_parts(parts, tc.R, tc.N)


def _pair_part(counts: np.ndarray, stage: int, L: int, back: bool = False) -> tuple:
    """``counts [R, R]`` rows from owner ``r`` to rank ``c`` (``back``: ``c`` to ``r``), as a part."""
    r, c = np.nonzero(counts)
    src, dst = (c, r) if back else (r, c)
    return stage, src, dst, 0, r // L, counts[r, c]


def _gatewayed_dispatch(tc: TokenCounts, gw: Gateways) -> Volumes:
    L = tc.L
    r, n, cl = np.nonzero(gw.carried)
    rows, msg, home = gw.carried[r, n, cl], gw.msg_of(r), (r // L) * L
    handoff = (0, r, home + cl, msg, r // L, np.where(cl != r % L, rows, 0))
    cross = (1, home + cl, n * L + cl, msg, r // L, rows)
    near, fan = _near_and_fan(tc, gw)
    forwards = ((2, src, dst, 0, on, rows) for src, dst, on, rows in fan)
    return _cells(tc, _pair_part(near, 0, L), handoff, cross, *forwards)


def _reduce_on_gateways(tc: TokenCounts, gw: Gateways) -> tuple[tuple, ...]:
    """Stage 0 of both reducing combines, as parts: same-node partials to the owner, remote ones to
    the gateway that received their token (the dispatch's forwards, reversed)."""
    near, fan = _near_and_fan(tc, gw)
    return _pair_part(near, 0, tc.L, back=True), *((0, dst, src, 0, on, rows) for src, dst, on, rows in fan)


def _near_and_fan(tc: TokenCounts, gw: Gateways) -> tuple[np.ndarray, list]:
    """``near [R, R]``: token-GPU pairs on the owner's node, other than the owner; ``fan``: the
    stage-2 forwards as parts ``(src, dst, owner node, rows)``, one row per token-GPU pair on
    another node, from the gateway that received the token there (unless the GPU is that gateway)."""
    if gw.near is None:
        R, L = tc.R, tc.L
        rank = np.arange(R)
        same = (rank[:, None] // L) == (rank[None, :] // L)
        gw.near = np.where(same & (rank[:, None] != rank[None, :]), tc.pairs, 0)
        r, c = np.nonzero(np.where(same, 0, tc.pairs))
        gateway = (c // L) * L + r % L  # the owner's own NIC, unless the row was handed (below)
        parts = [(gateway, c, r // L, np.where(c != gateway, tc.pairs[r, c], 0))]
        if gw.owner.size:
            row, gpus = tc.gpus_on_listed(gw.owner, gw.token, gw.node)  # each handed row's GPUs there
            old, new = gw.node[row] * L + gw.owner[row] % L, gw.node[row] * L + gw.carrier_local[row]
            onode = gw.owner[row] // L
            parts.append((old, gpus, onode, -(gpus != old).astype(np.int64)))
            parts.append((new, gpus, onode, (gpus != new).astype(np.int64)))
        gw.fan = parts
    return gw.near, gw.fan
