"""COMET's phases (PAPER.md section 7): the dense all-gather dispatch and the in-node ring combine.

- ``comet-allgather``: dispatch is a dense, routing-oblivious all-gather: each rank gets its
  same-index peer's whole shard from every remote node (``N-1`` concurrent gets), a node
  barrier, then an NVLink fan-out of those shards to the node's other GPUs; the own node's
  shards arrive over NVLink at once; GEMM tiles wait on per-source flags (one 2 us signal wait
  per source rank before the local / remote rows). Replaces the dispatch phase; adds its bytes
  to the physical floor.
- ``comet-ring-combine`` ("GEMM 2 publishes per column-split barriers; partials reduce in a ring
  inside the owner node group and go out with put-with-signal"): the hidden columns are split
  into ``L`` column chunks (one per GPU of a node, as a ring reduce-scatter splits them); per
  node and chunk a node barrier after the node's GEMM 2, then ``L-1`` NVLink ring steps that
  sum the node's partials of the chunk (every token with an entry on the node) onto the chunk's
  GPU, which puts the chunk to every owner rank with a signal; each owner polls one flag per
  (node, chunk) it receives (2 us each, "a signal wait on the receiver costs about 2 us"). The
  cross-node puts-with-signal are fenced (``Mechanics.fenced_signals``): through NVSHMEM's host
  proxy a put-with-signal is a put, a fence and a signal, and on the libfabric transport
  (Slingshot) the fence is a quiet that holds the proxy thread until all its puts have
  completed, so a GPU's puts-with-signal go one after another, each a blocking put (sources:
  NVSHMEM's ``transport_common.cpp`` ``nvshmemt_put_signal`` and ``libfabric.cpp``
  ``nvshmemt_libfabric_fence``; its commit 2d820ea: "fence() takes 1 RTT to complete ... This
  was causing nvshmemx_putmem_signal_nbi() to block for 1 RTT"; PAPER.md section 7: "one proxy
  per rank serves its puts one after another"). Replaces the combine; its NIC bytes replace the
  hop table's in the physical floor. With ``gemm2 = "columns"`` chunk ``c``'s barrier waits for GEMM 2's column
  split ``c`` only, so the ring overlaps the later splits.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from zepp.planner.types import FlowPlan, Hops
from zepp.sim.phases.inputs import BatchInputs


def use_allgather(ctx: BatchInputs) -> None:
    """``comet-allgather``: the dispatch phase becomes ``CometAllGather``."""
    ctx.custom_dispatch = CometAllGather(ctx)
    cl = ctx.cluster
    b = (cl.nodes - 1) * ctx.tokens_per_rank * float(ctx.spec.row_bytes)
    ctx.add_nic(np.full(cl.ranks, b), np.full(cl.ranks, b))


def use_ring_combine(ctx: BatchInputs) -> None:
    """``comet-ring-combine``: the combine phase becomes ``CometRingCombine``; its NIC bytes go
    to the floor as ``extra_nic`` instead of the hop table's."""
    rows_no = node_owner_rows(ctx.plan, ctx.cluster.gpus_per_node)
    ring = CometRingCombine(ctx, rows_no)
    ctx.custom_combine = ring
    ctx.plan = replace(ctx.plan, hops=(ctx.plan.dispatch, Hops.empty()))
    ctx.add_nic(*ring.nic_bytes())


