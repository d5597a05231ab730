"""Flows: the dispatch and combine transfers of a routing, for each transport.

Transports (see ``zepp.plan.Hops`` for what a hop means and the stage rules):

- ``a2av``: direct GPU-to-GPU all-to-all-v, one row per entry each way, no dedup. Dispatch:
  owner -> computing rank (stage 0). Combine: computing rank -> owner, one row per entry.
- ``relay``: one NIC crossing per token and destination node, to the GPU of the same local
  index, which forwards over NVLink to each computing GPU of its node (one row per token and
  GPU). Same-node computing GPUs get the row straight over NVLink. Combine without
  pre-reduction: each computing GPU returns one row per token (its entries summed locally)
  straight to the owner.
- ``zepp``: relay, plus the NIC-balanced minimal-move split of each node-to-node stream
  (PAPER.md section 2 item 4), coalescing of the pieces one NIC carries into one message, and
  combine pre-reduction on the computing node: partials of a token computed on node m are
  summed on the GPU that received the token there and cross the NIC once, mirroring dispatch.
- ``zepp-direct``: ``zepp`` whose pre-reduced combine rows cross the NIC straight to the owner
  instead of landing on the GPU of the same local index and being forwarded over NVLink: one
  stage fewer and no forward (the sending NICs stay balanced; the receiving NIC is the owner's).
  For executors where every stage costs a collective (the CPU runtime), not a PAPER.md design.

Everything is vectorised numpy over rows; loops run over nothing larger than a stage.
"""

from __future__ import annotations

import functools

import numpy as np

from zepp.errors import ZeppInputError
from zepp.plan import COMBINE, DISPATCH, FlowPlan, Hops, PlanInvariantError, Routing
from zepp.routing import position_in_group

TRANSPORTS = ("a2av", "relay", "zepp", "zepp-direct")


def build_flows(routing: Routing, transport: str, row_bytes: int, coalesce: bool = True) -> FlowPlan:
    """The FlowPlan of ``routing`` over ``transport``. ``row_bytes``: bytes of one hidden row.

    ``coalesce`` (``zepp`` only): pieces one NIC carries to one node travel as one message;
    without it, each piece keeps its own message (for ablation).
    """
    if transport not in TRANSPORTS:
        raise ZeppInputError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    entries = _Entries(routing)
    if transport == "a2av":
        dispatch, combine = _a2av(entries)
    elif transport == "relay":
        dispatch, combine = _relay(entries)
    else:
        dispatch, combine = _zepp(entries, coalesce, direct=transport == "zepp-direct")
    return FlowPlan(routing, dispatch, combine, routing.placement.gpus_per_node, int(row_bytes), transport)


