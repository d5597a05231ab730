"""The layer builder's primitives: transfers, a phase's messages and their stage order, grouped
GEMM tasks, and the small task patterns the layer's parts share (``zepp.sim.layer`` adds a
layer's parts with them).

- One transfer per message (``zepp.planner.overlap.grouping.messages``): hops sharing ``(stage,
  src, dst, msg)`` move together. A cross-node put first takes a proxy issue slot on its
  source's proxy stream unless the mechanics' puts are GPU-initiated; blocking puts leave one
  after another per source rank, in ring order; ``Mechanics.chunked`` cuts a relayed message
  into pieces (``zepp.sim.chunks``).
- A message of stage ``s`` waits for every earlier message that delivers one of its rows to its
  source (``zepp.sim.joins.stage_message_pairs``).
- GEMM time (one grouped GEMM over a task's slots): ``max(FLOPs / (peak * eff(rows per
  active expert)), weight bytes / HBM bw) + kernel_launch``; per-expert GEMMs sum that per
  slot. A layer runs two GEMMs (``H -> F`` and ``F -> H``, GELU folded into the launch cost).
  An executor measured elsewhere passes its own ``gemm_cost`` instead (the emulated cluster's).
"""

from __future__ import annotations

import numpy as np

from zepp.cluster import Cluster
from zepp.model import MoESpec
from zepp.planner.overlap.grouping import Messages, messages, split_by_key
from zepp.planner.types import Hops
from zepp.sim.cell_flows import CellFlows
from zepp.sim.chunks import add_pieces, chunk_tokens, link_pieces, order_sends, piece_counts, send_classes
from zepp.sim.joins import stage_message_pairs
from zepp.sim.mechanics import Mechanics, Net
from zepp.sim.task_graph import TaskGraph


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
        cross = (src // self.L) != (dst // self.L)
        put = self.net.put(self.R) if put is None else put
        fixed = np.where(cross, put, self.cl.nvlink_msg_cost)
        return self.proxy_transfers(src, dst, np.asarray(nbytes, float), fixed, cross, kind, label, put, mode, prio)

    def proxy_transfers(self, src, dst, nbytes, fixed, cross, kind: str, label: str, put: float, mode: str, prio=None):
        """``transfers``' messages: ``concurrent`` cross-node puts first take a slot on the
        source's host proxy (``put / proxy_inflight``, the rest of ``put`` is the message's fixed cost)."""
        entry = np.zeros(src.size, np.int64)
        mode = "concurrent" if mode == "concurrent" and self.mech.proxy else "gpu-initiated"
        if mode == "concurrent" and cross.any():
            issue = put / self.net.proxy_inflight
            fixed = np.where(cross, put - issue, fixed)
            ci = np.flatnonzero(cross)
            pt = self.g.add_fixed(src[ci], np.full(ci.size, issue), kind="proxy", stream="proxy",
                                  prio=prio if prio is None else np.asarray(prio)[ci], label="issue")
        xt = self.g.add_transfer(src, dst, nbytes, fixed, kind=kind, label=label)
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

    def phase_messages(self, h, mode: str, kind: str, row_bytes: float) -> Messages:
        """The messages of a phase's hops (or cells, ``zepp.sim.cell_flows.CellFlows``) as transfers."""
        m = messages(h, self.R, h.rows if isinstance(h, CellFlows) else None)
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

    def stage_pairs(self, h, m: Messages) -> tuple[np.ndarray, np.ndarray]:
        """``(pre, post)`` message pairs: ``post`` (stage ``s``, from ``x``) carries a row that
        ``pre`` (an earlier stage) delivers to ``x`` (cells: from their links)."""
        if isinstance(h, CellFlows):
            return h.stage_pairs(m.keys, self.R)
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
                   splits: int = 1, rows: np.ndarray | None = None, overlapped: bool = False) -> np.ndarray:
        """One grouped-GEMM task per (class, rank) holding entries; ``cls [n]`` in ``[0, ncls)``,
        ``slot [n]`` global slots (``rows [n]``: entries each stands for, else one); ``which``:
        GEMM 1 or 2; ``overlapped``: the GEMMs run beside the phase's communication kernels
        (``Mechanics.comm_sms``). Returns ``table [ncls, R]`` of task ids (-1: no task).

        ``splits > 1``: each task is run as ``splits`` column splits in sequence (each 1 / splits
        of the FLOPs and weight reads, plus a launch); the returned table holds the first split,
        ``self.column_splits [splits, ncls, R]`` all of them (see ``column_split_tasks``)."""
        R, S = self.R, self.S
        pair_cnt = np.bincount(cls.astype(np.int64) * (R * S) + slot, weights=rows, minlength=ncls * R * S)
        nz = np.flatnonzero(pair_cnt)
        rows = pair_cnt[nz].astype(float)
        if self.mech.pad_rows > 1:
            rows = np.ceil(rows / self.mech.pad_rows) * self.mech.pad_rows
        tkey = (nz // (R * S)) * R + (nz % (R * S)) // S  # cls * R + rank
        space = ncls * R
        dur = self.gemm_seconds(rows, tkey, space, which, overlapped)
        keys = np.unique(tkey)
        if splits > 1:
            return self.column_split_tasks(keys, dur[keys], prio_of_cls(keys // R), ncls, splits, label)
        table = np.full(space, -1, np.int64)
        table[keys] = self.g.add_fixed(keys % R, dur[keys], kind="gemm", stream="compute",
                                       prio=prio_of_cls(keys // R), label=label)
        return table.reshape(ncls, R)

    def gemm_seconds(self, rows: np.ndarray, tkey: np.ndarray, space: int, which: int, overlapped: bool) -> np.ndarray:
        """``[space]`` seconds of each GEMM task from ``rows [m]`` per (task ``tkey [m]``, slot):
        the measured ``gemm_cost`` where given, else the roofline of one grouped GEMM (or one per
        slot, ``per_expert_gemm``): FLOPs at the efficiency of its rows per active expert (times
        the SMs the communication kernels leave when ``overlapped``) or its weights streamed at
        ``weight_read_eff`` of the HBM rate, whichever is longer, plus a launch; with
        ``Mechanics.hbm_passes`` also its rows gathered in (GEMM 1) or scattered out (GEMM 2)."""
        spec, cl, mech = self.spec, self.cl, self.mech
        tot = np.bincount(tkey, weights=rows, minlength=space)
        act = np.bincount(tkey, minlength=space).astype(float)
        if self.gemm_cost is not None:
            if mech.per_expert_gemm:
                return np.bincount(tkey, weights=self.gemm_cost(which, rows, np.ones(rows.size)), minlength=space)
            return self.gemm_cost(which, tot, act)
        flops_row = 2.0 * spec.hidden * spec.ffn  # one of the two GEMMs
        w_read = spec.hidden * spec.ffn * spec.dtype_bytes / (cl.hbm_bw * cl.weight_read_eff)
        scale = mech.gemm_eff_scale * (1.0 - mech.comm_sms / cl.sms if overlapped else 1.0)
        if mech.per_expert_gemm:
            t = np.maximum(rows * flops_row / (cl.peak_flops * cl.gemm_efficiency(rows) * scale), w_read)
            dur = np.bincount(tkey, weights=t + cl.kernel_launch, minlength=space)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                eff = cl.gemm_efficiency(tot / np.maximum(act, 1)) * scale
                dur = np.maximum(tot * flops_row / (cl.peak_flops * eff), act * w_read) + cl.kernel_launch
        if mech.hbm_passes:  # the rows' gather (GEMM 1) or scatter (GEMM 2): one read and one write each
            dur = dur + np.where(tot > 0, 2.0 * tot * spec.row_bytes / cl.hbm_bw + cl.kernel_launch, 0.0)
        return dur

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


def column_slices(h: Hops, splits: int) -> Hops:
    """A one-stage combine's hops (the caller checks it has one stage), each repeated ``splits``
    times as its column slices: slice ``c`` of a message is message ``msg * splits + c``
    (``msg % splits`` names the slice), carrying ``1 / splits`` of each row (the caller's row bytes)."""
    rep = Hops(**{f: np.repeat(getattr(h, f), splits) for f in Hops._fields()})
    return split_by_key(rep, np.tile(np.arange(splits, dtype=np.int64), h.size))


def dispatch_row_bytes(spec: MoESpec, mech: Mechanics) -> float:
    """Bytes of one row on the dispatch wire (``Mechanics.dispatch_value_bytes``, else the
    model's dtype)."""
    if mech.dispatch_value_bytes is None:
        return float(spec.row_bytes)
    return float(spec.hidden * mech.dispatch_value_bytes)


def join_per_rank(g: TaskGraph, R: int, pre_rank, pre, post_rank, post) -> None:
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


def phase_end(g, net, R: int, barrier, msgs, extra_tail: np.ndarray):
    """The task that ends a phase: a world barrier after its messages and extra calls when the
    mechanics ask for one, else its last extra call, else ``None`` (the messages themselves)."""
    if barrier == "world":
        done = g.add_fixed(0, net.barrier(R), kind="barrier", stream=None, label="world barrier")
        g.after(msgs.exit_task, done)
        g.after(extra_tail, done)
        return done
    return int(extra_tail[-1]) if extra_tail.size else None


def extra_calls(b: LayerBuilder, m: Messages, pro, phase: str) -> np.ndarray:
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