def node_owner_rows(plan: FlowPlan, L: int) -> np.ndarray:
    """``[N, R]`` rows of owner rank ``o``'s tokens with at least one entry computed on node
    ``n`` (the partial rows node ``n`` reduces and returns to ``o``)."""
    r = plan.routing
    R, T, k = r.topk_ids.shape
    N = R // L
    slot = r.slot.reshape(R, T * k).astype(np.int64)
    owner = np.repeat(np.arange(R), T * k).reshape(R, T * k)
    token = np.repeat(np.arange(T), k)[None, :].repeat(R, 0)
    ok = slot >= 0
    node = slot[ok] // r.placement.slots_per_rank // L
    key = (node * R + owner[ok]) * T + token[ok]
    if N * R * T <= 1 << 26:  # distinct keys by marking a dense table (linear, unlike a sort)
        seen = np.zeros(N * R * T, bool)
        seen[key] = True
        return seen.reshape(N * R, T).sum(1, dtype=np.int64).reshape(N, R).astype(float)
    u = np.unique(key)
    return np.bincount(u // T, minlength=N * R).reshape(N, R).astype(float)


class CometAllGather:
    """COMET's dense all-gather as custom dispatch tasks (``build_layer``'s ``custom_dispatch``):
    called with the layer builder and the prologue tasks ``[R]``, returns ``(local_done [R],
    remote_done [R])``."""

    def __init__(self, ctx: BatchInputs):
        cl = ctx.cluster
        self.R, self.L, self.N = cl.ranks, cl.gpus_per_node, cl.nodes
        self.shard = ctx.tokens_per_rank * float(ctx.spec.row_bytes)

    def __call__(self, b, pro):
        R, L, N = self.R, self.L, self.N
        lt, ld = self._own_node_shards(b, pro)
        gt, gd = self._remote_gets(b, pro)
        local_done = np.zeros(R, np.int64)
        remote_done = np.zeros(R, np.int64)
        for n in range(N):
            mine = np.arange(n * L, (n + 1) * L)
            bar = b.g.add_fixed(n * L, b.net.node_barrier(L), kind="barrier", stream=None, label="node barrier")
            if N > 1:
                b.g.after(gt[np.isin(gd, mine)], bar)
            ft, fd = self._fan_out(b, mine, bar)
            local_done[mine], remote_done[mine] = self._flags(b, pro, mine, bar, lt, ld, ft, fd)
        return local_done, remote_done

    def _own_node_shards(self, b, pro):
        """Own-node shards ``(n, j) -> (n, i)`` over NVLink: ``(exit tasks, destinations)``."""
        r = np.arange(self.R)
        s_, d_ = np.meshgrid(r, r, indexing="ij")
        same = (s_ // self.L == d_ // self.L) & (s_ != d_)
        ls, ld = s_[same], d_[same]
        _, lt = b.transfers(ls, ld, np.full(ls.size, self.shard), "concurrent", "dispatch", "own-node shard")
        b.g.after(pro[ls], lt)
        return lt, ld

    def _remote_gets(self, b, pro):
        """Gets from the same-index peers of remote nodes: ``(exit tasks, destinations)``."""
        r = np.arange(self.R)
        node, loc = r // self.L, r % self.L
        peer = (node[:, None] != node[None, :]) & (loc[:, None] == loc[None, :])
        gs, gd = np.nonzero(peer)
        ge, gt = b.transfers(gs, gd, np.full(gs.size, self.shard), "concurrent", "dispatch", "remote shard get")
        b.g.after(pro[gd], ge)
        return gt, gd

    def _fan_out(self, b, mine: np.ndarray, bar: int):
        """``(n, i) -> (n, j)`` of the ``N-1`` remote shards GPU ``i`` fetched, after the node
        barrier: ``(exit tasks, destinations)`` (``None`` on one node)."""
        fs, fd = np.meshgrid(mine, mine, indexing="ij")
        off = fs != fd
        fs, fd = fs[off], fd[off]
        if self.N == 1:
            return None, fd
        fe, ft = b.transfers(fs, fd, np.full(fs.size, (self.N - 1) * self.shard), "concurrent", "dispatch",
                             "fan-out")
        b.g.after(bar, fe)
        return ft, fd

    def _flags(self, b, pro, mine: np.ndarray, bar: int, lt, ld, ft, fd) -> tuple[np.ndarray, np.ndarray]:
        """GEMM tiles wait on per-source flags (PAPER.md section 7): one 2 us wait per source
        rank before each GPU ``i`` of ``mine``'s local rows (after its own-node shards ``lt[ld ==
        i]``) and its remote rows (after the fan-outs ``ft[fd == i]``); per GPU, its local then its
        remote wait, in ``mine`` order. Returns ``(local [L], remote [L])`` task ids."""
        g, L = b.g, self.L
        waits = np.tile([(L - 1) * b.net.signal, (self.R - L) * b.net.signal], mine.size)
        ids = g.add_fixed(np.repeat(mine, 2), waits, kind="barrier", stream=None,
                          label=["local rows", "remote rows"] * mine.size)
        jl, jr = ids[0::2], ids[1::2]
        at = np.full(self.R, -1, np.int64)
        at[mine] = np.arange(mine.size)
        own = at[ld] >= 0
        g.after(lt[own], jl[at[ld[own]]])
        g.after(pro[mine], jl)
        g.after(bar, jr)
        if ft is not None:
            fan = at[fd] >= 0
            g.after(ft[fan], jr[at[fd[fan]]])
        return jl, jr


class CometRingCombine:
    """COMET's combine as custom tasks (``build_layer``'s ``custom_combine``): called with the
    layer builder and ``ready [R]``, returns the task that ends the phase. ``rows_no [N, R]``:
    ``node_owner_rows``."""

    def __init__(self, ctx: BatchInputs, rows_no: np.ndarray):
        cl = ctx.cluster
        self.R, self.L, self.N = cl.ranks, cl.gpus_per_node, cl.nodes
        self.rb = float(ctx.spec.row_bytes)
        self.rows_no = rows_no
        # one (node, chunk) per entry; chunk c ends on GPU c of its node
        self.n_idx, self.c_idx = np.divmod(np.arange(self.N * self.L), self.L)

    def nic_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """NIC bytes of the ring combine: ``(send [R], recv [R])``."""
        R, L, N = self.R, self.L, self.N
        remote = np.arange(N)[:, None] != (np.arange(R) // L)[None, :]  # [N, R]
        out_node = (self.rows_no * remote).sum(1) * self.rb  # [N] bytes leaving node n, spread over its L chunk GPUs
        send = np.repeat(out_node / L, L)
        recv = (self.rows_no * remote).sum(0) * self.rb
        return send, recv

    def __call__(self, b, ready):
        ready = np.asarray(ready, np.int64)
        bar = self._column_barriers(b, ready)
        last = self._ring_steps(b, bar)
        return self._puts_and_polls(b, last)

    def _column_barriers(self, b, ready: np.ndarray) -> np.ndarray:
        """Per (node, chunk) a barrier once the node's ``L`` GPUs have their partials of the chunk."""
        g, L, n_idx, c_idx = b.g, self.L, self.n_idx, self.c_idx
        bar = g.add_fixed(n_idx * L + c_idx, np.full(self.N * L, b.net.node_barrier(L)), kind="barrier", stream=None,
                          label="column-split barrier")
        cols = b.column_splits  # [L, ncls, R] with gemm2 == "columns": chunk c waits for split c only
        for j in range(L):
            r = n_idx * L + j
            if cols is None:
                g.after(ready[r], bar)
                continue
            t = cols[c_idx, :, r]  # [N * L, ncls]
            for k in range(t.shape[1]):
                ok = t[:, k] >= 0
                g.after(t[ok, k], bar[ok])
            idle = ~(cols[:, :, r] >= 0).any(axis=(0, 1))  # a rank without GEMM 2 work: its ready task
            g.after(ready[r[idle]], bar[idle])
        return bar

    def _ring_steps(self, b, bar: np.ndarray) -> np.ndarray:
        """The ring reduce-scatter: chunk ``c`` starts on GPU ``c+1`` and ends on GPU ``c`` after
        ``L-1`` NVLink steps; returns each chunk's last task."""
        L, n_idx, c_idx = self.L, self.n_idx, self.c_idx
        chunk_bytes = self.rows_no.sum(1)[n_idx] * self.rb / L
        prev = bar
        for s in range(L - 1):
            src = n_idx * L + (c_idx + 1 + s) % L
            dst = n_idx * L + (c_idx + 2 + s) % L
            e, x = b.transfers(src, dst, chunk_bytes, "concurrent", "combine", "ring step")
            b.g.after(prev, e)
            prev = x
        return prev

    def _puts_and_polls(self, b, prev: np.ndarray) -> int:
        """Put-with-signal of each reduced chunk to every owner rank that has rows in it; owners
        poll one flag per incoming (node, chunk). With ``Mechanics.fenced_signals`` a chunk GPU's
        cross-node puts-with-signal are blocking puts, one after another in ring order."""
        g, R, L, rows_no = b.g, self.R, self.L, self.rows_no
        nn, oo = np.nonzero(rows_no)
        cc = np.tile(np.arange(L), nn.size)
        nn, oo = np.repeat(nn, L), np.repeat(oo, L)
        src = nn * L + cc
        keep = src != oo
        src, nn, oo, cc = src[keep], nn[keep], oo[keep], cc[keep]
        fenced = b.mech.fenced_signals & ((src // L) != (oo // L))  # Mechanics.fenced_signals: cross-node ones
        e, x = np.zeros(src.size, np.int64), np.zeros(src.size, np.int64)
        for mode, sel in (("serial", np.flatnonzero(fenced)), ("concurrent", np.flatnonzero(~fenced))):
            if sel.size:
                e[sel], x[sel] = b.transfers(src[sel], oo[sel], rows_no[nn[sel], oo[sel]] * self.rb / L, mode,
                                             "combine", "put-with-signal")
        b.chain_serial(SimpleNamespace(src=src, dst=oo, stage=np.zeros(src.size, np.int64), entry_task=e, exit_task=x),
                       np.flatnonzero(fenced))  # one after another per GPU, ring order
        g.after(prev[nn * L + cc], e)
        flags = np.bincount(oo, minlength=R)
        poll = g.add_fixed(np.arange(R), flags * b.net.signal, kind="barrier", stream=None, label="flag polls")
        g.after(x, poll[oo])
        g.after(prev[np.arange(R)], poll)  # an owner's own chunk (chunk c of node n ends on rank n * L + c)
        done = g.add_fixed(0, 0.0, kind="barrier", stream=None, label="combine done")
        g.after(poll, done)
        return done
