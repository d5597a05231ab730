"""Event-driven executor of a task graph over the resources of a GPU cluster.

Resources
---------
- per GPU ``r``: *streams* (``compute``, ``copy`` for weight copies, ``proxy`` for the host
  proxy that issues cross-node puts, ``host`` for CPU-side work). A stream runs one task at a
  time; among its ready tasks it runs the one with the lowest ``prio`` (ties: earliest ready,
  then lowest id). With ``prio`` = issue order this is a CUDA stream whose kernels may be
  issued in arrival order (what Zepp's dispatch groups do).
- *links*: per NIC a send side and a receive side, per ordered GPU pair inside a node an NVLink
  direction. A transfer across nodes holds ``nic_send[src]`` and ``nic_recv[dst]`` at once; a
  transfer inside a node holds ``nvlink[src -> dst]``.

Tasks
-----
- fixed-duration tasks (GEMMs, planning, barriers, proxy issue slots), optionally on a stream;
- transfers: first a fixed per-message cost (latency, no bandwidth held), then ``bytes`` flow.
  Concurrent transfers share links max-min fairly at flow level (progressive filling), and the
  rates are recomputed whenever the set of flowing transfers changes. A transfer may also sit
  on a stream (a weight copy occupies its GPU's copy stream until its last byte lands).

Coarsening (what keeps it fast, and why it does not change the answer)
-----------------------------------------------------------------------
- One task per *message* (all rows between two GPUs in one stage share one transfer), never one
  per row: rows of one message share their links and their fixed cost, so they finish together.
- Completions closer than ``max(quantum, rel_quantum * now)`` (defaults 0.5 us and 0; the
  systems use 0.05% of the elapsed time, ``zepp.systems.SIM_OPTS``) are processed as one event:
  a flow that would finish within that window is retired now and its end time is recorded
  exactly (``now + remaining / rate``); the error is that its bandwidth is released up to one
  window early (at 0.5 us and 25 GB/s, at most 12.5 kB per flow per event), and flow starts
  inside the window begin with it.
- Rates are recomputed with a vectorised progressive filling whose loop runs once per distinct
  bottleneck level, not once per flow; with ``rate_tol`` (systems: 0.1%) nearly equal levels
  merge. ``benchmarks/results/bench_sim_accuracy.md`` compares the coarsened engine with the
  exact one (every event, exact levels).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from zepp.cluster import Cluster
from zepp.errors import ZeppInputError

# task kinds (Timeline.kind holds these names)
KINDS = ("gemm", "dispatch", "combine", "copy", "plan", "barrier", "reduce", "allgather", "proxy", "other")
_KIND_ID = {k: i for i, k in enumerate(KINDS)}
STREAMS = ("compute", "copy", "proxy", "host")
_STREAM_ID = {s: i for i, s in enumerate(STREAMS)}


@dataclass
class Timeline:
    """Result of one simulation, one element per task (arrays ``[n_tasks]``).

    ``resource[i]`` names where task ``i`` ran (``gpu3.compute``, ``gpu3.copy``, ``nic3.send``
    (cross-node transfers also hold the receiver's ``nicJ.recv``), ``nvl3>1``, ``gpu3.host`` or
    ``-`` for pure delays); ``start``/``end`` in seconds (a transfer's start includes its fixed
    message cost); ``kind`` is one of ``KINDS``; ``rank`` is the GPU the task belongs to.
    ``latency`` is the layer latency: the latest end over all ranks.
    """

    start: np.ndarray
    end: np.ndarray
    kind: list[str]
    resource: list[str]
    label: list[str]
    rank: np.ndarray
    bytes: np.ndarray
    latency: float
    events: int = 0

    def per_rank_latency(self, ranks: int) -> np.ndarray:
        """``[ranks]`` the last end time of each rank's tasks."""
        out = np.zeros(ranks)
        np.maximum.at(out, self.rank, self.end)
        return out

    def busy(self, kind: str) -> float:
        """Total seconds (summed over tasks) of tasks of one kind."""
        m = np.array([k == kind for k in self.kind], bool)
        return float((self.end[m] - self.start[m]).sum())


@dataclass
class TaskGraph:
    """A task graph under construction. All ``add_*`` methods take scalars or equal-length
    arrays and return the new task ids (``int`` or ``[n]`` int64)."""

    cluster: Cluster
    _cols: dict = field(default_factory=lambda: {k: [] for k in (
        "kind", "rank", "stream", "prio", "dur", "fixed", "bytes", "src", "dst", "label")})
    _dep_pre: list = field(default_factory=list)
    _dep_post: list = field(default_factory=list)
    _n: int = 0

    def __len__(self) -> int:
        return self._n

    def _add(self, n, **cols) -> np.ndarray:
        ids = np.arange(self._n, self._n + n, dtype=np.int64)
        for k, v in cols.items():
            if k == "label":
                self._cols[k].append(v if isinstance(v, list) else [v] * n)
            else:
                self._cols[k].append(np.broadcast_to(np.asarray(v), (n,)).copy())
        self._n += n
        return ids

    @staticmethod
    def _len(*vals) -> tuple[int, bool]:
        n, scalar = 1, True
        for v in vals:
            a = np.asarray(v)
            if a.ndim:
                n, scalar = a.shape[0], False
        return n, scalar

    def add_fixed(self, rank, duration, kind="other", stream: str | None = "compute", prio=None,
                  label="", deps=None):
        """Tasks that take ``duration`` seconds on ``stream`` of GPU ``rank`` (``stream=None``: a
        pure delay that occupies nothing)."""
        n, scalar = self._len(rank, duration)
        ids = self._add(n, kind=_KIND_ID[kind], rank=rank,
                        stream=-1 if stream is None else _STREAM_ID[stream],
                        prio=np.arange(self._n, self._n + n) if prio is None else prio,
                        dur=duration, fixed=0.0, bytes=0.0, src=-1, dst=-1, label=label)
        if deps is not None:
            self.after(deps, ids if not scalar else ids)
        return int(ids[0]) if scalar else ids

    def add_transfer(self, src, dst, nbytes, fixed, kind="dispatch", stream: str | None = None,
                     label="", deps=None, prio=None):
        """Transfers of ``nbytes`` from GPU ``src`` to GPU ``dst`` after a fixed cost ``fixed``
        seconds. ``stream`` (for example ``"copy"``) makes it occupy that stream of ``dst``."""
        n, scalar = self._len(src, dst, nbytes, fixed)
        if np.any(np.asarray(src) == np.asarray(dst)):
            raise ZeppInputError("a transfer needs two different GPUs (src == dst)")
        ids = self._add(n, kind=_KIND_ID[kind], rank=dst,
                        stream=-1 if stream is None else _STREAM_ID[stream],
                        prio=np.arange(self._n, self._n + n) if prio is None else prio,
                        dur=0.0, fixed=fixed, bytes=nbytes, src=src, dst=dst, label=label)
        if deps is not None:
            self.after(deps, ids)
        return int(ids[0]) if scalar else ids

    def after(self, pre, post) -> None:
        """Dependencies: every task in ``post`` starts after every task in ``pre`` ends when one
        side is a scalar or a 1-element array; otherwise element-wise pairs ``pre[i] -> post[i]``."""
        pre = np.atleast_1d(np.asarray(pre, np.int64))
        post = np.atleast_1d(np.asarray(post, np.int64))
        if pre.size == 0 or post.size == 0:
            return
        if pre.size == 1:
            pre = np.broadcast_to(pre, post.shape)
        elif post.size == 1:
            post = np.broadcast_to(post, pre.shape)
        elif pre.shape != post.shape:
            raise ValueError("after(pre, post): arrays must have equal length or one be a scalar")
        self._dep_pre.append(np.asarray(pre, np.int64).ravel())
        self._dep_post.append(np.asarray(post, np.int64).ravel())

    def after_all(self, pre, post) -> None:
        """Every task in ``post`` after every task in ``pre`` (via one zero-time join task)."""
        pre = np.atleast_1d(np.asarray(pre, np.int64))
        post = np.atleast_1d(np.asarray(post, np.int64))
        if pre.size == 0 or post.size == 0:
            return
        j = self.add_fixed(0, 0.0, kind="barrier", stream=None, label="join")
        self.after(pre, j)
        self.after(j, post)

    def columns(self) -> dict:
        out = {}
        for k, parts in self._cols.items():
            if k == "label":
                out[k] = [s for p in parts for s in p]
            else:
                out[k] = np.concatenate(parts) if parts else np.zeros(0)
        return out

    def deps(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._dep_pre:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(self._dep_pre), np.concatenate(self._dep_post)


def maxmin_rates(res_a: np.ndarray, res_b: np.ndarray, cap: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Max-min fair rates of flows over shared links (progressive filling).

    ``res_a``/``res_b [F]``: the (at most two) links each flow holds (``res_b`` may point at a
    dummy link of infinite capacity); ``cap [K]`` link capacities. Returns ``rate [F]``.

    Progressive filling raises all unfrozen flows together and freezes a link's flows when the
    link saturates. Each pass here freezes, at once, every link whose fair share (remaining
    capacity / unfrozen flows) is no larger than the share of any link it shares a flow with
    (a local minimum): such a link saturates exactly at its share whatever happens elsewhere,
    because its neighbours' shares can only grow as their other flows freeze. This gives the
    same rates as freezing one global minimum per pass, in far fewer passes. ``tol``: links
    whose shares differ by less than this fraction count as equal (a flow's rate is then at
    most ``tol`` below its exact max-min rate), which merges nearly equal levels.
    """
    n = res_a.size
    rate = np.zeros(n)
    if n == 0:
        return rate
    k = cap.size
    cnt = np.bincount(res_a, minlength=k) + np.bincount(res_b, minlength=k)
    if cnt[:-1].max(initial=0) <= 1 and np.isinf(cap[-1]):
        # no link shared (the last link is the infinite dummy): every flow runs at its slower link
        return np.minimum(cap[res_a], cap[res_b]).astype(np.float64)
    rem = cap.astype(np.float64).copy()
    idx = np.arange(n)
    a, b = res_a, res_b
    share = np.empty(k)
    while idx.size:
        cnt = np.bincount(a, minlength=k) + np.bincount(b, minlength=k)
        share.fill(np.inf)
        np.divide(rem, cnt, out=share, where=cnt > 0)
        sa, sb = share[a], share[b]
        m = np.minimum(sa, sb)
        if not np.isfinite(m).any():
            rate[idx] = np.inf
            break
        rmin = np.full(k, np.inf)
        np.minimum.at(rmin, a, m)
        np.minimum.at(rmin, b, m)
        local = share <= rmin * (1 + tol)
        hit = (local[a] & (sa <= m * (1 + tol))) | (local[b] & (sb <= m * (1 + tol)))
        lvl = m[hit]
        rate[idx[hit]] = lvl
        rem -= np.bincount(a[hit], weights=lvl, minlength=k) + np.bincount(b[hit], weights=lvl, minlength=k)
        np.maximum(rem, 0.0, out=rem)
        keep = ~hit
        idx, a, b = idx[keep], a[keep], b[keep]
    return rate


class _Links:
    """Link indexing: ``nic_send[r] = r``, ``nic_recv[r] = R + r``,
    ``nvlink[i -> j] = 2R + i * L + j % L`` (same node), dummy (infinite) = last."""

    def __init__(self, cluster: Cluster, nic_bw: float, nvlink_bw: float):
        R, L = cluster.ranks, cluster.gpus_per_node
        self.R, self.L = R, L
        self.cap = np.concatenate([np.full(2 * R, nic_bw), np.full(R * L, nvlink_bw), [np.inf]])
        self.dummy = self.cap.size - 1

    def of(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        R, L = self.R, self.L
        cross = (src // L) != (dst // L)
        a = np.where(cross, src, 2 * R + src * L + dst % L)
        b = np.where(cross, R + dst, self.dummy)
        return a.astype(np.int64), b.astype(np.int64)


def simulate(graph: TaskGraph, nic_bw: float | None = None, nvlink_bw: float | None = None,
             quantum: float = 0.5e-6, rel_quantum: float = 0.0, rate_tol: float = 1e-9,
             labels: bool = True) -> Timeline:
    """Run ``graph`` to completion and return its ``Timeline``.

    ``nic_bw`` / ``nvlink_bw`` override the cluster's link rates (bytes/s per direction), for
    example with a calibrated effective NIC rate. Raises ``ZeppInputError`` on a cyclic graph.
    ``quantum`` / ``rel_quantum``: completions and flow starts within ``max(quantum,
    rel_quantum * now)`` of the next event are handled as one event (see the module notes);
    ``rate_tol``: level tolerance of ``maxmin_rates``.
    """
    cl = graph.cluster
    c = graph.columns()
    n = len(graph)
    links = _Links(cl, cl.nic_bw if nic_bw is None else nic_bw, cl.nvlink_bw if nvlink_bw is None else nvlink_bw)
    kind, rank, stream, prio = c["kind"].astype(np.int64), c["rank"].astype(np.int64), c["stream"].astype(np.int64), c["prio"]
    dur, fixed, nbytes = c["dur"].astype(float), c["fixed"].astype(float), c["bytes"].astype(float)
    src, dst = c["src"].astype(np.int64), c["dst"].astype(np.int64)
    is_xfer = src >= 0
    la = np.full(n, -1, np.int64)
    lb = np.full(n, -1, np.int64)
    if is_xfer.any():
        la[is_xfer], lb[is_xfer] = links.of(src[is_xfer], dst[is_xfer])

    pre, post = graph.deps()
    keep = pre != post
    pre, post = pre[keep], post[keep]
    if pre.size:
        pair = np.unique(pre * n + post)
        pre, post = pair // n, pair % n
    indeg = np.bincount(post, minlength=n).astype(np.int64)
    order = np.argsort(pre, kind="stable")
    succ_ptr = np.concatenate(([0], np.cumsum(np.bincount(pre, minlength=n))))
    succ = post[order]
    succ_ptr_l = succ_ptr.tolist()
    succ_l = succ.tolist()
    indeg_l = indeg.tolist()

    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ready_at = [0.0] * n
    stream_key = np.where(stream >= 0, rank * len(STREAMS) + stream, -1).tolist()
    prio_l = np.asarray(prio).tolist()
    dur_l, fixed_l, bytes_l = dur.tolist(), fixed.tolist(), nbytes.tolist()
    xfer_l = is_xfer.tolist()
    queues: dict[int, list] = {}
    busy: dict[int, bool] = {}
    heap: list = []  # (time, seq, task, phase) phase 0 = finish, 1 = start flowing
    seq = 0

    # active flows
    f_id = np.zeros(0, np.int64)
    f_rem = np.zeros(0)
    f_a = np.zeros(0, np.int64)
    f_b = np.zeros(0, np.int64)
    f_rate = np.zeros(0)
    dirty = False
    now = 0.0
    done = 0
    events = 0
    new_flows: list[int] = []

    def begin(t: int, at: float) -> None:
        nonlocal seq
        start[t] = at
        if xfer_l[t]:
            heapq.heappush(heap, (at + fixed_l[t], seq, t, 1))
        else:
            heapq.heappush(heap, (at + dur_l[t], seq, t, 0))
        seq += 1

    def make_ready(t: int, at: float) -> None:
        sk = stream_key[t]
        if sk < 0:
            begin(t, at)
            return
        if not busy.get(sk, False):
            busy[sk] = True
            begin(t, at)
        else:
            heapq.heappush(queues.setdefault(sk, []), (prio_l[t], at, t))

    for t in np.flatnonzero(indeg == 0).tolist():
        make_ready(t, 0.0)

    def finish(t: int, at: float) -> None:
        nonlocal done
        end[t] = at
        done += 1
        sk = stream_key[t]
        if sk >= 0:
            q = queues.get(sk)
            if q:
                _, _, nxt = heapq.heappop(q)
                begin(nxt, at)
            else:
                busy[sk] = False
        for i in range(succ_ptr_l[t], succ_ptr_l[t + 1]):
            s = succ_l[i]
            if ready_at[s] < at:
                ready_at[s] = at
            indeg_l[s] -= 1
            if indeg_l[s] == 0:
                make_ready(s, ready_at[s])

    while done < n:
        events += 1
        if dirty:
            if new_flows:
                nf = np.asarray(new_flows, np.int64)
                f_id = np.concatenate([f_id, nf])
                f_rem = np.concatenate([f_rem, nbytes[nf]])
                f_a = np.concatenate([f_a, la[nf]])
                f_b = np.concatenate([f_b, lb[nf]])
                new_flows = []
            f_rate = maxmin_rates(f_a, f_b, links.cap, rate_tol)
            dirty = False
        t_heap = heap[0][0] if heap else np.inf
        if f_id.size:
            with np.errstate(divide="ignore"):
                eta = f_rem / f_rate
            t_flow = now + float(eta.min())
        else:
            t_flow = np.inf
        t_next = min(t_heap, t_flow)
        if not np.isfinite(t_next):
            raise ZeppInputError(f"task graph is stuck after {done} of {n} tasks (a dependency cycle?)")
        q = max(quantum, rel_quantum * t_next)
        if f_id.size:
            f_rem = f_rem - f_rate * (t_next - now)
            fin = f_rem <= f_rate * q + 1e-6
            if fin.any():
                ends = t_next + np.maximum(f_rem[fin], 0) / f_rate[fin]
                ids = f_id[fin]
                keep = ~fin
                f_id, f_rem, f_a, f_b, f_rate = f_id[keep], f_rem[keep], f_a[keep], f_b[keep], f_rate[keep]
                dirty = True
                for t, e in zip(ids.tolist(), ends.tolist()):
                    finish(t, e)
        now = t_next
        while heap and heap[0][0] <= now + (q if heap[0][3] == 1 else 0.0):
            at, _, t, phase = heapq.heappop(heap)
            if phase == 1 and bytes_l[t] > 0:
                new_flows.append(t)
                dirty = True
            else:
                finish(t, at)
    latency = float(np.nanmax(end)) if n else 0.0
    res = _resource_names(c, la, cl) if labels else [""] * n
    return Timeline(start=start, end=end, kind=[KINDS[i] for i in kind.tolist()], resource=res,
                    label=c["label"], rank=rank, bytes=nbytes, latency=latency, events=events)


def _resource_names(c: dict, la: np.ndarray, cl: Cluster) -> list[str]:
    out = []
    R = cl.ranks
    for st, rk, s, d, a in zip(c["stream"].tolist(), c["rank"].tolist(), c["src"].tolist(),
                               c["dst"].tolist(), la.tolist()):
        if s >= 0:
            out.append(f"nic{s}.send" if a < R else f"nvl{s}>{d}")
        elif st >= 0:
            out.append(f"gpu{rk}.{STREAMS[st]}")
        else:
            out.append("-")
    return out
