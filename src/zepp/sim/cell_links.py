"""A FlowPlan's ``CellFlows`` (``zepp.sim.cell_flows``): its volumes as cells, their free rows
and their stage links, from the counts the volumes were built from (``FlowPlan.volume_state``).

Direct transports move every row in one stage: no links. A gatewayed dispatch (and the combine
that pre-reduces on its gateways) relate its stages through the tokens each NIC carries; with
``R3[r, cl, c]`` = tokens of owner ``r`` carried by local GPU ``cl`` of ``r``'s node to node
``n = c // L`` with an entry on GPU ``c`` (``_carried_pairs``):

- dispatch 1 -> 2: ``(cl of r's node -> gw)`` then ``(gw -> c)`` for ``R3 > 0``, ``gw = n L + cl``,
  ``c != gw``; combine 0 -> 1: ``(c -> gw)`` then ``(gw -> carrier)`` (``via_carrier``) or
  ``(gw -> r)``, the same triples;
- for each row handed to another NIC (owner ``r``, node ``n``, carrier ``cl``): dispatch 0 -> 1
  ``(r -> carrier)`` (the hand-off, or the same-node send when the token also computes on the
  carrier) then ``(carrier -> n L + cl)``; combine 1 -> 2 ``(n L + cl -> carrier)`` then
  ``(carrier -> r)``.

Free rows (``predispatch``): same-node sends and hand-offs to a GPU holding the single copy of
one of the token's experts (``zepp.sim.predispatch``), counted per (owner, GPU) from the routing.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.flows import COMBINES, DISPATCHES
from zepp.planner.types import FlowPlan
from zepp.planner.volumes import Volumes
from zepp.sim.cell_flows import CellFlows, cells_of

def plan_cells(plan: FlowPlan, single: np.ndarray | None = None) -> tuple[CellFlows, CellFlows]:
    """``(dispatch, combine)`` cells of ``plan``; ``single [R*S]``: the single-copy slots whose
    rows are free (``None``: no free rows). Only for transports with hop tables and, with free
    rows, a gatewayed dispatch (``counted``)."""
    tc, gw, vol = plan.volume_state
    L = tc.L
    d_links = c_links = _empty_links()
    free = None
    if DISPATCHES[plan.dispatch_transport].gatewayed:
        moved = _moved(tc, gw, single)
        rel = _carried_pairs(tc, gw)
        d_links = _concat_links([_cross_to_fan(rel, gw, L), *_into_carriers(tc, moved, gw)])
        if COMBINES[plan.combine_transport].reduces:
            via = COMBINES[plan.combine_transport].via_carrier
            c_links = _concat_links([_gather_to_back(rel, gw, L, via)] + ([_back_to_forward(moved, gw, L)] if via
                                                                          else []))
        if single is not None:
            free = _free_rows(tc, moved, gw, single)
    return cells_of(vol.dispatch, free, d_links, L), cells_of(vol.combine, None, c_links, L)


def counted(plan: FlowPlan, predispatch: bool) -> bool:
    """Whether ``plan_cells`` covers ``plan`` (a hop table, built from the routing's counts; with
    free rows, a gatewayed dispatch)."""
    return (plan.hops is None and DISPATCHES[plan.dispatch_transport].has_hops
            and (not predispatch or DISPATCHES[plan.dispatch_transport].gatewayed))


def _empty_links():
    z = np.zeros(0, np.int64)
    end = {c: z for c in ("stage", "src", "dst", "msg", "owner_node", "free")}
    return end, dict(end)


def _end(stage, src, dst, msg, onode, free=0) -> dict:
    cols = np.broadcast_arrays(*(np.asarray(v, np.int64) for v in (stage, src, dst, msg, onode, free)))
    return dict(zip(("stage", "src", "dst", "msg", "owner_node", "free"), (c.ravel() for c in cols)))


def _concat_links(parts) -> tuple[dict, dict]:
    parts = [p for p in parts if p is not None]
    if not parts:
        return _empty_links()
    return tuple({c: np.concatenate([p[i][c] for p in parts]) for c in parts[0][0]} for i in (0, 1))


def _moved(tc, gw, single):
    """The handed rows: ``(owner, token, node, carrier_local, free)``, ``free`` the token has a
    single-copy entry on its carrier (``None`` without ``single``)."""
    L = tc.L
    carrier = (gw.owner // L) * L + gw.carrier_local
    free = tc.has_single_on(gw.owner, gw.token, carrier, single) if single is not None else None
    return gw.owner, gw.token, gw.node, gw.carrier_local, free


def _carried_pairs(tc, gw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(r, cl, c)`` ``[p]`` with ``R3[r, cl, c] > 0`` (see the module docstring)."""
    R, L = tc.R, tc.L
    rank = np.arange(R)
    remote = (rank[:, None] // L) != (rank[None, :] // L)
    moved_pairs = np.zeros((R, R), np.int64)
    parts = []
    if gw.owner.size:
        gpus = tc.gpus_on(gw.owner, gw.token, gw.node)  # [d, k]
        d, j = np.nonzero(gpus >= 0)
        np.add.at(moved_pairs, (gw.owner[d], gpus[d, j]), 1)
        parts.append(np.unique((gw.owner[d] * L + gw.carrier_local[d]) * R + gpus[d, j]))
    r, c = np.nonzero(remote & (tc.pairs - moved_pairs > 0))
    parts.append((r * L + r % L) * R + c)  # rows kept by their owner's NIC: carrier = the owner
    key = np.unique(np.concatenate(parts))
    return key // R // L, (key // R) % L, key % R


def _cross_to_fan(rel, gw, L: int):
    r, cl, c = rel
    gateway = (c // L) * L + cl
    ok = c != gateway
    r, cl, c, gateway = r[ok], cl[ok], c[ok], gateway[ok]
    o = r // L
    return _end(1, o * L + cl, gateway, gw.msg_of(r), o), _end(2, gateway, c, 0, o)


def _gather_to_back(rel, gw, L: int, via_carrier: bool):
    r, cl, c = rel
    gateway = (c // L) * L + cl
    ok = c != gateway
    r, cl, c, gateway = r[ok], cl[ok], c[ok], gateway[ok]
    o = r // L
    back = _end(1, gateway, o * L + cl, gw.msg_of(r), o) if via_carrier else _end(1, gateway, r, 0, o)
    return _end(0, c, gateway, 0, o), back


def _into_carriers(tc, moved, gw):
    """Dispatch 0 -> 1 of the handed rows: the hand-off, and the same-node send where the token
    also computes on its carrier."""
    owner, token, node, cl, free = moved
    if owner.size == 0:
        return []
    L = tc.L
    o = owner // L
    carrier = o * L + cl
    f = np.zeros(owner.size, np.int64) if free is None else free.astype(np.int64)
    cross = _end(1, carrier, node * L + cl, gw.msg_of(owner), o)
    handoff = (_end(0, owner, carrier, gw.msg_of(owner), o, f), cross)
    on = (tc.gpus_on(owner, token, o) == carrier[:, None]).any(1)  # the token computes on its carrier
    near = ({c: v[on] for c, v in _end(0, owner, carrier, 0, o, f).items()}, {c: v[on] for c, v in cross.items()})
    return [handoff, near]


def _back_to_forward(moved, gw, L: int):
    owner, token, node, cl, _ = moved
    o = owner // L
    carrier = o * L + cl
    return _end(1, node * L + cl, carrier, gw.msg_of(owner), o), _end(2, carrier, owner, 0, o)


def _free_rows(tc, moved, gw, single) -> Volumes:
    """The dispatch's free rows: same-node sends to a GPU holding a single-copy entry of the
    token, and hand-offs whose carrier holds one."""
    R, L, N = tc.R, tc.L, tc.N
    rank = np.arange(R)
    near = tc.single_pairs(single) * ((rank[:, None] // L == rank[None, :] // L) & (rank[:, None] != rank[None, :]))
    r, c = np.nonzero(near)
    owner, _, _, cl, free = moved
    h = free.astype(bool) if owner.size else np.zeros(0, bool)
    o = owner[h] // L
    return Volumes.of_cells(0, np.concatenate([r, owner[h]]), np.concatenate([c, o * L + cl[h]]),
                            np.concatenate([np.zeros(r.size, np.int64), gw.msg_of(owner[h])]),
                            np.concatenate([r // L, o]), np.concatenate([near[r, c], np.ones(int(h.sum()), np.int64)]),
                            R, N)
