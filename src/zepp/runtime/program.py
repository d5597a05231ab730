"""Compile a FlowPlan into one rank's execution program: pure numpy index arrays.

Every rank computes the same FlowPlan (from all-gathered ids) and compiles only its own part.
The program says, per stage, which rows this rank sends (positions in its buffers, ordered by
destination) and what every incoming row is, so receivers never need headers.

Buffer layouts (``r`` = this rank, ``T`` tokens per rank, ``k`` top-k, ``H`` hidden):

Ragged batches: ranks may hold different numbers of tokens. The plan's ``topk_ids [R, Tmax, k]``
then marks missing entries with ``-1`` (their slot is ``-1`` and no hop moves them); rank ``r``'s
present tokens are a prefix ``0..T_r-1`` of its ``Tmax`` rows (a token of all ``-1`` is absent)
and only they take buffer rows. Keys of token rows stay ``owner * Tmax + token``.

- **Dispatch "held" buffer** ``[T_r + received, H]``: rows ``0..T_r-1`` are ``r``'s own tokens; then,
  stage by stage, the rows received in that stage, ordered by source rank, then hop-table order
  (exactly the layout ``all_to_all_single`` produces when every sender orders its rows by
  destination, then table order). With ``waves`` (see below) the same rows are grouped by wave.
- **Expert inputs** ``[n, H]``: the ``n`` entries this rank computes, sorted by local slot, then
  owner, token, entry index. ``counts [S]`` rows per slot: the grouped-GEMM input.
- **Combine store** ``[U, H]`` fp32: one row per *unit* that ever lives on this rank. A unit is
  keyed ``(owner, token, j)``: ``j = -1`` is the token's whole partial, ``j >= 0`` a single entry
  that the plan moves on its own (a combine hop with ``entry == j`` exists for it).

Summation order (fixed: independent of arrival order and of the execution mode, blocking or
overlapped): a unit starts as the sum of its entries' gate-weighted outputs in increasing ``j``;
then, stage by stage, the rows received into it are added in increasing global hop index
(position in ``plan.combine``); at the owner, ``y[t]`` sums the token's units in the order
``-1, 0, 1, ..., k-1``. Every step adds into distinct rows at once (``rounds``), so no atomics
decide the order, on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.overlap.granularity import Granularity
from zepp.planner.overlap.grouping import combine_wave, dispatch_group
from zepp.planner.types import FlowPlan, PlanInvariantError


@dataclass
class Stage:
    """One stage of one phase, seen from this rank.

    ``send_idx [ns]`` rows to send (positions in the held buffer, or store indices), ordered by
    (wave, dst, table order); ``send_counts [R, W]`` rows per destination and wave;
    ``recv_counts [R, W]`` rows per source and wave; incoming rows are laid out by (wave, src,
    table order). ``W`` is 1 except for combine stage 0 with waves.
    """

    send_idx: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray
    recv_off: int = 0  # dispatch: where this stage's receipts start in the held buffer
    # combine only: accumulation rounds, each (positions in the receive buffer, store indices)
    rounds: list | None = None

    @property
    def n_send(self) -> int:
        return int(self.send_idx.shape[0])

    @property
    def n_recv(self) -> int:
        return int(self.recv_counts.sum())


@dataclass
class RankProgram:
    """Everything rank ``rank`` needs to execute one FlowPlan (see module docstring)."""

    rank: int
    ranks: int
    gpus_per_node: int
    tokens: int  # T_r: this rank's present tokens (rows of its x and y)
    top_k: int
    slots: int
    dispatch: list[Stage]
    held_size: int
    held_event: np.ndarray  # [held_size] arrival event of each held row (see ``arrival_event``)
    events: list[tuple[int, int]]  # (stage, src) in the fixed wait order: per stage own node first
    # entries this rank computes, in expert-input order
    e_owner: np.ndarray
    e_token: np.ndarray
    e_j: np.ndarray
    e_slot: np.ndarray  # local slot
    e_pos: np.ndarray  # held-buffer position of the entry's token row (first arrival)
    e_event: np.ndarray  # event after which the row is held
    e_wave: np.ndarray  # combine wave (ring offset of the owner's node, own node last)
    e_unit: np.ndarray  # store index of the unit the entry's output joins
    counts: np.ndarray  # [S] rows per local slot
    combine: list[Stage]
    store_size: int
    final_rounds: list  # [(token [m], store_idx [m])] in unit order -1, 0..k-1
    num_waves: int
    # with a granularity (``zepp.planner.overlap.granularity``): coarse dispatch group of each entry and, per
    # group, the last arrival event it needs (``None`` without one: entries go by arrival event)
    e_group: np.ndarray | None = None
    group_need: np.ndarray | None = None

    @property
    def n_entries(self) -> int:
        return int(self.e_slot.shape[0])

    @property
    def single_gemm(self) -> bool:
        """A chosen granularity of one dispatch group and one combine wave: nothing overlaps,
        the Dispatcher runs the blocking schedule."""
        return self.group_need is not None and self.group_need.size == 1 and self.num_waves == 1


def _lookup(sorted_keys: np.ndarray, order: np.ndarray, want: np.ndarray, what: str, rank: int) -> np.ndarray:
    i = np.searchsorted(sorted_keys, want)
    i = np.minimum(i, max(sorted_keys.shape[0] - 1, 0))
    ok = sorted_keys.shape[0] > 0 and np.all(sorted_keys[i] == want) if want.size else True
    if not ok:
        raise PlanInvariantError(f"rank {rank}: the plan moves a {what} this rank does not hold at that stage")
    return order[i] if want.size else np.zeros(0, np.int64)


def _unique(a: np.ndarray) -> np.ndarray:
    s = np.sort(a)
    return s[np.r_[True, s[1:] != s[:-1]]] if s.size else s


def _rounds(idx: np.ndarray) -> list[np.ndarray]:
    """Split positions ``0..len(idx)-1`` into rounds with distinct ``idx`` each, keeping order:
    the m-th occurrence of a value goes to round m."""
    if idx.size == 0:
        return []
    order = np.argsort(idx, kind="stable")
    s = idx[order]
    start = np.r_[True, s[1:] != s[:-1]]
    grp_start = np.maximum.accumulate(np.where(start, np.arange(s.size), 0))
    occ = np.empty(idx.size, np.int64)
    occ[order] = np.arange(s.size) - grp_start
    return [np.flatnonzero(occ == m) for m in range(int(occ.max()) + 1)]


def arrival_event(stage, remote) -> np.ndarray:
    """Arrival group of a dispatched row: 0 = own token; ``1 + 2 s`` = received in stage ``s``
    from the own node; ``2 + 2 s`` = received in stage ``s`` from another node."""
    return 1 + 2 * np.asarray(stage, np.int64) + np.asarray(remote, np.int64)


def wave_of(owner_rank: np.ndarray, src_rank: np.ndarray, gpus_per_node: int, nodes: int) -> np.ndarray:
    """Combine wave index (``zepp.planner.overlap.grouping.combine_wave``: the simulator uses the same one)."""
    return combine_wave(owner_rank, src_rank, gpus_per_node, nodes)


def present_tokens(topk_ids: np.ndarray, rank: int) -> int:
    """``T_r``: tokens rank ``rank`` holds in a batch ``topk_ids [R, Tmax, k]`` (``-1`` = missing
    entry, a token of all ``-1`` is absent). Present tokens must be a prefix of the rank's rows."""
    present = np.any(np.asarray(topk_ids[rank]) >= 0, axis=1)
    n = int(present.sum())
    if not present[:n].all():
        raise PlanInvariantError(f"rank {rank}: absent (all -1) tokens must follow the present ones")
    return n


