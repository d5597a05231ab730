"""A task graph under construction: the tasks of one simulated run and their dependencies
(``zepp.sim.engine`` runs it).

Tasks
-----
- fixed-duration tasks (GEMMs, planning, barriers, proxy issue slots), optionally on a *stream*
  of GPU ``r`` (``compute``, ``copy`` for weight copies, ``proxy`` for the host proxy that issues
  cross-node puts, ``host`` for CPU-side work). A stream runs one task at a time; among its ready
  tasks it runs the one with the lowest ``prio`` (ties: earliest ready, then lowest id). With
  ``prio`` = issue order this is a CUDA stream whose kernels may be issued in arrival order
  (what Zepp's dispatch groups do).
- transfers: first a fixed per-message cost (latency, no bandwidth held), then ``bytes`` flow
  over the links they hold (``zepp.sim.link_sharing``). A transfer may also sit on a stream (a
  weight copy occupies its GPU's copy stream until its last byte lands).

Graphs are built by zepp: a malformed task (or, when run, a dependency cycle) is a
``SimulationError``, a bug in the builder, never bad user input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from zepp.cluster import Cluster

# task kinds (zepp.sim.engine.Timeline.kind holds these names)
KINDS = ("gemm", "dispatch", "combine", "copy", "plan", "barrier", "reduce", "allgather", "proxy", "other")
_KIND_ID = {k: i for i, k in enumerate(KINDS)}
STREAMS = ("compute", "copy", "proxy", "host")
_STREAM_ID = {s: i for i, s in enumerate(STREAMS)}


class SimulationError(RuntimeError):
    """The simulator met a graph it cannot run (a cycle, a transfer from a GPU to itself): a bug
    in whatever built the graph, never bad user input."""


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
                continue
            a = v if type(v) is np.ndarray else np.asarray(v)
            if a.ndim == 0:
                part = np.empty(n, a.dtype)  # np.full's equal, at half its call cost (every task column)
                part.fill(a)
            elif a.shape == (n,):
                part = a.copy()
            else:
                part = np.broadcast_to(a, (n,)).copy()
            self._cols[k].append(part)
        self._n += n
        return ids

    @staticmethod
    def _len(*vals) -> tuple[int, bool]:
        n, scalar = 1, True
        for v in vals:
            if np.ndim(v):
                n, scalar = len(v), False
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
            self.after(deps, ids)
        return int(ids[0]) if scalar else ids

    def add_transfer(self, src, dst, nbytes, fixed, kind="dispatch", stream: str | None = None,
                     label="", deps=None, prio=None):
        """Transfers of ``nbytes`` from GPU ``src`` to GPU ``dst`` after a fixed cost ``fixed``
        seconds. ``stream`` (for example ``"copy"``) makes it occupy that stream of ``dst``."""
        n, scalar = self._len(src, dst, nbytes, fixed)
        if np.any(np.asarray(src) == np.asarray(dst)):
            raise SimulationError("a transfer needs two different GPUs (src == dst)")
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
        pre = np.asarray(pre, np.int64).ravel()
        post = np.asarray(post, np.int64).ravel()
        if pre.size == 0 or post.size == 0:
            return
        if pre.size == 1 and post.size != 1:
            pre = np.full(post.size, pre[0])
        elif post.size == 1 and pre.size != 1:
            post = np.full(pre.size, post[0])
        elif pre.size != post.size:
            raise SimulationError("after(pre, post): arrays must have equal length or one be a scalar")
        self._dep_pre.append(pre)
        self._dep_post.append(post)

    def after_all(self, pre, post) -> None:
        """Every task in ``post`` after every task in ``pre`` (via one zero-time join task)."""
        pre = np.asarray(pre, np.int64).ravel()
        post = np.asarray(post, np.int64).ravel()
        if pre.size == 0 or post.size == 0:
            return
        j = self.add_fixed(0, 0.0, kind="barrier", stream=None, label="join")
        self.after(pre, j)
        self.after(j, post)

    def columns(self) -> dict:
        out = {}
        for k, parts in self._cols.items():
            if k == "label":
                out[k] = list(chain.from_iterable(parts))
            else:
                out[k] = np.concatenate(parts) if parts else np.zeros(0)
        return out

    def deps(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._dep_pre:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(self._dep_pre), np.concatenate(self._dep_post)
