"""Task graphs of one MoE layer from its FlowPlan: prologue, dispatch, expert GEMMs, combine,
reduce at home.

``build_layer`` turns a ``LayerWork`` (a ``FlowPlan``'s dispatch / combine ``Hops`` plus the
entries' computing ranks, built by ``LayerWork.of``) and a ``Mechanics`` record (how a system
moves its messages, splits its GEMMs and synchronises; ``zepp.sim.mechanics``) into a
``TaskGraph`` (``zepp.sim.task_graph``) that ``zepp.sim.engine.simulate`` runs. The baselines'
special phases (``zepp.sim.phases``) may replace a phase (COMET's all-gather, FAST's rounds) or
add weight copies (MoonEP's pulls; Zepp's swaps add them too).

Granularity and dependencies
----------------------------
- One transfer per message; dispatch groups and combine waves are
  ``zepp.planner.overlap.grouping``'s, as in the runtime (the transfers, stage order and GEMM
  cost model are ``zepp.sim.layer_builder``'s primitives).
- Row-level dependencies, aggregated to tasks: a message of stage ``s`` waits for every earlier
  message that delivers one of its rows to its source; an expert-GEMM task waits for every
  message that delivers one of its rows; a combine message waits for the second-GEMM tasks
  that produce its partials (and for earlier combine stages into its source); the weighted
  reduce at a token's home waits for every combine message into it.
- ``Mechanics.stage_collectives``: every stage is one all-to-all call per rank
  (``zepp.sim.collectives`` adds the calls and each rank's program order).
"""

from __future__ import annotations

import numpy as np

from zepp.cluster import Cluster
from zepp.model import MoESpec
from zepp.planner.overlap.grouping import arrival_stage, combine_wave, dispatch_group, split_by_key, split_by_owner_node
from zepp.sim.cell_flows import CellFlows
from zepp.sim.collectives import add_stage_collectives
from zepp.sim.joins import sorted_distinct
from zepp.sim.layer_builder import (LayerBuilder, column_slices, dispatch_row_bytes, extra_calls, join_per_rank,
                                    phase_end)
from zepp.sim.layer_work import LayerWork
from zepp.sim.mechanics import Mechanics, Net
from zepp.sim.predispatch import plan_free_hops
from zepp.sim.task_graph import SimulationError, TaskGraph

