"""Proofs of a FlowPlan's invariants (``FlowPlan.validate``): every entry's token reaches its
computing rank, every entry's output returns to its owner exactly once, and the NIC-balanced
transports meet their caps. A broken plan raises ``PlanInvariantError`` naming the first violation
(a planner bug, never bad input). Vectorised numpy over hops; loops run over stages only.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from zepp.planner.flows import COMBINES, DISPATCHES, nic_split
from zepp.planner.flows.entry_view import EntryView
from zepp.planner.types import COMBINE, DISPATCH, FlowPlan, Hops, PlanInvariantError


def validate_flow_plan(plan: FlowPlan) -> None:
    """Prove the plan's invariants, or raise ``PlanInvariantError`` naming the first violation:

    - the routing itself is valid (``Routing.validate``);
    - dispatch: every hop's source holds the row when its stage starts, and every entry's
      computing rank holds its token at the end;
    - combine: every hop moves something its source holds (a whole partial, or one entry's
      output still in place), no output moves twice in a stage, and at the end every entry's
      output sits at its token's owner, counted exactly once (outputs only move, so none is
      duplicated or lost);
    - NIC-balanced dispatch (``zepp``): each node-to-node stream's NIC loads meet the caps
      ``floor(V/L) + [i < V mod L]``, in both phases (the pre-reduced combines mirror the split).

    A dispatch without a hop table (``allgather``: every token reaches every rank) is not checked.
    """
    routing = plan.routing
    routing.validate()
    x = EntryView(routing)
    dispatch = DISPATCHES[plan.dispatch_transport]
    if dispatch.has_hops:
        _validate_dispatch(plan.dispatch, x)
    _validate_combine(plan.combine, x)
    if dispatch.nic_balanced:
        _validate_nic_caps(plan, x)


def _fail_first(bad: np.ndarray, message: Callable[[int], str]) -> None:
    """Raise ``PlanInvariantError(message(i))`` for the first ``i`` where ``bad [n]`` holds."""
    if bad.any():
        raise PlanInvariantError(message(np.flatnonzero(bad)[0]))


def _held_key(rank, owner, token, x: EntryView) -> np.ndarray:
    return (np.asarray(rank, np.int64) * x.ranks + owner) * x.T + token


def _contains(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Membership of ``keys`` in ``sorted_keys`` (ascending, duplicates allowed)."""
    if sorted_keys.size == 0:
        return np.zeros(keys.shape, bool)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return sorted_keys[pos] == keys


def _validate_dispatch(hops: Hops, x: EntryView) -> None:
    own = np.arange(x.ranks).repeat(x.T)
    held = np.sort(_held_key(own, own, np.tile(np.arange(x.T), x.ranks), x))
    for stage in range(hops.num_stages):
        h = hops.select(hops.stage == stage)
        have = _contains(held, _held_key(h.src, h.owner, h.token, x))
        _fail_first(~have, lambda i: f"dispatch stage {stage}: rank {h.src[i]} sends token {h.token[i]} of rank "
                                     f"{h.owner[i]} to rank {h.dst[i]} before holding it")
        held = np.sort(np.concatenate([held, _held_key(h.dst, h.owner, h.token, x)]))
    missing = ~_contains(held, _held_key(x.comp, x.owner, x.token, x))
    _fail_first(missing, lambda i: f"dispatch never delivers token {x.token[i]} of rank {x.owner[i]} to rank "
                                   f"{x.comp[i]}, which computes its entry {x.entry[i]}")


def _validate_combine(hops: Hops, x: EntryView) -> None:
    outputs = _Outputs(x)
    for stage in range(hops.num_stages):
        outputs.move(hops.select(hops.stage == stage), stage)
    loc = outputs.loc
    _fail_first(loc != x.owner, lambda i: f"combine leaves the output of entry {x.entry[i]} of token {x.token[i]} "
                                          f"(rank {x.owner[i]}) on rank {loc[i]} instead of its owner")


