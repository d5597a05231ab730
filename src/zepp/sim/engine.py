"""Event-driven executor of a task graph (``zepp.sim.task_graph``) over the resources of a GPU
cluster: per GPU its streams, which run one task at a time, and the links, which concurrent
transfers share max-min fairly (``zepp.sim.link_sharing``).

Coarsening (what keeps it fast, and why it does not change the answer)
-----------------------------------------------------------------------
- One task per *message* (all rows between two GPUs in one stage share one transfer), never one
  per row: rows of one message share their links and their fixed cost, so they finish together.
- A transfer small enough that its slower link moves it within one ``quantum`` (at 0.5 us and
  25 GB/s: 12.5 kB; EPLB's and MoonEP's fp32 route-weight calls, a few hundred bytes per
  message) holds no bandwidth: it ends after its fixed cost plus its bytes at that link's rate.
  Its share of a busy link would have lasted less than a quantum.
- Completions closer than ``max(quantum, rel_quantum * now)`` (defaults 0.5 us and 0; the
  simulator's layers use 0.05% of the elapsed time, ``zepp.sim.layer.SIM_OPTS``) are processed as
  one event: a flow that would finish within that window is retired now and its end time is
  recorded exactly (``now + remaining / rate``); the error is that its bandwidth is released up
  to one window early, and flow starts inside the window begin with it.
- Rates are recomputed (``zepp.sim.link_sharing.maxmin_rates``) only when the set of flowing
  transfers changes; with ``rate_tol`` nearly equal bottleneck levels merge.

The engine is deterministic: the same graph gives bit-identical times on any machine and load.
A graph that cannot finish (a dependency cycle) or a malformed task is a ``SimulationError``:
graphs are built by zepp, so these are bugs, never bad user input.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass

import numpy as np

from zepp.cluster import Cluster
from zepp.sim.link_sharing import Links, maxmin_rates
from zepp.sim.task_graph import KINDS, STREAMS, SimulationError, TaskGraph


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
    path: dict | None = None  # seconds per category along the critical path (zepp.sim.critical_path)

    def per_rank_latency(self, ranks: int) -> np.ndarray:
        """``[ranks]`` the last end time of each rank's tasks."""
        out = np.zeros(ranks)
        np.maximum.at(out, self.rank, self.end)
        return out

    def busy(self, kind: str) -> float:
        """Total seconds (summed over tasks) of tasks of one kind."""
        m = np.array([k == kind for k in self.kind], bool)
        return float((self.end[m] - self.start[m]).sum())