# Event coarsening used for every simulated layer (see zepp.sim.engine): events closer than a
# fraction of the elapsed time (0.05%) are merged and link shares within 0.1% count as one level.
# benchmarks/results/bench_sim_accuracy.md measures what this changes against the exact engine.
SIM_OPTS = dict(rel_quantum=5e-4, rate_tol=1e-3)


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
            w.dispatch = self._split(w.dispatch, None if gran is None else gran.groups, self.group_of, "dst")
        self.free_hops = None
        if self.mech.predispatch and w.single_slots is not None and w.dispatch.size:
            if isinstance(w.dispatch, CellFlows):  # the cells carry their free rows
                self.free_hops = w.dispatch.free.astype(bool)
                w.dispatch = w.dispatch.refined(lambda c: c["free"])
            else:
                self.free_hops = plan_free_hops(w.dispatch, w.owner, w.token, w.comp, w.slot, w.single_slots,
                                                self.R, self.b.T, self.L)
                w.dispatch = split_by_key(w.dispatch, self.free_hops.astype(np.int64))
        if self.mech.gemm2 == "waves":
            w.combine = self._split(w.combine, None if gran is None else gran.waves, self.wave_of, "src")

    def _split(self, h, coarse: int | None, class_of, at: str):
        """Hops (or cells) split by owner node (``coarse`` None) or by ``class_of(owner, at)``
        (``at``: the column the class is seen from, ``dst`` or ``src``)."""
        if isinstance(h, CellFlows):
            if coarse is None:
                return h.refined(lambda c: c["owner_node"])
            return h.refined(lambda c: class_of(CellFlows.owner_of(c, self.L), c[at])) if coarse > 1 else h
        if coarse is None:
            return split_by_owner_node(h, self.L)
        if coarse > 1:
            return split_by_key(h, class_of(h.owner, getattr(h, at)))
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
        if mech.hbm_passes:
            self._add_pack(d)
        if mech.kernel_calls[0]:
            self.kc_dispatch = g.add_fixed(np.arange(R), np.full(R, mech.kernel_calls[0] * self.call), kind="dispatch",
                                           stream=None, label="dispatch kernels")
            g.after(pro, self.kc_dispatch)
            g.after(self.kc_dispatch[d.src[~free]], d.entry_task[~free])
        b.stage_deps(self.work.dispatch, d)
        extra_tail = extra_calls(b, d, pro, "dispatch")
        self.dispatch_done = phase_end(g, b.net, R, mech.dispatch_barrier, d, extra_tail)

    def _add_pack(self, d) -> None:
        """``Mechanics.hbm_passes``: each rank gathers the rows it sends in stage 0 into its send
        buffers (one read and one write per row at the HBM rate) before the first of them leaves."""
        b, g, R = self.b, self.g, self.R
        first = d.stage == 0
        rows = np.bincount(d.src[first], weights=d.rows[first], minlength=R)
        sec = 2.0 * rows * dispatch_row_bytes(b.spec, self.mech) / b.cl.hbm_bw + b.cl.kernel_launch
        pack = g.add_fixed(np.arange(R), np.where(rows > 0, sec, 0.0), kind="other", stream="compute",
                           prio=np.full(R, -1), label="pack")
        g.after(self.pro, pack)
        g.after(pack[d.src[first]], d.entry_task[first])

    # ---------------------------------------------------------------- GEMMs
    def add_gemms(self) -> None:
        """GEMM 1 per (class, rank) holding entries, GEMM 2 (in column splits for COMET: ``tab2``
        the first split, ``tab2_end`` the last), and what each waits for."""
        b, mech, w, N = self.b, self.mech, self.work, self.N
        self.n_dispatch = w.dispatch.num_stages
        G = self.G = (max(N, self.n_dispatch) if mech.gemm1 == "stage" else N) + 1
        owner, comp, slot, rows = w.gemm_entries()
        swapped = w.swapped[slot].astype(np.int64) if w.swapped is not None else np.zeros(comp.size, np.int64)
        # "stage": an entry's group is its token's arrival stage; a hop of stage s feeds group s + 1
        grp1 = (arrival_stage(w.owner, w.token, w.comp, w.dispatch, b.T) if mech.gemm1 == "stage"
                else self.group_of(owner, comp))
        grp2 = self.wave_of(owner, comp)
        overlapped = bool(mech.comm_sms)  # a phase's GEMMs beside its communication kernels: more than one GEMM
        self.tab1 = b.gemm_tasks(swapped * G + grp1, slot, 2 * G,
                                 lambda c: np.minimum(c % G, 2) * 2 + c // G, "gemm1", which=1, rows=rows,
                                 overlapped=overlapped and _several(grp1))
        col_splits = self.L if mech.gemm2 == "columns" else mech.gemm2_splits if mech.gemm2 == "column-sends" else 1
        self.tab2 = b.gemm_tasks(swapped * N + grp2, slot, 2 * N,
                                 lambda c: 1000 + (c % N) * 2 + c // N, "gemm2", which=2, splits=col_splits,
                                 rows=rows, overlapped=overlapped and _several(grp2))
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
        join_per_rank(g, R, rk1, self.g1, rk2, g2)
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
            key = sorted_distinct(d.hop_msg * G + hop_grp)
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
        join_per_rank(g, R, wc[:, 1], ct, wr, wait[wi, wr])
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
            if h.num_stages > 1:
                raise SimulationError("column-sends mechanics need a one-stage combine (a2av or dedup)")
            splits = mech.gemm2_splits
            h = h.column_slices(splits) if isinstance(h, CellFlows) else column_slices(h, splits)
        cm = self.cm = b.phase_messages(h, mech.combine_puts, "combine", float(b.spec.row_bytes) / splits)
        if mech.hbm_passes:
            self._add_pre_reduce(cm)
        # a partial leaves x once x's GEMM 2 wave for the owner's node is done (both halves); a
        # column slice once its column split is done
        part = h.msg.astype(np.int64) % splits
        key = sorted_distinct((cm.hop_msg * N + self.wave_of(h.owner.astype(np.int64), h.src.astype(np.int64))) * splits + part)
        msg, wv, c = key // (N * splits), (key // splits) % N, key % splits
        tabs = b.column_splits if splits > 1 else self.tab2_end[None]
        for sw in (0, 1):
            t = tabs[c, sw * N + wv, cm.src[msg]]
            ok = t >= 0
            g.after(t[ok], cm.entry_task[msg[ok]])
        b.stage_deps(h, cm)
        extra_tail = extra_calls(b, cm, None, "combine")
        self.combine_done = phase_end(g, b.net, R, mech.combine_barrier, cm, extra_tail)
        if mech.kernel_calls[1]:  # the receivers' combine kernels end after their last partial
            self.kc_combine = g.add_fixed(np.arange(R), np.full(R, mech.kernel_calls[1] * self.call), kind="combine",
                                          stream=None, label="combine kernels")
            g.after(self.pro, self.kc_combine)
            g.after(cm.exit_task, self.kc_combine[cm.dst])
            g.after(self.g2e, self.kc_combine[self.rk2e])

    def _add_pre_reduce(self, cm) -> None:
        """``Mechanics.hbm_passes``: a combine message of a later stage carries partials its sender
        summed first (the pre-reduction on a gateway), a kernel reading the partials it received
        and writing their sums, before the message leaves: it becomes the message's entry task."""
        later = np.flatnonzero(cm.stage >= 1)
        if later.size == 0:
            return
        b, g = self.b, self.g
        sec = 2.0 * cm.rows[later] * b.spec.row_bytes / b.cl.hbm_bw + b.cl.kernel_launch
        red = g.add_fixed(cm.src[later], sec, kind="reduce", stream="compute", prio=np.full(later.size, -1),
                          label="pre-reduce")
        g.after(red, cm.entry_task[later])
        cm.entry_task[later] = red

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


def _several(groups: np.ndarray) -> bool:
    """Whether ``groups [n]`` holds more than one value (a phase split into several GEMMs)."""
    return groups.size > 0 and bool((groups != groups.flat[0]).any())
