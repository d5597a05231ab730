"""Task graphs of one MoE layer from its FlowPlan: prologue, dispatch, expert GEMMs, combine,
reduce at home.

``build_layer`` turns a ``LayerPlan`` (a ``FlowPlan``'s dispatch / combine ``Hops`` plus the
entries' computing ranks, built by ``LayerPlan.of``) and a ``Mechanics`` record (how a system
moves its messages, splits its GEMMs and synchronises; ``zepp.sim.mechanics``) into a
``TaskGraph`` that ``zepp.sim.engine.simulate`` runs. Plug-ins (``zepp.sim.plugins``) may replace a
phase (COMET's all-gather, FAST's rounds) or add weight copies (MoonEP's pulls, Zepp's swaps).

Granularity and dependencies
----------------------------
- One transfer per message (``zepp.grouping.messages``): hops sharing ``(stage, src, dst, msg)``
  move together; dispatch groups and combine waves are ``zepp.grouping``'s, as in the runtime.
- Row-level dependencies, aggregated to tasks: a message of stage ``s`` waits for every earlier
  message that delivers one of its rows to its source; an expert-GEMM task waits for every
  message that delivers one of its rows; a combine message waits for the second-GEMM tasks
  that produce its partials (and for earlier combine stages into its source); the weighted
  reduce at a token's home waits for every combine message into it.
- GEMM time (one grouped GEMM over a task's slots): ``max(FLOPs / (peak * eff(rows per
  active expert)), weight bytes / HBM bw) + kernel_launch``; per-expert GEMMs sum that per
  slot. A layer runs two GEMMs (``H -> F`` and ``F -> H``, GELU folded into the launch cost).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.cluster import Cluster
from zepp.grouping import Messages, combine_wave, dispatch_group, messages, split_by_owner_node
from zepp.intsort import sorted_with_order
from zepp.model import MoESpec
from zepp.plan import FlowPlan, Hops
from zepp.sim.engine import TaskGraph
from zepp.sim.mechanics import Mechanics, Net

# Event coarsening used for every simulated layer (see zepp.sim.engine): events closer than a
# fraction of the elapsed time (0.05%) are merged and link shares within 0.1% count as one level.
# benchmarks/results/bench_sim_accuracy.md measures what this changes against the exact engine.
SIM_OPTS = dict(rel_quantum=5e-4, rate_tol=1e-3)


@dataclass
class LayerPlan:
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

    @classmethod
    def of(cls, plan: FlowPlan, **kw) -> "LayerPlan":
        """The layer plan of a ``FlowPlan`` (its routing's entries, its hop tables)."""
        r = plan.routing
        owner, token, comp, slot, entry = entries_of(r)
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


_DENSE_KEYS = 1 << 24  # key tables up to 64 MB (int32); larger key ranges are sorted


def _join(left_key: np.ndarray, right_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs ``(i, j)`` with ``left_key[i] == right_key[j]`` (non-negative integer keys; as a
    set, in no fixed order)."""
    nl, nr = left_key.size, right_key.size
    if nl == 0 or nr == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    hi = max(int(left_key.max()), int(right_key.max())) + 1
    if min(int(left_key.min()), int(right_key.min())) >= 0 and hi <= _DENSE_KEYS and max(nl, nr) < 2**31:
        if nl <= nr:
            return _join_table(left_key, right_key, hi)
        j, i = _join_table(right_key, left_key, hi)
        return i, j
    return _join_sorted(left_key, right_key)


def _join_table(a: np.ndarray, b: np.ndarray, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``_join`` through a key -> index table of ``a``: one pass where ``a``'s keys are distinct
    (nearly so in practice: each row arrives at a rank once in dispatch, leaves it once in
    combine); the few keys ``a`` holds more than once are joined by sorting."""
    tab = np.full(hi, -1, np.int32)
    idx = np.arange(a.size, dtype=np.int32)
    tab[a] = idx
    lost = np.flatnonzero(tab[a] != idx)  # overwritten: their keys appear more than once in a
    hit = tab[b]
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


class LayerBuilder:
    """Builds one layer's tasks into a ``TaskGraph``; see ``build_layer``."""

    def __init__(self, graph: TaskGraph, cluster: Cluster, spec: MoESpec, net: Net, mech: Mechanics):
        self.g, self.cl, self.spec, self.net, self.mech = graph, cluster, spec, net, mech
        self.R, self.L, self.N = cluster.ranks, cluster.gpus_per_node, cluster.nodes

    # ---------------------------------------------------------------- transfers
    def transfers(self, src, dst, nbytes, mode: str, kind: str, label: str, prio=None):
        """Create transfers; returns ``(entry_task, exit_task)`` arrays. ``concurrent``
        cross-node puts first take a proxy issue slot on the source's proxy stream."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        n = src.size
        cross = (src // self.L) != (dst // self.L)
        put = self.net.put(self.R)
        fixed = np.where(cross, put, self.cl.nvlink_msg_cost)
        entry = np.zeros(n, np.int64)
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
        m.entry_task = np.zeros(m.rows.size, np.int64)
        m.exit_task = np.zeros(m.rows.size, np.int64)
        serial_stage = np.isin(m.stage, self.mech.serial_stages) if mode == "serial" else np.zeros(m.rows.size, bool)
        for is_serial in (True, False):
            sel = np.flatnonzero(serial_stage == is_serial)
            if sel.size == 0:
                continue
            e, x = self.transfers(m.src[sel], m.dst[sel], m.rows[sel] * row_bytes,
                                  "serial" if is_serial else "concurrent", kind, kind)
            m.entry_task[sel], m.exit_task[sel] = e, x
        if mode == "serial":
            self.chain_serial(m, np.flatnonzero(serial_stage))
        return m

    def stage_deps(self, h: Hops, m: Messages) -> None:
        """A hop of stage ``s`` from ``x`` waits for earlier-stage arrivals of its row at ``x``."""
        T = self.T
        later = np.flatnonzero(h.stage > 0)
        if later.size == 0:
            return
        early = np.flatnonzero(h.stage < h.stage.max())  # only these can feed a later stage
        key_in = (h.dst[early].astype(np.int64) * self.R + h.owner[early]) * T + h.token[early]
        key_out = (h.src[later].astype(np.int64) * self.R + h.owner[later]) * T + h.token[later]
        i, j = _join(key_in, key_out)
        i, j = early[i], later[j]
        ok = h.stage[i] < h.stage[j]
        a, b = _unique_pairs(m.hop_msg[i[ok]], m.hop_msg[j[ok]])
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
    def gemm_tasks(self, cls: np.ndarray, slot: np.ndarray, ncls: int, prio_of_cls, label: str) -> np.ndarray:
        """One grouped-GEMM task per (class, rank) holding entries; ``cls [n]`` in ``[0, ncls)``,
        ``slot [n]`` global slots. Returns ``table [ncls, R]`` of task ids (-1: no task)."""
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
        if self.mech.per_expert_gemm:
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
        table = np.full(space, -1, np.int64)
        table[keys] = self.g.add_fixed(keys % R, dur[keys], kind="gemm", stream="compute",
                                       prio=prio_of_cls(keys // R), label=label)
        return table.reshape(ncls, R)


def build_layer(graph: TaskGraph, cluster: Cluster, spec: MoESpec, plan: LayerPlan, mech: Mechanics, net: Net,
                prologue: np.ndarray, custom_dispatch=None, custom_combine=None, planning=None) -> dict:
    """Add one MoE layer to ``graph``; returns the main task ids per part.

    ``prologue [R]``: seconds of per-rank work before dispatch (all-gather + planning), run on
    each rank's host stream; ``planning [R]`` (optional): the planning part of it, drawn as its
    own task after the all-gather. ``custom_dispatch(builder, prologue_tasks) -> (local_done [R], remote_done [R])`` (tasks after
    which a rank's GEMM on rows of its own node / of other nodes may start) /
    ``custom_combine(builder, ready [R]) -> join task`` (``ready[r]``: the task after which rank
    ``r``'s partials exist, also for a rank without GEMM work) replace the Hops-driven phases (FAST's
    synchronous rounds).
    """
    b = LayerBuilder(graph, cluster, spec, net, mech)
    R, L, N = b.R, b.L, b.N
    T, S = plan.tokens_per_rank, plan.slots_per_rank
    b.T, b.S = T, S
    g = graph
    out: dict = {}
    total = np.broadcast_to(np.asarray(prologue, float), (R,))
    plan_part = np.zeros(R) if planning is None else np.broadcast_to(np.asarray(planning, float), (R,))
    gather = g.add_fixed(np.arange(R), total - plan_part, kind="allgather", stream="host", label="all-gather")
    pro = g.add_fixed(np.arange(R), plan_part, kind="plan", stream="host", label="plan")
    g.after(gather, pro)
    out["prologue"] = pro
    owner, token, comp, slot, jdx = plan.owner, plan.token, plan.comp, plan.slot, plan.entry
    rb = float(spec.row_bytes)

    # Overlap needs data per source / destination node: with dispatch groups a forwarded message
    # carries one source node's rows (it leaves as they arrive), with combine waves a message
    # carries one destination node's partials (it leaves when its wave is done).
    if mech.gemm1 == "arrival":
        plan.dispatch = split_by_owner_node(plan.dispatch, L)
    if mech.gemm2 == "waves":
        plan.combine = split_by_owner_node(plan.combine, L)

    # ---- dispatch
    if custom_dispatch is None:
        d = b.phase_messages(plan.dispatch, mech.dispatch_puts, "dispatch", rb)
        g.after(pro[d.src], d.entry_task)  # nothing leaves a rank before its planning is done
        b.stage_deps(plan.dispatch, d)
        extra_tail = _extra_calls(b, d, pro, "dispatch")
        dispatch_done = _phase_end(g, net, R, mech.dispatch_barrier, d, extra_tail)
        local_done = remote_done = None
    else:
        d = None
        dispatch_done = None
        local_done, remote_done = custom_dispatch(b, pro)

    # ---- GEMM 1 groups (class = swapped * G + group) and GEMM 2 waves (class = swapped * N + wave)
    G = N + 1

    def group_of(own, at):
        if mech.gemm1 == "arrival":
            return dispatch_group(own, at, L, N)
        if mech.gemm1 == "local-remote":
            return ((own // L) != (at // L)).astype(np.int64)
        return np.zeros(np.shape(own), np.int64)

    def wave_of(own, at):
        if mech.gemm2 == "waves":
            return combine_wave(own, at, L, N)
        return np.zeros(np.shape(own), np.int64)

    swapped = plan.swapped[slot].astype(np.int64) if plan.swapped is not None else np.zeros(comp.size, np.int64)
    tab1 = b.gemm_tasks(swapped * G + group_of(owner, comp), slot, 2 * G,
                        lambda c: np.minimum(c % G, 2) * 2 + c // G, "gemm1")
    tab2 = b.gemm_tasks(swapped * N + wave_of(owner, comp), slot, 2 * N,
                        lambda c: 1000 + (c % N) * 2 + c // N, "gemm2")
    rk1, cl1 = np.nonzero(tab1.T >= 0)  # (rank, class) of every GEMM 1 task, rank-major
    rk2, cl2 = np.nonzero(tab2.T >= 0)
    g1, g2 = tab1[cl1, rk1], tab2[cl2, rk2]
    g.after(pro[rk1], g1)
    # GELU needs whole rows: GEMM 2 after all GEMM 1 work of the rank (one join per rank that has both)
    _join_per_rank(g, R, rk1, g1, rk2, g2)
    all1 = tab1[tab1 >= 0]
    all2 = tab2[tab2 >= 0]
    if dispatch_done is not None:
        g.after(dispatch_done, all1)
    if local_done is not None:
        g.after(np.where(cl1 % G == 0, np.asarray(local_done)[rk1], np.asarray(remote_done)[rk1]), g1)
    if d is not None:
        h = plan.dispatch
        key = _uniq(d.hop_msg * G + group_of(h.owner.astype(np.int64), h.dst.astype(np.int64)))
        msg, grp = key // G, key % G
        for sw in (0, 1):
            t = tab1[sw * G + grp, d.dst[msg]]
            ok = t >= 0
            g.after(d.exit_task[msg[ok]], t[ok])
    # weight copies (swaps / prefetch pulls) on the destination's copy stream
    if plan.weight_copies is not None and len(plan.weight_copies):
        wc = np.asarray(plan.weight_copies, np.int64)
        w_bytes = float(spec.expert_weight_bytes)
        cross = (wc[:, 0] // L) != (wc[:, 1] // L)
        fixed = np.where(cross, net.put(R), cluster.nvlink_msg_cost)
        ct = g.add_transfer(wc[:, 0], wc[:, 1], np.full(len(wc), w_bytes), fixed, kind="copy", stream="copy",
                            label="weights")
        g.after(pro[wc[:, 1]], ct)
        wait = np.concatenate([tab1, tab2]) if plan.copies_block_gemm == "all" else \
            np.concatenate([tab1[G:], tab2[N:]])
        wr, wi = np.nonzero(wait.T >= 0)  # rank-major
        _join_per_rank(g, R, wc[:, 1], ct, wr, wait[wi, wr])
        out["copies"] = ct

    # ---- combine
    red_deps_msgs = None
    if custom_combine is None:
        cm = b.phase_messages(plan.combine, mech.combine_puts, "combine", rb)
        h = plan.combine
        # a partial leaves x once x's GEMM 2 wave for the owner's node is done (both halves)
        key = _uniq(cm.hop_msg * N + wave_of(h.owner.astype(np.int64), h.src.astype(np.int64)))
        msg, wv = key // N, key % N
        for sw in (0, 1):
            t = tab2[sw * N + wv, cm.src[msg]]
            ok = t >= 0
            g.after(t[ok], cm.entry_task[msg[ok]])
        b.stage_deps(h, cm)
        extra_tail = _extra_calls(b, cm, None, "combine")
        red_deps_msgs = cm
        combine_done = _phase_end(g, net, R, mech.combine_barrier, cm, extra_tail)
    else:
        # per rank, the task after which its partials exist: its last GEMM 2, or (a rank that
        # computes nothing) its prologue and dispatch
        ready = g.add_fixed(np.arange(R), np.zeros(R), kind="barrier", stream=None, label="gemm2 done")
        g.after(g2, ready[rk2])
        g.after(pro, ready)
        g.after(g1, ready[rk1])
        if dispatch_done is not None:
            g.after(dispatch_done, ready)
        if remote_done is not None:
            g.after(np.asarray(remote_done), ready)
        combine_done = custom_combine(b, ready)

    # ---- weighted reduce at home
    red_bytes = T * spec.top_k * spec.hidden * 4.0  # fp32 partials read once
    red = g.add_fixed(np.arange(R), np.full(R, red_bytes / cluster.hbm_bw + cluster.kernel_launch), kind="reduce",
                      stream="compute", prio=np.full(R, 10**6), label="reduce")
    g.after(g2, red[rk2])
    if red_deps_msgs is not None:
        cm = red_deps_msgs
        g.after(cm.exit_task, red[cm.dst])
    if combine_done is not None:
        g.after(combine_done, red)
    out.update(gemm1=all1, gemm2=all2, reduce=red)
    return out


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