@dataclass(frozen=True)
class _Shape:
    """The plan's shape as rank ``r`` sees it: ``R`` ranks, ``T`` token rows per rank, top-``k``,
    ``S`` slots per rank, ``L`` ranks per node, ``N`` nodes."""

    r: int
    R: int
    T: int
    k: int
    S: int
    L: int
    N: int

    def node_rank(self, x) -> np.ndarray:
        """Ring distance of the node of rank(s) ``x`` from this rank's node."""
        return (np.asarray(x) // self.L - self.r // self.L) % self.N


@dataclass
class _Held:
    """The dispatch side of a program: its stages, the fixed wait order, and per held row its
    key ``owner * T + token`` and arrival event."""

    stages: list[Stage]
    events: list[tuple[int, int]]
    keys: np.ndarray
    event: np.ndarray
    size: int


@dataclass
class _Entries:
    """The entries rank ``r`` computes, sorted by (slot, owner, token, j): ``[n]`` each."""

    owner: np.ndarray
    token: np.ndarray
    j: np.ndarray
    slot: np.ndarray
    key: np.ndarray  # token row key owner * T + token
    pos: np.ndarray  # held-buffer position of the token row's first arrival


def compile_rank(plan: FlowPlan, rank: int, waves: bool = False, granularity: Granularity | None = None) -> RankProgram:
    """This rank's program for ``plan``; ``waves`` groups combine stage 0 into per-node waves.
    ``granularity`` (with ``waves``): merge adjacent waves to ``granularity.waves`` and group the
    entries into ``granularity.groups`` coarse dispatch groups (``zepp.planner.overlap.grouping``'s fine groups
    mapped by ``Granularity.group_map``, as the simulator does); the numerics do not change.

    Padded entries (``topk_ids == -1``, slot ``-1``) are skipped; ``tokens`` of the program is
    this rank's present-token count ``T_r`` (see the module docstring)."""
    routing = plan.routing
    R, T, k = routing.topk_ids.shape
    L = plan.gpus_per_node
    sh = _Shape(rank, R, T, k, routing.placement.slots_per_rank, L, R // L)
    T_own = present_tokens(routing.topk_ids, rank) if routing.topk_ids.size else 0
    held = _compile_dispatch(plan, sh, T_own)
    ent = _entries(plan, sh, held)
    counts = np.bincount(ent.slot, minlength=sh.S)
    store_keys, ukey_hop, e_unit = _units(plan, sh, ent)
    gran = granularity if waves else None
    wmap = gran.wave_map() if gran is not None else np.arange(sh.N)
    e_wave = wmap[wave_of(ent.owner, np.full_like(ent.owner, rank), L, sh.N)] if waves else \
        np.zeros(ent.owner.size, np.int64)
    n_w = (gran.waves if gran is not None else sh.N) if waves else 1
    e_group = group_need = None
    if gran is not None:
        e_group = gran.group_map()[dispatch_group(ent.owner, np.full_like(ent.owner, rank), L, sh.N)]
        group_need = np.full(gran.groups, -1, np.int64)
        np.maximum.at(group_need, e_group, held.event[ent.pos])
    cstages = _compile_combine(plan, sh, store_keys, ukey_hop, wmap if waves else None, n_w)
    return RankProgram(
        rank=rank, ranks=R, gpus_per_node=L, tokens=T_own, top_k=k, slots=sh.S, dispatch=held.stages,
        held_size=held.size, held_event=held.event, events=held.events, e_owner=ent.owner, e_token=ent.token,
        e_j=ent.j, e_slot=ent.slot, e_pos=ent.pos.astype(np.int64), e_event=held.event[ent.pos], e_wave=e_wave,
        e_unit=e_unit.astype(np.int64), counts=counts, combine=cstages, store_size=int(store_keys.size),
        final_rounds=_final_rounds(store_keys, sh), num_waves=n_w, e_group=e_group, group_need=group_need,
    )


def _compile_dispatch(plan: FlowPlan, sh: _Shape, T_own: int) -> _Held:
    """Per dispatch stage: the rows this rank sends (positions in the held buffer, by destination)
    and receives (by source), the wait order, and every held row's key and arrival event."""
    d, r, T, R = plan.dispatch, sh.r, sh.T, sh.R
    held_keys = [np.arange(T_own, dtype=np.int64) + r * T]
    held_event = [np.zeros(T_own, np.int64)]
    events: list[tuple[int, int]] = []
    stages: list[Stage] = []
    off = T_own
    from_r, to_r = np.flatnonzero(d.src == r), np.flatnonzero(d.dst == r)  # ascending hop index
    from_stage, to_stage = d.stage[from_r], d.stage[to_r]
    for s in range(d.num_stages):
        keys_so_far = np.concatenate(held_keys)
        order = np.argsort(keys_so_far, kind="stable")
        sk = keys_so_far[order]
        snd = from_r[from_stage == s]
        snd = snd[np.argsort(d.dst[snd], kind="stable")]
        want = d.owner[snd].astype(np.int64) * T + d.token[snd]
        send_idx = _lookup(sk, order, want, "token row", r)
        rcv = to_r[to_stage == s]
        rcv = rcv[np.argsort(d.src[rcv], kind="stable")]
        send_counts = np.bincount(d.dst[snd], minlength=R)[:, None]
        recv_counts = np.bincount(d.src[rcv], minlength=R)[:, None]
        stages.append(Stage(send_idx.astype(np.int64), send_counts, recv_counts, recv_off=off))
        # wait order: sources of this stage on the own node first, then remote nodes in ring order
        src_r = d.src[rcv]
        for src in sorted(np.unique(src_r).tolist(), key=lambda q: (int(sh.node_rank(q)), q)):
            events.append((s, src))
        ev = arrival_event(s, sh.node_rank(src_r) != 0)
        held_keys.append(d.owner[rcv].astype(np.int64) * T + d.token[rcv])
        held_event.append(ev)
        off += rcv.size
    return _Held(stages, events, np.concatenate(held_keys), np.concatenate(held_event), int(off))


def _entries(plan: FlowPlan, sh: _Shape, held: _Held) -> _Entries:
    """The entries computed here, sorted by (slot, owner, token, j), and where each one's token
    row first arrives; padded entries (slot -1) never are."""
    lo = sh.r * sh.S
    flat = plan.routing.slot.reshape(-1)
    idx = np.flatnonzero((flat >= lo) & (flat < lo + sh.S))  # ascending: (owner, token, j) order
    slot = (flat[idx] - lo).astype(np.int64)
    srt = np.argsort(slot, kind="stable")  # stable: (slot, owner, token, j)
    idx, slot = idx[srt].astype(np.int64), slot[srt]
    o_idx, rest = np.divmod(idx, sh.T * sh.k)
    t_idx, j_idx = np.divmod(rest, sh.k)
    ekey = o_idx * sh.T + t_idx
    # first arrival of each token row in wait order (event, then position: a stable sort)
    keys = held.keys
    order = np.argsort(keys * (int(held.event.max(initial=0)) + 1) + held.event, kind="stable")
    sk = keys[order]
    first = np.r_[True, sk[1:] != sk[:-1]] if sk.size else np.zeros(0, bool)
    e_pos = _lookup(sk[first], order[first], ekey, "token row to compute", sh.r)
    return _Entries(o_idx, t_idx, j_idx, slot, ekey, e_pos)


def _units(plan: FlowPlan, sh: _Shape, ent: _Entries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(store_keys [U], ukey_hop [hops], e_unit [n])``: the sorted keys of every unit living on
    this rank, each combine hop's unit key, and the store index each entry's output joins."""
    c, r, K1 = plan.combine, sh.r, sh.k + 1
    tok_c = c.owner.astype(np.int64) * sh.T + c.token
    ukey_hop = tok_c * K1 + (c.entry.astype(np.int64) + 1)
    # units that travel as single entries; such a unit first moves from the rank computing it
    solo = _unique(ukey_hop[(c.entry >= 0) & (c.src == r)])
    e_ukey = ent.key * K1 + (ent.j + 1)
    i = np.minimum(np.searchsorted(solo, e_ukey), max(solo.size - 1, 0))
    is_solo = solo[i] == e_ukey if solo.size else np.zeros(e_ukey.size, bool)
    e_ukey = np.where(is_solo, e_ukey, ent.key * K1)
    recv_keys_all = ukey_hop[c.dst == r]
    store_keys = _unique(np.concatenate([e_ukey, recv_keys_all]))
    e_unit = _lookup(store_keys, np.arange(store_keys.size), e_ukey, "unit", r)
    return store_keys, ukey_hop, e_unit


def _compile_combine(plan: FlowPlan, sh: _Shape, store_keys: np.ndarray, ukey_hop: np.ndarray,
                     wmap: np.ndarray | None, n_w: int) -> list[Stage]:
    """Per combine stage: the units this rank sends (by wave, then destination), the layout of
    what it receives (by wave, then source) and the accumulation rounds in increasing hop index.
    ``wmap``: fine wave -> wave (None: no waves); waves apply to stage 0 only."""
    c, r, R, L, N = plan.combine, sh.r, sh.R, sh.L, sh.N
    store_order = np.arange(store_keys.size)
    cstages: list[Stage] = []
    from_r, to_r = np.flatnonzero(c.src == r), np.flatnonzero(c.dst == r)  # ascending hop index
    from_stage, to_stage = c.stage[from_r], c.stage[to_r]
    for s in range(c.num_stages):
        wv = wmap is not None and s == 0
        snd = from_r[from_stage == s]
        sw = wmap[wave_of(c.owner[snd], c.src[snd], L, N)] if wv else np.zeros(snd.size, np.int64)
        o = np.lexsort((c.dst[snd], sw))
        snd, sw = snd[o], sw[o]
        send_idx = _lookup(store_keys, store_order, ukey_hop[snd], "combine unit", r)
        rcv = to_r[to_stage == s]
        rw = wmap[wave_of(c.owner[rcv], c.src[rcv], L, N)] if wv else np.zeros(rcv.size, np.int64)
        o = np.lexsort((c.src[rcv], rw))
        rcv, rw = rcv[o], rw[o]
        w = n_w if wv else 1
        send_counts = np.bincount(c.dst[snd].astype(np.int64) * w + sw, minlength=R * w).reshape(R, w)
        recv_counts = np.bincount(c.src[rcv].astype(np.int64) * w + rw, minlength=R * w).reshape(R, w)
        # accumulate in increasing hop index: positions in the receive buffer sorted by hop id
        by_hop = np.argsort(rcv, kind="stable")
        ridx = _lookup(store_keys, store_order, ukey_hop[rcv], "combine unit", r)
        rounds = [(by_hop[m], ridx[by_hop[m]]) for m in _rounds(ridx[by_hop])]
        cstages.append(Stage(send_idx.astype(np.int64), send_counts, recv_counts, rounds=rounds))
    return cstages


def _final_rounds(store_keys: np.ndarray, sh: _Shape) -> list:
    """The final sum at the owner: ``[(token [m], store index [m])]`` in unit order -1, 0..k-1."""
    K1, T = sh.k + 1, sh.T
    mine = (store_keys // K1) // T == sh.r
    fk = store_keys[mine]
    fidx = np.flatnonzero(mine)
    unit = fk % K1
    return [((fk[unit == u] // K1) % T, fidx[unit == u]) for u in range(K1) if np.any(unit == u)]