class _Outputs:
    """Where each entry's output sits (``loc [n]``, entries of ``EntryView`` order) while the
    combine's stages move them; ``token_id`` / ``entry_id [n]`` the flat keys of each entry."""

    def __init__(self, x: EntryView):
        self.x = x
        self.loc = x.comp.astype(np.int64).copy()  # where each entry's output sits now
        self.token_id = x.owner.astype(np.int64) * x.T + x.token  # [n]
        self.entry_id = self.token_id * x.k + x.entry

    def move(self, h: Hops, stage: int) -> None:
        """Apply the hops ``h`` of one stage; each output moves at most once."""
        x = self.x
        h_token = h.owner.astype(np.int64) * x.T + h.token
        new_loc = self.loc.copy()
        moved = np.zeros(self.loc.shape[0], np.int64)
        single = h.entry >= 0
        if single.any():
            self._move_entries(h, single, h_token, new_loc, moved, stage)
        if (~single).any():
            self._move_partials(h, ~single, h_token, new_loc, moved, stage)
        _fail_first(moved > 1, lambda i: f"combine stage {stage}: the output of entry {x.entry[i]} of token "
                                         f"{x.token[i]} (rank {x.owner[i]}) is sent more than once")
        self.loc = new_loc

    def _move_entries(self, h: Hops, single: np.ndarray, h_token: np.ndarray, new_loc: np.ndarray,
                      moved: np.ndarray, stage: int) -> None:
        """Hops of one entry's output (``h.entry >= 0``, mask ``single``): it must sit at ``src``."""
        x = self.x
        e = np.searchsorted(self.entry_id, h_token[single] * x.k + h.entry[single])
        ok = self.loc[e] == h.src[single]
        at = np.flatnonzero(single)
        _fail_first(~ok, lambda j: f"combine stage {stage}: rank {h.src[at[j]]} sends entry {h.entry[at[j]]} of token "
                                   f"{h.token[at[j]]} (rank {h.owner[at[j]]}) which it does not hold")
        np.add.at(moved, e, 1)
        new_loc[e] = h.dst[single]

    def _move_partials(self, h: Hops, whole: np.ndarray, h_token: np.ndarray, new_loc: np.ndarray,
                       moved: np.ndarray, stage: int) -> None:
        """Hops of whole partials (mask ``whole``): every output of the token sitting at ``src``
        moves; a rank sends a token's partial at most once and only when it holds one."""
        x = self.x
        hop_key = h_token[whole] * x.ranks + h.src[whole]
        sorted_hops = np.sort(hop_key)
        if (sorted_hops[1:] == sorted_hops[:-1]).any():
            raise PlanInvariantError(f"combine stage {stage}: a partial is sent twice by one rank")
        at_key = self.token_id * x.ranks + self.loc
        order = np.argsort(hop_key)
        pos = np.searchsorted(hop_key[order], at_key)
        pos = np.minimum(pos, hop_key.size - 1)
        hit = hop_key[order][pos] == at_key
        carried = np.bincount(order[pos[hit]], minlength=hop_key.size)
        at = np.flatnonzero(whole)
        _fail_first(carried == 0, lambda j: f"combine stage {stage}: rank {h.src[at[j]]} sends a partial of token "
                                            f"{h.token[at[j]]} (rank {h.owner[at[j]]}) but holds none")
        np.add.at(moved, np.flatnonzero(hit), 1)
        new_loc[hit] = h.dst[whole][order[pos[hit]]]


def _validate_nic_caps(plan: FlowPlan, x: EntryView) -> None:
    L, N = x.L, x.N
    phases = [(DISPATCH, plan.dispatch)]
    if COMBINES[plan.combine_transport].reduces:
        phases.append((COMBINE, plan.combine))
    for phase, hops in phases:
        cross = (hops.src // L) != (hops.dst // L)
        src, dst = hops.src[cross], hops.dst[cross]
        stream = (src // L).astype(np.int64) * N + dst // L
        load = np.bincount(stream * L + src % L, minlength=N * N * L).reshape(N * N, L)
        cap, _ = nic_split(load)
        over = load > cap
        if over.any():
            p, i = np.argwhere(over)[0]
            name = "dispatch" if phase == DISPATCH else "combine"
            raise PlanInvariantError(
                f"{name}: NIC {i} of node {p // N} carries {load[p, i]} rows to node {p % N}, "
                f"above its cap {cap[p, i]}")