class _Entries:
    """Flat views of a routing, plus its per-token deduplications.

    Entries (``[n]``, ``n = R*T*k``, batch order): ``owner``, ``token``, ``entry``, ``comp``.
    Token-GPU pairs (``tc_*``, ``[P]``): distinct (token, computing rank), ordered by (owner,
    token, rank). Token-node pairs (``tn_*``, ``[Q]``): distinct (token, computing node), ordered
    by (owner, token, node). ``tc_pair_node [P]`` indexes the token-node pair of each token-GPU
    pair. Dedup sorts each token's ``k`` ranks, so it is linear in the entries.
    """

    def __init__(self, routing: Routing):
        p = routing.placement
        ranks, T, k = routing.topk_ids.shape
        self.ranks, self.T, self.k, self.L = ranks, T, k, p.gpus_per_node
        self.N = ranks // self.L
        self.comp = routing.compute_rank.ravel().astype(np.int32)
        G = ranks * T
        comp = np.sort(self.comp.reshape(G, k), axis=1)  # a token's ranks, ascending (so nodes too)
        node = comp // self.L
        first_c = np.ones((G, k), bool)
        first_c[:, 1:] = comp[:, 1:] != comp[:, :-1]
        first_n = np.ones((G, k), bool)
        first_n[:, 1:] = node[:, 1:] != node[:, :-1]
        fc, fn = first_c.ravel(), first_n.ravel()
        tc_where, tn_where = np.flatnonzero(fc), np.flatnonzero(fn)
        tc_g, tn_g = (tc_where // k).astype(np.int32), (tn_where // k).astype(np.int32)  # token index
        self.tc_owner = tc_g // T
        self.tc_token = tc_g - self.tc_owner * T
        self.tc_comp = comp.ravel()[tc_where].astype(np.int32)
        self.tn_owner = tn_g // T
        self.tn_token = tn_g - self.tn_owner * T
        self.tn_node = node.ravel()[tn_where].astype(np.int32)
        self.tc_pair_node = (np.cumsum(fn) - 1)[fc]

    # Per-entry views, built only where needed (a2av and validation).
    @functools.cached_property
    def owner(self) -> np.ndarray:
        return np.repeat(np.arange(self.ranks, dtype=np.int32), self.T * self.k)

    @functools.cached_property
    def token(self) -> np.ndarray:
        return np.tile(np.repeat(np.arange(self.T, dtype=np.int32), self.k), self.ranks)

    @functools.cached_property
    def entry(self) -> np.ndarray:
        return np.tile(np.arange(self.k, dtype=np.int8), self.ranks * self.T)

    @functools.cached_property
    def _pair_remote(self) -> np.ndarray:
        return self.tc_comp // self.L != self.tc_owner // self.L

    def same_node_pairs(self) -> np.ndarray:
        """Mask of token-GPU pairs on the owner's node but not the owner itself."""
        return ~self._pair_remote & (self.tc_comp != self.tc_owner)

    def remote_pairs(self) -> np.ndarray:
        """Mask of token-GPU pairs on another node."""
        return self._pair_remote


def _a2av(x: _Entries) -> tuple[Hops, Hops]:
    away = x.comp != x.owner
    dispatch = Hops.make(0, x.owner[away], x.comp[away], x.owner[away], x.token[away])
    combine = Hops.make(0, x.comp[away], x.owner[away], x.owner[away], x.token[away], entry=x.entry[away])
    return dispatch, combine


def _same_node_sends(x: _Entries) -> tuple[Hops, Hops]:
    """Rows to other GPUs of the owner's node: one per (token, GPU), both phases, stage 0."""
    m = x.same_node_pairs()
    owner, token, comp = x.tc_owner[m], x.tc_token[m], x.tc_comp[m]
    return Hops.make(0, owner, comp, owner, token), Hops.make(0, comp, owner, owner, token)


def _fan_out(x: _Entries, gateway_of_pair: np.ndarray) -> Hops:
    """Stage-2 NVLink forwards on the destination node: one row per (token, computing GPU)
    other than the gateway that received the token. ``gateway_of_pair [Q]`` per token-node pair."""
    m = np.flatnonzero(x.remote_pairs())
    gw = gateway_of_pair[x.tc_pair_node[m]]
    away = x.tc_comp[m] != gw
    sel = m[away]
    return Hops.make(2, gw[away], x.tc_comp[sel], x.tc_owner[sel], x.tc_token[sel])


def _relay(x: _Entries) -> tuple[Hops, Hops]:
    near_d, near_c = _same_node_sends(x)
    gateway = (x.tn_node * x.L + x.tn_owner % x.L).astype(np.int32)  # same local index
    remote = x.tn_node != x.tn_owner // x.L
    cross = Hops.make(1, x.tn_owner[remote], gateway[remote], x.tn_owner[remote], x.tn_token[remote])
    fan = _fan_out(x, gateway)
    m = x.remote_pairs()
    back = Hops.make(0, x.tc_comp[m], x.tc_owner[m], x.tc_owner[m], x.tc_token[m])
    return Hops.concat([near_d, cross, fan]), Hops.concat([near_c, back])


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


def _zepp(x: _Entries, coalesce: bool, direct: bool = False) -> tuple[Hops, Hops]:
    L, N, T = x.L, x.N, x.T
    near_d, near_c = _same_node_sends(x)
    remote = x.tn_node != x.tn_owner // L  # [Q] union rows: one per (token, remote node)
    owner, token, dst_node = x.tn_owner[remote], x.tn_token[remote], x.tn_node[remote]
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
    handoff = Hops.make(0, owner[donated], carrier[donated], owner[donated], token[donated], msg=msg[donated])
    cross = Hops.make(1, carrier, gateway, owner, token, msg=msg)
    gateway_of_pair = np.full(x.tn_node.shape[0], -1, np.int32)
    gateway_of_pair[remote] = gateway
    fan = _fan_out(x, gateway_of_pair)

    # Combine mirrors dispatch: computing GPU -> gateway (pre-reduced there) -> NIC -> the
    # carrier on the owner's node -> owner.
    m = x.remote_pairs()
    gw = gateway_of_pair[x.tc_pair_node[m]]
    sel = np.flatnonzero(m)[x.tc_comp[m] != gw]
    gather = Hops.make(0, x.tc_comp[sel], gateway_of_pair[x.tc_pair_node[sel]], x.tc_owner[sel], x.tc_token[sel])
    if direct:
        return Hops.concat([near_d, handoff, cross, fan]), Hops.concat([near_c, gather,
                                                                       Hops.make(1, gateway, owner, owner, token)])
    back = Hops.make(1, gateway, carrier, owner, token, msg=msg)
    # One forward per (token, landing GPU): pieces from several nodes landing on one GPU are summed.
    need = carrier != owner
    landed = np.zeros((x.ranks * T, L), bool)
    landed[owner[need].astype(np.int64) * T + token[need], carrier_local[need]] = True
    g, local = np.nonzero(landed)
    f_owner = (g // T).astype(np.int32)
    forward = Hops.make(2, (f_owner // L) * L + local, f_owner, f_owner, g % T)
    return Hops.concat([near_d, handoff, cross, fan]), Hops.concat([near_c, gather, back, forward])


# ---------------------------------------------------------------------------------------------
# Validation


def validate_flow_plan(plan: FlowPlan) -> None:
    """Prove the plan's invariants, or raise ``PlanInvariantError`` naming the first violation:

    - the routing itself is valid (``Routing.validate``);
    - dispatch: every hop's source holds the row when its stage starts, and every entry's
      computing rank holds its token at the end;
    - combine: every hop moves something its source holds (a whole partial, or one entry's
      output still in place), no output moves twice in a stage, and at the end every entry's
      output sits at its token's owner, counted exactly once (outputs only move, so none is
      duplicated or lost);
    - ``zepp``: each node-to-node stream's NIC loads meet the caps ``floor(V/L) + [i < V mod L]``,
      in both phases.
    """
    routing = plan.routing
    routing.validate()
    x = _Entries(routing)
    _validate_dispatch(plan.dispatch, x)
    _validate_combine(plan.combine, x)
    if plan.transport in ("zepp", "zepp-direct"):
        _validate_nic_caps(plan, x)


def _held_key(rank, owner, token, x: _Entries) -> np.ndarray:
    return (np.asarray(rank, np.int64) * x.ranks + owner) * x.T + token


def _contains(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Membership of ``keys`` in ``sorted_keys`` (ascending, duplicates allowed)."""
    if sorted_keys.size == 0:
        return np.zeros(keys.shape, bool)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return sorted_keys[pos] == keys


def _validate_dispatch(hops: Hops, x: _Entries) -> None:
    own = np.arange(x.ranks).repeat(x.T)
    held = np.sort(_held_key(own, own, np.tile(np.arange(x.T), x.ranks), x))
    for stage in range(hops.num_stages):
        h = hops.select(hops.stage == stage)
        have = _contains(held, _held_key(h.src, h.owner, h.token, x))
        if not have.all():
            i = np.flatnonzero(~have)[0]
            raise PlanInvariantError(
                f"dispatch stage {stage}: rank {h.src[i]} sends token {h.token[i]} of rank {h.owner[i]} "
                f"to rank {h.dst[i]} before holding it")
        held = np.sort(np.concatenate([held, _held_key(h.dst, h.owner, h.token, x)]))
    missing = ~_contains(held, _held_key(x.comp, x.owner, x.token, x))
    if missing.any():
        i = np.flatnonzero(missing)[0]
        raise PlanInvariantError(
            f"dispatch never delivers token {x.token[i]} of rank {x.owner[i]} to rank {x.comp[i]}, "
            f"which computes its entry {x.entry[i]}")


def _validate_combine(hops: Hops, x: _Entries) -> None:
    loc = x.comp.astype(np.int64).copy()  # where each entry's output sits now
    token_id = x.owner.astype(np.int64) * x.T + x.token  # [n]
    entry_id = token_id * x.k + x.entry
    for stage in range(hops.num_stages):
        h = hops.select(hops.stage == stage)
        h_token = h.owner.astype(np.int64) * x.T + h.token
        new_loc = loc.copy()
        moved = np.zeros(loc.shape[0], np.int64)
        # Hops of one entry's output.
        single = h.entry >= 0
        if single.any():
            e = np.searchsorted(entry_id, h_token[single] * x.k + h.entry[single])
            ok = loc[e] == h.src[single]
            if not ok.all():
                i = np.flatnonzero(single)[np.flatnonzero(~ok)[0]]
                raise PlanInvariantError(
                    f"combine stage {stage}: rank {h.src[i]} sends entry {h.entry[i]} of token {h.token[i]} "
                    f"(rank {h.owner[i]}) which it does not hold")
            np.add.at(moved, e, 1)
            new_loc[e] = h.dst[single]
        # Hops of whole partials: every output of the token sitting at src moves.
        whole = ~single
        if whole.any():
            hop_key = h_token[whole] * x.ranks + h.src[whole]
            sorted_hops = np.sort(hop_key)
            if (sorted_hops[1:] == sorted_hops[:-1]).any():
                raise PlanInvariantError(f"combine stage {stage}: a partial is sent twice by one rank")
            at_key = token_id * x.ranks + loc
            order = np.argsort(hop_key)
            pos = np.searchsorted(hop_key[order], at_key)
            pos = np.minimum(pos, hop_key.size - 1)
            hit = hop_key[order][pos] == at_key
            carried = np.bincount(order[pos[hit]], minlength=hop_key.size)
            if (carried == 0).any():
                i = np.flatnonzero(whole)[np.flatnonzero(carried == 0)[0]]
                raise PlanInvariantError(
                    f"combine stage {stage}: rank {h.src[i]} sends a partial of token {h.token[i]} "
                    f"(rank {h.owner[i]}) but holds none")
            np.add.at(moved, np.flatnonzero(hit), 1)
            new_loc[hit] = h.dst[whole][order[pos[hit]]]
        if (moved > 1).any():
            i = np.flatnonzero(moved > 1)[0]
            raise PlanInvariantError(
                f"combine stage {stage}: the output of entry {x.entry[i]} of token {x.token[i]} "
                f"(rank {x.owner[i]}) is sent more than once")
        loc = new_loc
    stray = loc != x.owner
    if stray.any():
        i = np.flatnonzero(stray)[0]
        raise PlanInvariantError(
            f"combine leaves the output of entry {x.entry[i]} of token {x.token[i]} (rank {x.owner[i]}) "
            f"on rank {loc[i]} instead of its owner")


def _validate_nic_caps(plan: FlowPlan, x: _Entries) -> None:
    L, N = x.L, x.N
    for phase, hops in ((DISPATCH, plan.dispatch), (COMBINE, plan.combine)):
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