class _Flows:
    """The transfers currently moving bytes: ids, remaining bytes, links, rates (``[F]`` each)."""

    def __init__(self):
        self.id = np.zeros(0, np.int64)
        self.rem = np.zeros(0)
        self.a = np.zeros(0, np.int64)
        self.b = np.zeros(0, np.int64)
        self.rate = np.zeros(0)

    def add(self, ids: np.ndarray, nbytes: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        self.id = np.concatenate([self.id, ids])
        self.rem = np.concatenate([self.rem, nbytes])
        self.a = np.concatenate([self.a, a])
        self.b = np.concatenate([self.b, b])

    def next_end(self, now: float) -> float:
        if not self.id.size:
            return np.inf
        with np.errstate(divide="ignore"):
            return now + float((self.rem / self.rate).min())

    def advance(self, dt: float, window: float) -> tuple[np.ndarray, np.ndarray]:
        """Move every flow ``dt`` seconds on; retire those within ``window`` of their end.
        Returns ``(ids, seconds after the new time at which each retired flow ends)``."""
        self.rem = self.rem - self.rate * dt
        fin = self.rem <= self.rate * window + 1e-6
        if not fin.any():
            return np.zeros(0, np.int64), np.zeros(0)
        tail = np.maximum(self.rem[fin], 0) / self.rate[fin]
        ids = self.id[fin]
        keep = ~fin
        self.id, self.rem, self.a, self.b, self.rate = self.id[keep], self.rem[keep], self.a[keep], self.b[keep], \
            self.rate[keep]
        return ids, tail


class Engine:
    """Runs one ``TaskGraph`` (see the module notes); ``run()`` returns its ``Timeline``.

    ``nic_bw`` / ``nvlink_bw`` override the cluster's link rates (bytes/s per direction), for
    example with a calibrated effective NIC rate. ``quantum`` / ``rel_quantum``: completions and
    flow starts within ``max(quantum, rel_quantum * now)`` of the next event are one event;
    ``rate_tol``: level tolerance of ``maxmin_rates``; ``labels``: name each task's resource.

    The event loop has two implementations with bit-identical results: the compiled one
    (``zepp.sim._engine``, built from ``_engine.c`` at install where a C compiler exists) and
    this class's Python methods (``_begin``, ``_make_ready``, ``_finish``, ``_step``), the
    reference the C file mirrors operation for operation. ``loop``: ``"native"``,
    ``"python"`` or ``None`` (native where built, unless ``ZEPP_SIM_LOOP=python``).
    """

    def __init__(self, graph: TaskGraph, nic_bw: float | None = None, nvlink_bw: float | None = None,
                 quantum: float = 0.5e-6, rel_quantum: float = 0.0, rate_tol: float = 1e-9, labels: bool = True,
                 loop: str | None = None):
        self.graph, self.cluster = graph, graph.cluster
        self.quantum, self.rel_quantum, self.rate_tol, self.labels = quantum, rel_quantum, rate_tol, labels
        self.loop = loop_kind(loop)
        cl = self.cluster
        self.links = Links(cl, cl.nic_bw if nic_bw is None else nic_bw, cl.nvlink_bw if nvlink_bw is None else nvlink_bw)
        c = self.cols = graph.columns()
        self.n = n = len(graph)
        self.nbytes = c["bytes"].astype(float)
        src, dst = c["src"].astype(np.int64), c["dst"].astype(np.int64)
        self.la = np.full(n, -1, np.int64)
        self.lb = np.full(n, -1, np.int64)
        is_xfer = src >= 0
        if is_xfer.any():
            self.la[is_xfer], self.lb[is_xfer] = self.links.of(src[is_xfer], dst[is_xfer])
        self.is_xfer = is_xfer
        self._dependencies()
        rank, stream = c["rank"].astype(np.int64), c["stream"].astype(np.int64)
        self.stream_keys = np.where(stream >= 0, rank * len(STREAMS) + stream, -1)
        # A transfer whose bytes its slower link moves within one quantum holds no bandwidth:
        # it ends after its fixed cost plus bytes / that link's rate (see "Coarsening").
        alone = np.where(is_xfer, np.minimum(self.links.cap[np.maximum(self.la, 0)],
                                             self.links.cap[np.maximum(self.lb, 0)]), np.inf)
        with np.errstate(invalid="ignore"):  # quantum 0 and a dummy link: 0 * inf, never tiny
            tiny = is_xfer & (self.nbytes <= quantum * alone)
        self.tiny = np.where(tiny, self.nbytes / alone, -1.0)
        self.start = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.now = 0.0
        self.done = 0
        self.events = 0

    def _dependencies(self) -> None:
        n = self.n
        pre, post = self.graph.deps()
        keep = pre != post
        pre, post = pre[keep], post[keep]
        if pre.size:
            pair = np.sort(pre * n + post)  # distinct edges, sorted by (pre, post)
            pair = pair[np.concatenate(([True], pair[1:] != pair[:-1]))]
            pre, post = pair // n, pair % n
        # pairs are sorted by (pre, post): the successors of each task in increasing order
        self.succ_ptr_a = np.concatenate(([0], np.cumsum(np.bincount(pre, minlength=n)))).astype(np.int64)
        self.succ_a = post.astype(np.int64)
        self.indeg_a = np.bincount(post, minlength=n).astype(np.int64)
        self.roots_a = np.flatnonzero(self.indeg_a == 0).astype(np.int64)

    def run(self) -> Timeline:
        if self.loop == "native":
            self._run_native()
        else:
            self._run_python()
        c = self.cols
        latency = float(np.nanmax(self.end)) if self.n else 0.0
        res = _resource_names(c, self.la, self.cluster) if self.labels else [""] * self.n
        kind = np.array(KINDS, object)[c["kind"].astype(np.int64)].tolist() if self.n else []
        return Timeline(start=self.start, end=self.end, kind=kind,
                        resource=res, label=c["label"], rank=c["rank"].astype(np.int64), bytes=self.nbytes,
                        latency=latency, events=self.events)

    def _stuck(self) -> SimulationError:
        return SimulationError(f"task graph is stuck after {self.done} of {self.n} tasks (a dependency cycle?)")

    # ------------------------------------------------------------------ the compiled loop
    def _run_native(self) -> None:
        from zepp.sim import _engine

        f8 = lambda x: np.ascontiguousarray(x, np.float64)  # noqa: E731
        i8 = lambda x: np.ascontiguousarray(x, np.int64)  # noqa: E731
        n = self.n
        nstreams = int(self.stream_keys.max(initial=-1)) + 1
        status, self.events, self.done = _engine.run(
            n, self.links.cap.size, nstreams, self.roots_a.size, self.succ_a.size,
            i8(self.succ_ptr_a), i8(self.succ_a), self.indeg_a.copy(), i8(self.roots_a), i8(self.stream_keys),
            f8(self.cols["prio"]), f8(self.cols["dur"]), f8(self.cols["fixed"]), f8(self.nbytes),
            np.ascontiguousarray(self.is_xfer, np.uint8), f8(self.tiny), i8(self.la), i8(self.lb),
            f8(self.links.cap), self.start, self.end, float(self.quantum), float(self.rel_quantum),
            float(self.rate_tol))
        if status != 0:
            raise self._stuck()

    # ------------------------------------------------------------------ the Python loop (the reference)
    def _run_python(self) -> None:
        n = self.n
        self.succ_ptr = self.succ_ptr_a.tolist()
        self.succ = self.succ_a.tolist()
        self.indeg = self.indeg_a.tolist()
        self.stream_key = self.stream_keys.tolist()
        self.prio = np.asarray(self.cols["prio"]).tolist()
        self.dur = self.cols["dur"].astype(float).tolist()
        self.fixed = self.cols["fixed"].astype(float).tolist()
        self.bytes_l = self.nbytes.tolist()
        self.xfer = self.is_xfer.tolist()
        self.tiny_end = self.tiny.tolist()
        self.ready_at = [0.0] * n
        self.queues: dict[int, list] = {}
        self.busy: dict[int, bool] = {}
        self.heap: list = []  # (time, seq, task, phase) phase 0 = finish, 1 = start flowing
        self.seq = 0
        self.flows = _Flows()
        self.new_flows: list[int] = []
        self.dirty = False
        for t in self.roots_a.tolist():
            self._make_ready(t, 0.0)
        while self.done < n:
            self._step()

    # ------------------------------------------------------------------ task life cycle
    def _begin(self, t: int, at: float) -> None:
        self.start[t] = at
        if self.xfer[t]:
            tiny = self.tiny_end[t]
            if tiny >= 0.0:
                heapq.heappush(self.heap, (at + self.fixed[t] + tiny, self.seq, t, 0))
            else:
                heapq.heappush(self.heap, (at + self.fixed[t], self.seq, t, 1))
        else:
            heapq.heappush(self.heap, (at + self.dur[t], self.seq, t, 0))
        self.seq += 1

    def _make_ready(self, t: int, at: float) -> None:
        sk = self.stream_key[t]
        if sk < 0:
            self._begin(t, at)
        elif not self.busy.get(sk, False):
            self.busy[sk] = True
            self._begin(t, at)
        else:
            heapq.heappush(self.queues.setdefault(sk, []), (self.prio[t], at, t))

    def _finish(self, t: int, at: float) -> None:
        self.end[t] = at
        self.done += 1
        sk = self.stream_key[t]
        if sk >= 0:
            q = self.queues.get(sk)
            if q:
                self._begin(heapq.heappop(q)[2], at)
            else:
                self.busy[sk] = False
        ready_at, indeg, succ = self.ready_at, self.indeg, self.succ
        for i in range(self.succ_ptr[t], self.succ_ptr[t + 1]):
            s = succ[i]
            if ready_at[s] < at:
                ready_at[s] = at
            indeg[s] -= 1
            if indeg[s] == 0:
                self._make_ready(s, ready_at[s])

    # ------------------------------------------------------------------ the event loop
    def _refresh_rates(self) -> None:
        if self.new_flows:
            nf = np.asarray(self.new_flows, np.int64)
            self.flows.add(nf, self.nbytes[nf], self.la[nf], self.lb[nf])
            self.new_flows = []
        self.flows.rate = maxmin_rates(self.flows.a, self.flows.b, self.links.cap, self.rate_tol)
        self.dirty = False

    def _step(self) -> None:
        """One event: advance to the next completion, retire flows and tasks due by then."""
        self.events += 1
        if self.dirty:
            self._refresh_rates()
        t_next = min(self.heap[0][0] if self.heap else np.inf, self.flows.next_end(self.now))
        if not np.isfinite(t_next):
            raise self._stuck()
        window = max(self.quantum, self.rel_quantum * t_next)
        if self.flows.id.size:
            ids, tail = self.flows.advance(t_next - self.now, window)
            if ids.size:
                self.dirty = True
                for t, e in zip(ids.tolist(), (t_next + tail).tolist()):
                    self._finish(t, e)
        self.now = t_next
        heap = self.heap
        while heap and heap[0][0] <= t_next + (window if heap[0][3] == 1 else 0.0):
            at, _, t, phase = heapq.heappop(heap)
            if phase == 1 and self.bytes_l[t] > 0:
                self.new_flows.append(t)
                self.dirty = True
            else:
                self._finish(t, at)


def simulate(graph: TaskGraph, nic_bw: float | None = None, nvlink_bw: float | None = None,
             quantum: float = 0.5e-6, rel_quantum: float = 0.0, rate_tol: float = 1e-9,
             labels: bool = True, loop: str | None = None) -> Timeline:
    """Run ``graph`` to completion and return its ``Timeline`` (see ``Engine``)."""
    return Engine(graph, nic_bw, nvlink_bw, quantum, rel_quantum, rate_tol, labels, loop).run()


def native_available() -> bool:
    """Whether the compiled event loop (``zepp.sim._engine``) was built."""
    try:
        from zepp.sim import _engine  # noqa: F401
    except ImportError:
        return False
    return True


def loop_kind(loop: str | None = None) -> str:
    """The event loop ``Engine`` runs: ``loop`` when given (``"native"`` needs the compiled
    module), else ``ZEPP_SIM_LOOP`` (``native`` / ``python``), else native where it was built."""
    want = loop or os.environ.get("ZEPP_SIM_LOOP") or ("native" if native_available() else "python")
    if want not in ("native", "python"):
        raise SimulationError(f"unknown event loop {want!r} (ZEPP_SIM_LOOP or loop=): native or python")
    if want == "native" and not native_available():
        raise SimulationError("the compiled event loop zepp.sim._engine is not built (pip install -e . with a C "
                              "compiler builds it); ZEPP_SIM_LOOP=python runs the Python loop")
    return want


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
