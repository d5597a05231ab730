"""Task graphs of one MoE layer from its FlowPlan: prologue, dispatch, expert GEMMs, combine,
reduce at home.

``build_layer`` turns a ``LayerWork`` (a ``FlowPlan``'s dispatch / combine ``Hops`` plus the
entries' computing ranks, built by ``LayerWork.of``) and a ``Mechanics`` record (how a system
moves its messages, splits its GEMMs and synchronises; ``zepp.sim.mechanics``) into a
``TaskGraph`` that ``zepp.sim.engine.simulate`` runs. The baselines' special phases
(``zepp.sim.phases``) may replace a phase (COMET's all-gather, FAST's rounds) or add weight
copies (MoonEP's pulls; Zepp's swaps add them too).

Granularity and dependencies
----------------------------
- One transfer per message (``zepp.planner.overlap.grouping.messages``): hops sharing ``(stage, src, dst, msg)``
  move together; dispatch groups and combine waves are ``zepp.planner.overlap.grouping``'s, as in the runtime.
- Row-level dependencies, aggregated to tasks: a message of stage ``s`` waits for every earlier
  message that delivers one of its rows to its source; an expert-GEMM task waits for every
  message that delivers one of its rows; a combine message waits for the second-GEMM tasks
  that produce its partials (and for earlier combine stages into its source); the weighted
  reduce at a token's home waits for every combine message into it.
- GEMM time (one grouped GEMM over a task's slots): ``max(FLOPs / (peak * eff(rows per
  active expert)), weight bytes / HBM bw) + kernel_launch``; per-expert GEMMs sum that per
  slot. A layer runs two GEMMs (``H -> F`` and ``F -> H``, GELU folded into the launch cost).
  An executor measured elsewhere passes its own ``gemm_cost`` instead (the emulated cluster's).
- ``Mechanics.stage_collectives``: every stage is one all-to-all call per rank
  (``zepp.sim.collectives`` adds the calls and each rank's program order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.cluster import Cluster
from zepp.planner.overlap.granularity import Granularity
from zepp.planner.overlap.grouping import (Messages, arrival_stage, combine_wave, dispatch_group, messages, split_by_key,
                           split_by_owner_node)
from zepp.planner.intsort import sorted_with_order
from zepp.model import MoESpec
from zepp.planner.types import FlowPlan, Hops
from zepp.sim.chunks import add_pieces, chunk_tokens, link_pieces, order_sends, piece_counts, send_classes
from zepp.sim.collectives import add_stage_collectives
from zepp.sim.engine import SimulationError, TaskGraph
from zepp.sim.mechanics import Mechanics, Net
from zepp.sim.predispatch import plan_free_hops, single_copy_slots

# Event coarsening used for every simulated layer (see zepp.sim.engine): events closer than a
# fraction of the elapsed time (0.05%) are merged and link shares within 0.1% count as one level.
# benchmarks/results/bench_sim_accuracy.md measures what this changes against the exact engine.
SIM_OPTS = dict(rel_quantum=5e-4, rate_tol=1e-3)


@dataclass
class LayerWork:
    """What ``build_layer`` needs from a system's planner.

    ``owner, token, comp, slot, entry [n_entries]``: every entry's owner rank, token index,
    computing rank, global slot and index ``j < k``. ``dispatch`` / ``combine``: ``Hops``.
    ``slots_per_rank``: ``S``. ``swapped [R * S]`` bool: slots whose weights arrive this
    iteration (their GEMMs wait for ``weight_copies``). ``weight_copies [M, 2]``: (src rank,
    dst rank) of each expert-weight transfer this iteration.
    """

    owner: np.ndarray
    token: np.ndarray
    comp: np.ndarray
    slot: np.ndarray
    entry: np.ndarray
    dispatch: Hops
    combine: Hops
    tokens_per_rank: int
    slots_per_rank: int
    swapped: np.ndarray | None = None
    weight_copies: np.ndarray | None = None
    copies_block_gemm: str = "swapped"  # "swapped": only swapped slots wait; "all": every GEMM of the rank
    granularity: Granularity | None = None  # coarse groups / waves (zepp.planner.overlap.granularity); None: per node
    single_slots: np.ndarray | None = None  # [R * S] slots of single-copy experts (Mechanics.predispatch)

    @classmethod
    def of(cls, plan: FlowPlan, **kw) -> "LayerWork":
        """The layer plan of a ``FlowPlan`` (its routing's entries, its hop tables)."""
        r = plan.routing
        owner, token, comp, slot, entry = entries_of(r)
        kw.setdefault("single_slots", single_copy_slots(r.placement))
        return cls(owner, token, comp, slot, entry, plan.dispatch, plan.combine, r.topk_ids.shape[1],
                   r.placement.slots_per_rank, **kw)


def entries_of(routing) -> tuple[np.ndarray, ...]:
    """Flat per-entry arrays ``(owner, token, comp, slot, entry)`` of a ``Routing`` (missing
    entries left out)."""
    R, T, k = routing.topk_ids.shape
    slot = routing.slot.ravel().astype(np.int64)
    idx = np.flatnonzero(slot >= 0) if (slot < 0).any() else np.arange(R * T * k, dtype=np.int64)
    slot = slot[idx]
    return (idx // (T * k)), (idx // k) % T, slot // routing.placement.slots_per_rank, slot, idx % k


_DENSE_BITS = 24
_DENSE_KEYS = 1 << _DENSE_BITS  # key tables up to 64 MB (int32); larger key ranges are joined block by block
_BLOCK_BITS = 22  # wider keys: blocks of 4M keys, one 16 MB table reused


def _join(left_key: np.ndarray, right_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs ``(i, j)`` with ``left_key[i] == right_key[j]`` (non-negative integer keys; as a
    set, in no fixed order)."""
    nl, nr = left_key.size, right_key.size
    if nl == 0 or nr == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    hi = max(int(left_key.max()), int(right_key.max())) + 1
    if min(int(left_key.min()), int(right_key.min())) < 0 or max(nl, nr) >= 2**31:
        return _join_sorted(left_key, right_key)
    if hi <= _DENSE_KEYS:
        return _join_dense(left_key, right_key, hi)
    if (hi - 1) >> _BLOCK_BITS < 2**31:
        return _join_blocked(left_key, right_key)
    return _join_sorted(left_key, right_key)


def _join_dense(left_key: np.ndarray, right_key: np.ndarray, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``_join`` of keys in ``[0, hi)``, ``hi <= _DENSE_KEYS``, through a table of the smaller side."""
    if left_key.size <= right_key.size:
        return _join_table(left_key, right_key, hi)
    j, i = _join_table(right_key, left_key, hi)
    return i, j


def _join_blocked(left_key: np.ndarray, right_key: np.ndarray, bits: int = _BLOCK_BITS) -> tuple[np.ndarray, np.ndarray]:
    """``_join`` of keys too wide for one table: both sides radix-sorted by block (``2**bits``
    consecutive keys), each block joined through one reused table. Equal keys share a block, so
    the pairs are exactly ``_join_sorted``'s (as a set)."""
    mask = (1 << bits) - 1
    nb = (max(int(left_key.max()), int(right_key.max())) >> bits) + 1
    sides = []
    for key in (left_key, right_key):
        blk = np.asarray(key, np.int64) >> bits
        order = np.argsort(blk.astype(np.int16 if nb < 2**15 else np.int32), kind="stable")  # a radix sort
        bounds = np.concatenate(([0], np.cumsum(np.bincount(blk, minlength=nb))))
        sides.append((order, bounds, (np.asarray(key, np.int64)[order] & mask).astype(np.int32)))
    (lo, lb, ll), (ro, rb, rl) = sides
    tab = np.full(1 << bits, -1, np.int32)
    parts_i, parts_j = [], []
    for b in np.flatnonzero((np.diff(lb) > 0) & (np.diff(rb) > 0)).tolist():
        lk, rk = ll[lb[b]:lb[b + 1]], rl[rb[b]:rb[b + 1]]
        if lk.size <= rk.size:
            i, j = _join_table(lk, rk, tab.size, tab)
        else:
            j, i = _join_table(rk, lk, tab.size, tab)
        parts_i.append(lo[lb[b] + i])
        parts_j.append(ro[rb[b] + j])
    if not parts_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(parts_i).astype(np.int64), np.concatenate(parts_j).astype(np.int64)


def _join_table(a: np.ndarray, b: np.ndarray, hi: int, tab: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``_join`` through a key -> index table of ``a``: one pass where ``a``'s keys are distinct
    (nearly so in practice: each row arrives at a rank once in dispatch, leaves it once in
    combine); the few keys ``a`` holds more than once are joined by sorting. ``tab``: a table
    of at least ``hi`` entries all -1 (left so again), else one is made."""
    if tab is None:
        tab = np.full(hi, -1, np.int32)
    idx = np.arange(a.size, dtype=np.int32)
    tab[a] = idx
    lost = np.flatnonzero(tab[a] != idx)  # overwritten: their keys appear more than once in a
    hit = tab[b]
    tab[a] = -1
    if lost.size == 0:
        bj = np.flatnonzero(hit >= 0)
        return hit[bj].astype(np.int64), bj
    dup = np.zeros(hi, bool)
    dup[a[lost]] = True
    b_dup = dup[b]
    bj = np.flatnonzero((hit >= 0) & ~b_dup)
    asel, bsel = np.flatnonzero(dup[a]), np.flatnonzero(b_dup)
    i2, j2 = _join_sorted(a[asel], b[bsel])
    return np.concatenate([hit[bj].astype(np.int64), asel[i2]]), np.concatenate([bj, bsel[j2]])


def _join_sorted(left_key: np.ndarray, right_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_join`` by one sort of both sides (left before right within a key)."""
    nl, nr = left_key.size, right_key.size
    if nl == 0 or nr == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    both = np.concatenate([np.asarray(left_key, np.int64) * 2, np.asarray(right_key, np.int64) * 2 + 1])
    sk, order = sorted_with_order(both)
    sk >>= 1
    is_r = order >= nl
    gid = np.cumsum(np.concatenate(([True], sk[1:] != sk[:-1]))) - 1
    lefts = order[~is_r]  # left indices, by key
    n_left = np.bincount(gid[~is_r], minlength=int(gid[-1]) + 1)
    first = np.cumsum(n_left) - n_left
    rpos = np.flatnonzero(is_r)
    cnt = n_left[gid[rpos]]
    total = int(cnt.sum())
    off = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return lefts[np.repeat(first[gid[rpos]], cnt) + off], np.repeat(order[rpos] - nl, cnt)


def _uniq(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values of integers ``x`` (a presence table where the values are
    non-negative and fit a few times ``x.size`` bytes, else a sort)."""
    x = np.asarray(x)
    if x.size < 2:
        return np.sort(x)
    hi = int(x.max())
    if int(x.min()) >= 0 and hi < max(1 << 20, 16 * x.size):
        seen = np.zeros(hi + 1, bool)
        seen[x] = True
        return np.flatnonzero(seen).astype(x.dtype, copy=False)
    s = np.sort(x)
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.size == 0:
        return a, b
    base = int(b.max()) + 1
    u = _uniq(a.astype(np.int64) * base + b)
    return u // base, u % base


def stage_message_pairs(h: Hops, hop_msg: np.ndarray, R: int, T: int, join=_join) -> tuple[np.ndarray, np.ndarray]:
    """The message pairs ``(a, b)`` (sorted, distinct) where message ``b`` carries on a row that
    an earlier-stage message ``a`` delivered to ``b``'s source: hops ``[M]`` of one phase,
    ``hop_msg [M]`` each hop's message. ``join``: the key join (``_join``; tests pass others)."""
    later = np.flatnonzero(h.stage > 0)
    if later.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    early = np.flatnonzero(h.stage < h.stage.max())  # only these can feed a later stage
    key_in = (h.dst[early].astype(np.int64) * R + h.owner[early]) * T + h.token[early]
    key_out = (h.src[later].astype(np.int64) * R + h.owner[later]) * T + h.token[later]
    i, j = join(key_in, key_out)
    i, j = early[i], later[j]
    ok = h.stage[i] < h.stage[j]
    return _unique_pairs(hop_msg[i[ok]], hop_msg[j[ok]])


class LayerBuilder:
    """Builds one layer's tasks into a ``TaskGraph``; see ``build_layer``."""

    def __init__(self, graph: TaskGraph, cluster: Cluster, spec: MoESpec, net: Net, mech: Mechanics, gemm_cost=None):
        self.g, self.cl, self.spec, self.net, self.mech = graph, cluster, spec, net, mech
        self.gemm_cost = gemm_cost
        self.R, self.L, self.N = cluster.ranks, cluster.gpus_per_node, cluster.nodes
        self.column_splits = None  # [splits, ncls, R] GEMM 2 column-split tasks (gemm2 == "columns")

    # ---------------------------------------------------------------- transfers
    def transfers(self, src, dst, nbytes, mode: str, kind: str, label: str, prio=None, put: float | None = None):
        """Create transfers; returns ``(entry_task, exit_task)`` arrays. ``concurrent``
        cross-node puts first take a proxy issue slot on the source's proxy stream (unless the
        mechanics' puts are GPU-initiated, ``Mechanics.proxy`` False). ``put``: fixed seconds of
        one cross-node put (default the calibrated ``net.put(W)``)."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        n = src.size
        cross = (src // self.L) != (dst // self.L)
        put = self.net.put(self.R) if put is None else put
        fixed = np.where(cross, put, self.cl.nvlink_msg_cost)
        entry = np.zeros(n, np.int64)
        mode = "concurrent" if mode == "concurrent" and self.mech.proxy else "gpu-initiated"
        if mode == "concurrent" and cross.any():
            issue = put / self.net.proxy_inflight
            fixed = np.where(cross, put - issue, fixed)
            ci = np.flatnonzero(cross)
            pt = self.g.add_fixed(src[ci], np.full(ci.size, issue), kind="proxy", stream="proxy",
                                  prio=prio if prio is None else np.asarray(prio)[ci], label="issue")
        xt = self.g.add_transfer(src, dst, np.asarray(nbytes, float), fixed, kind=kind, label=label)
        entry[:] = xt
        if mode == "concurrent" and cross.any():
            entry[ci] = pt
            self.g.after(pt, xt[ci])
        return entry, xt

    def chain_serial(self, m: Messages, sel: np.ndarray) -> None:
        """Blocking puts: per source rank, messages ``sel`` one after another, ring order."""
        if sel.size < 2:
            return
        ring = (m.dst[sel] - m.src[sel]) % self.R
        o = sel[np.lexsort((m.stage[sel], ring, m.src[sel]))]
        same = m.src[o[1:]] == m.src[o[:-1]]
        self.g.after(m.exit_task[o[:-1][same]], m.entry_task[o[1:][same]])

    def phase_messages(self, h: Hops, mode: str, kind: str, row_bytes: float) -> Messages:
        m = messages(h, self.R)
        if self.mech.chunked:
            return self.chunked_messages(h, m, kind, row_bytes)
        m.entry_task = np.zeros(m.rows.size, np.int64)
        m.exit_task = np.zeros(m.rows.size, np.int64)
        serial_stage = np.isin(m.stage, self.mech.serial_stages) if mode == "serial" else np.zeros(m.rows.size, bool)
        if self.mech.stage_collectives:  # every call's puts are serial; zepp.sim.collectives orders them
            serial_stage = np.full(m.rows.size, mode == "serial")
        for is_serial in (True, False):
            sel = np.flatnonzero(serial_stage == is_serial)
            if sel.size == 0:
                continue
            e, x = self.transfers(m.src[sel], m.dst[sel], m.rows[sel] * row_bytes,
                                  "serial" if is_serial else "concurrent", kind, kind,
                                  put=self.mech.serial_put if is_serial else None)
            m.entry_task[sel], m.exit_task[sel] = e, x
        if mode == "serial" and not self.mech.stage_collectives:
            self.chain_serial(m, np.flatnonzero(serial_stage))
        return m

    def chunked_messages(self, h: Hops, m: Messages, kind: str, row_bytes: float) -> Messages:
        """``phase_messages`` of ``Mechanics.chunked``: GPU-initiated puts, a message on a relay
        path cut into pieces that a forwarder passes on as they land (``zepp.sim.chunks``)."""
        m.pairs = self.stage_pairs(h, m)
        nvl, rdma = chunk_tokens(self.R, kind)
        cross = (m.src // self.L) != (m.dst // self.L)
        m.pieces = piece_counts(m.rows, cross, *m.pairs, nvl, rdma)
        fixed = np.where(cross, self.net.put(self.R), self.cl.nvlink_msg_cost)
        m.entry_task, m.exit_task = add_pieces(self.g, m.src, m.dst, m.rows * row_bytes, fixed, m.pieces, kind)
        if self.mech.ordered_sends and kind == "dispatch":  # messages carry one owner node's rows (split_messages)
            owner_node = np.zeros(m.rows.size, np.int64)
            owner_node[m.hop_msg] = h.owner // self.L
            order_sends(self.g, m.src, cross, send_classes(owner_node, m.dst, self.L, self.N), m.entry_task,
                        m.exit_task, self.R)
        return m

    def stage_pairs(self, h: Hops, m: Messages) -> tuple[np.ndarray, np.ndarray]:
        """``(pre, post)`` message pairs: ``post`` (stage ``s``, from ``x``) carries a row that
        ``pre`` (an earlier stage) delivers to ``x``."""
        return stage_message_pairs(h, m.hop_msg, self.R, self.T)

    def stage_deps(self, h: Hops, m: Messages) -> None:
        """A hop of stage ``s`` from ``x`` waits for earlier-stage arrivals of its row at ``x``
        (piece by piece where the messages are cut into pieces)."""
        if m.pieces is not None:
            link_pieces(self.g, m.entry_task, m.pieces, *m.pairs)
            return
        a, b = self.stage_pairs(h, m)
        self.g.after(m.exit_task[a], m.entry_task[b])
        if self.mech.stage_node_barrier:
            for s in range(1, int(h.stage.max()) + 1):
                prev = np.flatnonzero(m.stage == s - 1)
                cur = np.flatnonzero(m.stage == s)
                for node in range(self.N):
                    p = prev[(m.dst[prev] // self.L) == node]
                    c = cur[(m.src[cur] // self.L) == node]
                    if p.size and c.size:
                        j = self.g.add_fixed(node * self.L, self.net.node_barrier(self.L), kind="barrier",
                                             stream=None, label="node barrier")
                        self.g.after(m.exit_task[p], j)
                        self.g.after(j, m.entry_task[c])

    # ---------------------------------------------------------------- GEMMs
    def gemm_tasks(self, cls: np.ndarray, slot: np.ndarray, ncls: int, prio_of_cls, label: str, which: int = 1,
                   splits: int = 1) -> np.ndarray:
        """One grouped-GEMM task per (class, rank) holding entries; ``cls [n]`` in ``[0, ncls)``,
        ``slot [n]`` global slots; ``which``: GEMM 1 or 2. Returns ``table [ncls, R]`` of task
        ids (-1: no task).

        ``splits > 1``: each task is run as ``splits`` column splits in sequence (each 1 / splits
        of the FLOPs and weight reads, plus a launch); the returned table holds the first split,
        ``self.column_splits [splits, ncls, R]`` all of them (see ``column_split_tasks``)."""
        R, S = self.R, self.S
        pair_cnt = np.bincount(cls.astype(np.int64) * (R * S) + slot, minlength=ncls * R * S)
        nz = np.flatnonzero(pair_cnt)
        rows = pair_cnt[nz].astype(float)
        if self.mech.pad_rows > 1:
            rows = np.ceil(rows / self.mech.pad_rows) * self.mech.pad_rows
        tkey = (nz // (R * S)) * R + (nz % (R * S)) // S  # cls * R + rank
        spec, cl = self.spec, self.cl
        flops_row = 2.0 * spec.hidden * spec.ffn  # one of the two GEMMs
        w_bytes = float(spec.hidden * spec.ffn * spec.dtype_bytes)
        scale = self.mech.gemm_eff_scale
        space = ncls * R
        if self.gemm_cost is not None:
            if self.mech.per_expert_gemm:
                dur = np.bincount(tkey, weights=self.gemm_cost(which, rows, np.ones(rows.size)), minlength=space)
            else:
                tot = np.bincount(tkey, weights=rows, minlength=space)
                act = np.bincount(tkey, minlength=space).astype(float)
                dur = self.gemm_cost(which, tot, act)
        elif self.mech.per_expert_gemm:
            eff = cl.gemm_efficiency(rows) * scale
            t = np.maximum(rows * flops_row / (cl.peak_flops * eff), w_bytes / cl.hbm_bw) + cl.kernel_launch
            dur = np.bincount(tkey, weights=t, minlength=space)
        else:
            tot = np.bincount(tkey, weights=rows, minlength=space)
            act = np.bincount(tkey, minlength=space).astype(float)
            with np.errstate(divide="ignore", invalid="ignore"):
                eff = cl.gemm_efficiency(tot / np.maximum(act, 1)) * scale
                dur = np.maximum(tot * flops_row / (cl.peak_flops * eff), act * w_bytes / cl.hbm_bw) + cl.kernel_launch
        keys = np.unique(tkey)
        if splits > 1:
            return self.column_split_tasks(keys, dur[keys], prio_of_cls(keys // R), ncls, splits, label)
        table = np.full(space, -1, np.int64)
        table[keys] = self.g.add_fixed(keys % R, dur[keys], kind="gemm", stream="compute",
                                       prio=prio_of_cls(keys // R), label=label)
        return table.reshape(ncls, R)

    def column_split_tasks(self, keys: np.ndarray, dur: np.ndarray, prio, ncls: int, splits: int,
                           label: str) -> np.ndarray:
        """A GEMM per ``keys [n]`` (class * R + rank) of ``dur [n]`` seconds run as ``splits``
        column splits, chained: each ``(dur - launch) / splits + launch``. Sets
        ``self.column_splits [splits, ncls, R]``; returns the first split's ``[ncls, R]``."""
        R = self.R
        part = (dur - self.cl.kernel_launch) / splits + self.cl.kernel_launch
        cols = np.full((splits, ncls * R), -1, np.int64)
        for c in range(splits):
            cols[c, keys] = self.g.add_fixed(keys % R, part, kind="gemm", stream="compute",
                                             prio=prio, label=f"{label} cols {c}")
            if c:
                self.g.after(cols[c - 1, keys], cols[c, keys])
        self.column_splits = cols.reshape(splits, ncls, R)
        return self.column_splits[0]


def build_layer(graph: TaskGraph, cluster: Cluster, spec: MoESpec, work: LayerWork, mech: Mechanics, net: Net,
                prologue: np.ndarray, custom_dispatch=None, custom_combine=None, planning=None, gemm_cost=None) -> dict:
    """Add one MoE layer to ``graph``; returns the main task ids per part.

    ``prologue [R]``: seconds of per-rank work before dispatch (all-gather + planning), run on
    each rank's host stream; ``planning [R]`` (optional): the planning part of it, drawn as its
    own task after the all-gather. ``custom_dispatch(builder, prologue_tasks) -> (local_done [R], remote_done [R])`` (tasks after
    which a rank's GEMM on rows of its own node / of other nodes may start) /
    ``custom_combine(builder, ready [R]) -> join task`` (``ready[r]``: the task after which rank
    ``r``'s partials exist, also for a rank without GEMM work) replace the Hops-driven phases (FAST's
    synchronous rounds). ``gemm_cost(which, rows [n], groups [n]) -> seconds [n]`` (optional):
    the time of ``n`` grouped-GEMM tasks of GEMM ``which`` (1 or 2), given their rows and active
    slots, instead of the cluster's roofline.
    """
    b = LayerBuilder(graph, cluster, spec, net, mech, gemm_cost)
    b.T, b.S = work.tokens_per_rank, work.slots_per_rank
    layer = _LayerTasks(b, work)
    layer.add_prologue(prologue, planning)
    layer.split_messages()
    layer.add_dispatch(custom_dispatch)
    layer.add_gemms()
    layer.add_weight_copies()
    layer.add_combine(custom_combine)
    layer.add_reduce()
    return layer.out


class _LayerTasks:
    """One layer's parts added to the builder's graph in program order (prologue, dispatch,
    GEMMs, weight copies, combine, reduce); each part's tasks are kept for the parts after it.

    GEMM 1 classes are ``swapped * G + group``, GEMM 2 classes ``swapped * N + wave``
    (``gemm_tasks``' ``cls``): a swapped slot's GEMMs also wait for its weights.
    """

    def __init__(self, b: LayerBuilder, work: LayerWork):
        self.b, self.g, self.work, self.mech = b, b.g, work, b.mech
        self.R, self.L, self.N = b.R, b.L, b.N
        # one GPU-initiated kernel of a phase (Mechanics.kernel_calls)
        self.call = b.cl.kernel_launch + b.net.signal
        gran = work.granularity
        self.gmap = gran.group_map() if gran is not None else np.arange(self.N + 1)
        self.wmap = gran.wave_map() if gran is not None else np.arange(self.N)
        self.out: dict = {}
        self.d = self.cm = None  # dispatch / combine messages (Hops-driven phases)
        self.kc_dispatch = self.kc_combine = None
        self.dispatch_done = self.local_done = self.remote_done = self.combine_done = None

    def group_of(self, own, at):
        """GEMM 1 group of rows of owner ``own`` computed (or arriving) at ``at``."""
        if self.mech.gemm1 == "arrival":
            return self.gmap[dispatch_group(own, at, self.L, self.N)]
        if self.mech.gemm1 == "local-remote":
            return ((own // self.L) != (at // self.L)).astype(np.int64)
        return np.zeros(np.shape(own), np.int64)

    def wave_of(self, own, at):
        """GEMM 2 wave of partials of owner ``own`` computed at ``at``."""
        if self.mech.gemm2 == "waves":
            return self.wmap[combine_wave(own, at, self.L, self.N)]
        return np.zeros(np.shape(own), np.int64)

    # ---------------------------------------------------------------- prologue and messages
    def add_prologue(self, prologue, planning) -> None:
        """The all-gather, then the planning, on each rank's host stream."""
        g, R = self.g, self.R
        total = np.broadcast_to(np.asarray(prologue, float), (R,))
        plan_part = np.zeros(R) if planning is None else np.broadcast_to(np.asarray(planning, float), (R,))
        gather = self.gather = g.add_fixed(np.arange(R), total - plan_part, kind="allgather", stream="host",
                                           label="all-gather")
        self.pro = g.add_fixed(np.arange(R), plan_part, kind="plan", stream="host", label="plan")
        g.after(gather, self.pro)
        self.out["prologue"] = self.pro

    def split_messages(self) -> None:
        """Overlap needs data per source / destination node: with dispatch groups a forwarded
        message carries one source node's rows (it leaves as they arrive), with combine waves a
        message carries one destination node's partials (it leaves when its wave is done). A
        chosen granularity (``work.granularity``) merges adjacent groups / waves: messages then
        split by coarse group / wave, and not at all when there is one."""
        w, gran = self.work, self.work.granularity
        if self.mech.gemm1 == "arrival":
            w.dispatch = self._split(w.dispatch, None if gran is None else gran.groups, self.group_of, w.dispatch.dst)
        self.free_hops = None
        if self.mech.predispatch and w.single_slots is not None and w.dispatch.size:
            self.free_hops = plan_free_hops(w.dispatch, w.owner, w.token, w.comp, w.slot, w.single_slots, self.R,
                                            self.b.T, self.L)
            w.dispatch = split_by_key(w.dispatch, self.free_hops.astype(np.int64))
        if self.mech.gemm2 == "waves":
            w.combine = self._split(w.combine, None if gran is None else gran.waves, self.wave_of, w.combine.src)

    def _split(self, h: Hops, coarse: int | None, class_of, at: np.ndarray) -> Hops:
        if coarse is None:
            return split_by_owner_node(h, self.L)
        if coarse > 1:
            return split_by_key(h, class_of(h.owner, at))
        return h

    # ---------------------------------------------------------------- dispatch
    def add_dispatch(self, custom_dispatch) -> None:
        """The Hops-driven dispatch (its kernels, stage order, extra calls, barrier), or the
        custom one (``local_done`` / ``remote_done``)."""
        if custom_dispatch is not None:
            self.local_done, self.remote_done = custom_dispatch(self.b, self.pro)
            return
        b, g, mech, R, pro = self.b, self.g, self.mech, self.R, self.pro
        d = self.d = b.phase_messages(self.work.dispatch, mech.dispatch_puts, "dispatch",
                                      dispatch_row_bytes(b.spec, mech))
        free = np.zeros(d.rows.size, bool)
        if self.free_hops is not None:  # Mechanics.predispatch: one more kernel, after the gather
            free[d.hop_msg[self.free_hops]] = True
            pre = g.add_fixed(np.arange(R), np.full(R, self.call), kind="dispatch", stream=None, label="pre-dispatch")
            g.after(self.gather, pre)
            g.after(pre[d.src[free]], d.entry_task[free])
        g.after(pro[d.src[~free]], d.entry_task[~free])  # nothing else leaves a rank before its planning is done
        if mech.kernel_calls[0]:
            self.kc_dispatch = g.add_fixed(np.arange(R), np.full(R, mech.kernel_calls[0] * self.call), kind="dispatch",
                                           stream=None, label="dispatch kernels")
            g.after(pro, self.kc_dispatch)
            g.after(self.kc_dispatch[d.src[~free]], d.entry_task[~free])
        b.stage_deps(self.work.dispatch, d)
        extra_tail = _extra_calls(b, d, pro, "dispatch")
        self.dispatch_done = _phase_end(g, b.net, R, mech.dispatch_barrier, d, extra_tail)

    # ---------------------------------------------------------------- GEMMs
    def add_gemms(self) -> None:
        """GEMM 1 per (class, rank) holding entries, GEMM 2 (in column splits for COMET: ``tab2``
        the first split, ``tab2_end`` the last), and what each waits for."""
        b, mech, w, N = self.b, self.mech, self.work, self.N
        self.n_dispatch = w.dispatch.num_stages
        G = self.G = (max(N, self.n_dispatch) if mech.gemm1 == "stage" else N) + 1
        swapped = w.swapped[w.slot].astype(np.int64) if w.swapped is not None else np.zeros(w.comp.size, np.int64)
        # "stage": an entry's group is its token's arrival stage; a hop of stage s feeds group s + 1
        grp1 = (arrival_stage(w.owner, w.token, w.comp, w.dispatch, b.T) if mech.gemm1 == "stage"
                else self.group_of(w.owner, w.comp))
        self.tab1 = b.gemm_tasks(swapped * G + grp1, w.slot, 2 * G,
                                 lambda c: np.minimum(c % G, 2) * 2 + c // G, "gemm1", which=1)
        col_splits = self.L if mech.gemm2 == "columns" else mech.gemm2_splits if mech.gemm2 == "column-sends" else 1
        self.tab2 = b.gemm_tasks(swapped * N + self.wave_of(w.owner, w.comp), w.slot, 2 * N,
                                 lambda c: 1000 + (c % N) * 2 + c // N, "gemm2", which=2, splits=col_splits)
        self.tab2_end = b.column_splits[-1] if col_splits > 1 else self.tab2
        self._gemm_deps()

    def _gemm_deps(self) -> None:
        g, R, G, tab1, tab2 = self.g, self.R, self.G, self.tab1, self.tab2
        rk1, self.cl1 = np.nonzero(tab1.T >= 0)  # (rank, class) of every GEMM 1 task, rank-major
        rk2, cl2 = np.nonzero(tab2.T >= 0)
        rk2e, cl2e = np.nonzero(self.tab2_end.T >= 0)  # the last column split of every GEMM 2 task
        self.rk1, self.rk2e = rk1, rk2e
        self.g1, g2, self.g2e = tab1[self.cl1, rk1], tab2[cl2, rk2], self.tab2_end[cl2e, rk2e]
        g.after(self.pro[rk1], self.g1)
        if self.kc_dispatch is not None:
            g.after(self.kc_dispatch[rk1], self.g1)
        # GELU needs whole rows: GEMM 2 after all GEMM 1 work of the rank (one join per rank that has both)
        _join_per_rank(g, R, rk1, self.g1, rk2, g2)
        self.all1 = tab1[tab1 >= 0]
        self.all2 = self.tab2_end[self.tab2_end >= 0]
        if self.dispatch_done is not None:
            g.after(self.dispatch_done, self.all1)
        if self.local_done is not None:
            g.after(np.where(self.cl1 % G == 0, np.asarray(self.local_done)[rk1], np.asarray(self.remote_done)[rk1]),
                    self.g1)
        if self.d is not None:  # a group's GEMM 1 after the messages that deliver its rows
            h, d = self.work.dispatch, self.d
            hop_grp = (h.stage.astype(np.int64) + 1) if self.mech.gemm1 == "stage" else self.group_of(
                h.owner.astype(np.int64), h.dst.astype(np.int64))
            key = _uniq(d.hop_msg * G + hop_grp)
            msg, grp = key // G, key % G
            for sw in (0, 1):
                t = tab1[sw * G + grp, d.dst[msg]]
                ok = t >= 0
                g.after(d.exit_task[msg[ok]], t[ok])

    def add_weight_copies(self) -> None:
        """Weight copies (swaps / prefetch pulls) on the destination's copy stream, before the
        GEMMs they feed."""
        w = self.work
        if w.weight_copies is None or not len(w.weight_copies):
            return
        g, R, L, cl = self.g, self.R, self.L, self.b.cl
        wc = np.asarray(w.weight_copies, np.int64)
        w_bytes = float(self.b.spec.expert_weight_bytes)
        cross = (wc[:, 0] // L) != (wc[:, 1] // L)
        fixed = np.where(cross, self.b.net.put(R), cl.nvlink_msg_cost)
        ct = g.add_transfer(wc[:, 0], wc[:, 1], np.full(len(wc), w_bytes), fixed, kind="copy", stream="copy",
                            label="weights")
        g.after(self.pro[wc[:, 1]], ct)
        wait = np.concatenate([self.tab1, self.tab2]) if w.copies_block_gemm == "all" else \
            np.concatenate([self.tab1[self.G:], self.tab2[self.N:]])
        wr, wi = np.nonzero(wait.T >= 0)  # rank-major
        _join_per_rank(g, R, wc[:, 1], ct, wr, wait[wi, wr])
        self.out["copies"] = ct

    # ---------------------------------------------------------------- combine and reduce
    def add_combine(self, custom_combine) -> None:
        """The Hops-driven combine (a partial leaves once its GEMM 2 wave is done), or the
        custom one, which starts per rank once its partials exist."""
        if custom_combine is not None:
            self.combine_done = custom_combine(self.b, self._partials_ready())
            return
        b, g, mech, R, N = self.b, self.g, self.mech, self.R, self.N
        h, splits = self.work.combine, 1
        if mech.gemm2 == "column-sends":  # each GEMM 2 column split sends its slice of every partial
            h, splits = _column_slices(h, mech.gemm2_splits), mech.gemm2_splits
        cm = self.cm = b.phase_messages(h, mech.combine_puts, "combine", float(b.spec.row_bytes) / splits)
        # a partial leaves x once x's GEMM 2 wave for the owner's node is done (both halves); a
        # column slice once its column split is done
        part = h.msg.astype(np.int64) % splits
        key = _uniq((cm.hop_msg * N + self.wave_of(h.owner.astype(np.int64), h.src.astype(np.int64))) * splits + part)
        msg, wv, c = key // (N * splits), (key // splits) % N, key % splits
        tabs = b.column_splits if splits > 1 else self.tab2_end[None]
        for sw in (0, 1):
            t = tabs[c, sw * N + wv, cm.src[msg]]
            ok = t >= 0
            g.after(t[ok], cm.entry_task[msg[ok]])
        b.stage_deps(h, cm)
        extra_tail = _extra_calls(b, cm, None, "combine")
        self.combine_done = _phase_end(g, b.net, R, mech.combine_barrier, cm, extra_tail)
        if mech.kernel_calls[1]:  # the receivers' combine kernels end after their last partial
            self.kc_combine = g.add_fixed(np.arange(R), np.full(R, mech.kernel_calls[1] * self.call), kind="combine",
                                          stream=None, label="combine kernels")
            g.after(self.pro, self.kc_combine)
            g.after(cm.exit_task, self.kc_combine[cm.dst])
            g.after(self.g2e, self.kc_combine[self.rk2e])

    def _partials_ready(self) -> np.ndarray:
        """Per rank, the task after which its partials exist: its last GEMM 2, or (a rank that
        computes nothing) its prologue and dispatch."""
        g, R = self.g, self.R
        ready = g.add_fixed(np.arange(R), np.zeros(R), kind="barrier", stream=None, label="gemm2 done")
        g.after(self.g2e, ready[self.rk2e])
        g.after(self.pro, ready)
        g.after(self.g1, ready[self.rk1])
        if self.dispatch_done is not None:
            g.after(self.dispatch_done, ready)
        if self.remote_done is not None:
            g.after(np.asarray(self.remote_done), ready)
        return ready

    def add_reduce(self) -> None:
        """The weighted reduce at home, after every partial into it (and the stage collectives'
        calls, where the mechanics run them)."""
        b, g, R, cl = self.b, self.g, self.R, self.b.cl
        red_bytes = self.work.tokens_per_rank * b.spec.top_k * b.spec.hidden * 4.0  # fp32 partials read once
        red = g.add_fixed(np.arange(R), np.full(R, red_bytes / cl.hbm_bw + cl.kernel_launch), kind="reduce",
                          stream="compute", prio=np.full(R, 10**6), label="reduce")
        g.after(self.g2e, red[self.rk2e])
        if self.cm is not None:
            g.after(self.cm.exit_task, red[self.cm.dst])
        if self.combine_done is not None:
            g.after(self.combine_done, red)
        if self.mech.stage_collectives:
            if self.d is None or self.cm is None:
                raise SimulationError("stage_collectives mechanics run the Hops-driven phases "
                                      "(no custom_dispatch/combine)")
            add_stage_collectives(b, self.d, self.cm, self.work.combine, self.tab1, self.tab2, self.G, self.pro, red,
                                  float(b.spec.row_bytes), self.n_dispatch, self.work.combine.num_stages)
        if self.kc_combine is not None:
            g.after(self.kc_combine, red)
        self.out.update(gemm1=self.all1, gemm2=self.all2, reduce=red)


def _column_slices(h: Hops, splits: int) -> Hops:
    """A one-stage combine's hops, each repeated ``splits`` times as its column slices: slice ``c``
    of a message is message ``msg * splits + c`` (``msg % splits`` names the slice), carrying
    ``1 / splits`` of each row (the caller's row bytes)."""
    if h.num_stages > 1:
        raise SimulationError("column-sends mechanics need a one-stage combine (a2av or dedup)")
    rep = Hops(**{f: np.repeat(getattr(h, f), splits) for f in Hops._fields()})
    return split_by_key(rep, np.tile(np.arange(splits, dtype=np.int64), h.size))


def dispatch_row_bytes(spec: MoESpec, mech: Mechanics) -> float:
    """Bytes of one row on the dispatch wire (``Mechanics.dispatch_value_bytes``, else the
    model's dtype)."""
    if mech.dispatch_value_bytes is None:
        return float(spec.row_bytes)
    return float(spec.hidden * mech.dispatch_value_bytes)


def _join_per_rank(g: TaskGraph, R: int, pre_rank, pre, post_rank, post) -> None:
    """``after_all(pre of rank r, post of rank r)`` for every rank ``r`` holding both, in rank
    order: one zero-time join task per such rank (created in one call, the same ids as one
    ``after_all`` per rank in a loop would give)."""
    pre_rank, post_rank = np.asarray(pre_rank, np.int64), np.asarray(post_rank, np.int64)
    both = (np.bincount(pre_rank, minlength=R) > 0) & (np.bincount(post_rank, minlength=R) > 0)
    ranks = np.flatnonzero(both)
    if ranks.size == 0:
        return
    join_of = np.full(R, -1, np.int64)
    join_of[ranks] = g.add_fixed(np.zeros(ranks.size, np.int64), np.zeros(ranks.size), kind="barrier",
                                 stream=None, label="join")
    a = both[pre_rank]
    g.after(np.asarray(pre)[a], join_of[pre_rank[a]])
    b = both[post_rank]
    g.after(join_of[post_rank[b]], np.asarray(post)[b])


def _phase_end(g, net, R: int, barrier, msgs, extra_tail: np.ndarray):
    """The task that ends a phase: a world barrier after its messages and extra calls when the
    mechanics ask for one, else its last extra call, else ``None`` (the messages themselves)."""
    if barrier == "world":
        done = g.add_fixed(0, net.barrier(R), kind="barrier", stream=None, label="world barrier")
        g.after(msgs.exit_task, done)
        g.after(extra_tail, done)
        return done
    return int(extra_tail[-1]) if extra_tail.size else None


def _extra_calls(b: LayerBuilder, m: Messages, pro, phase: str) -> np.ndarray:
    """EPLB / MoonEP style phases: ``calls`` all-to-all calls, two world barriers per call; the
    second call moves ``extra_call_bytes`` per row with the same pattern, after the first."""
    mech, g, net, R = b.mech, b.g, b.net, b.R
    if mech.calls <= 1:
        return np.zeros(0, np.int64)
    bar = g.add_fixed(0, 2 * net.barrier(R), kind="barrier", stream=None, label="call barriers")
    g.after(m.exit_task, bar)
    tails = [bar]
    prev = bar
    for _ in range(mech.calls - 1):
        e, x = b.transfers(m.src, m.dst, m.rows * float(mech.extra_call_bytes), "concurrent", phase, phase + " weights")
        g.after(prev, e)
        bar = g.add_fixed(0, 2 * net.barrier(R), kind="barrier", stream=None, label="call barriers")
        g.after(x, bar)
        tails.append(bar)
        prev = bar
    return np.asarray(tails, np.int64)
