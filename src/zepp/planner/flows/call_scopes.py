"""Which process group carries each collective call of a layer: the rail-aligned hierarchy.

A *call* is one all-to-all of a layer (a dispatch stage, a combine stage, or one wave of combine
stage 0). Every rank knows every call's messages (``src``, ``dst`` of each non-empty transfer),
so every rank derives the same scope per call, and every member of a group knows whether its
group has anything to move (no rank waits on a call its peers skip):

- ``none``: the call moves nothing anywhere; no rank runs it;
- ``node``: every message stays inside a node; the call runs on the node groups (ranks
  ``n * L .. n * L + L - 1``) of the nodes that move something;
- ``rail``: every message goes between ranks of the same local index (``rank % L``) on different
  nodes; the call runs on the rail groups (ranks ``l, l + L, ...``) of the rails that move
  something (the rail-aligned NIC stage);
- ``world``: anything else; one call over all ranks.

Group member order is ascending global rank, so a sender's rows ordered by global destination
are already in the group's order. The runtime (``zepp.runtime.collectives``) and the simulator's
stage-collective model (``zepp.sim.collectives``) both read ``call_scopes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCOPES = ("none", "node", "rail", "world")
NONE, NODE, RAIL, WORLD = range(4)


@dataclass(frozen=True)
class CallScopes:
    """``kind [K]`` (index into ``SCOPES``) and ``active [K, R]``: whether rank ``r`` takes part
    in call ``k`` (member of a group of the call that moves something)."""

    kind: np.ndarray
    active: np.ndarray

    def group_of(self, k: int, rank: int, gpus_per_node: int, ranks: int) -> np.ndarray:
        """``[m]`` global ranks of the group ``rank`` uses for call ``k`` (ascending)."""
        return group_members(int(self.kind[k]), rank, gpus_per_node, ranks)


def group_members(kind: int, rank: int, gpus_per_node: int, ranks: int) -> np.ndarray:
    L = gpus_per_node
    if kind == NODE:
        return np.arange(rank // L * L, rank // L * L + L)
    if kind == RAIL:
        return np.arange(rank % L, ranks, L)
    return np.arange(ranks)


def call_scopes(call: np.ndarray, src: np.ndarray, dst: np.ndarray, calls: int, ranks: int,
                gpus_per_node: int) -> CallScopes:
    """Scopes of ``calls`` calls from their non-empty messages ``call/src/dst [m]`` (vectorised)."""
    R, L = ranks, gpus_per_node
    key = (np.asarray(call, np.int64) * R + np.asarray(src)) * R + np.asarray(dst)
    pairs = (np.bincount(key, minlength=calls * R * R) > 0).reshape(calls, R, R)  # [K, src, dst]
    rk = np.arange(R)
    pairs[:, rk, rk] = False  # a rank's rows to itself never leave it
    same_node = (rk[:, None] // L) == (rk[None, :] // L)
    same_rail = (rk[:, None] % L) == (rk[None, :] % L)
    has = pairs.any(axis=(1, 2))
    cross_node = (pairs & ~same_node).any(axis=(1, 2))
    cross_rail = (pairs & ~same_rail).any(axis=(1, 2))
    kind = np.where(~has, NONE, np.where(~cross_node, NODE, np.where(~cross_rail, RAIL, WORLD))).astype(np.int64)
    # which groups move something: a node (node scope) or a rail (rail scope) with a message
    sends = pairs.any(axis=2)  # [K, R] rank sends something in the call
    node_busy = sends.reshape(calls, R // L, L).any(axis=2)  # [K, N]
    rail_busy = sends.reshape(calls, R // L, L).any(axis=1)  # [K, L]
    active = np.zeros((calls, R), bool)
    active[kind == WORLD] = True
    active[kind == NODE] = node_busy[kind == NODE][:, rk // L]
    active[kind == RAIL] = rail_busy[kind == RAIL][:, rk % L]
    return CallScopes(kind, active)
