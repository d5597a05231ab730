"""Where a simulated layer's time goes: the critical path of its task graph, by category.

The path runs back from the task that ends last: at each step, of the tasks that had to end
before the current one could start (its dependencies and the task before it on its stream),
the one that ended last; the time between that end and the current task's start is a *wait*
(the task was ready, or its stream busy with a task off the path, or its message queued on a
link). Every second from 0 to the layer's latency is counted once, as one of ``CATEGORIES``:

- ``gemm``: expert GEMMs; ``planning``: the planner; ``gather``: the all-gather of what the
  planner reads; ``nic`` / ``nvlink``: a transfer's bytes moving over a
  cross-node / intra-node link (shared max-min fairly while others move too); ``latency``: the
  fixed per-message cost of transfers (put latency, proxy issue slots); ``sync``: barriers,
  flag waits and kernel calls (a collective call's host work is ``other``); ``reduce``: the weighted reduce at home and pre-reductions;
  ``copy``: weight copies (swaps, MoonEP's pulls); ``wait``: gaps; ``other``.
"""

from __future__ import annotations

import numpy as np

from zepp.sim.task_graph import KINDS, STREAMS, TaskGraph

__all__ = ["CATEGORIES", "critical_path", "mean_path", "format_path"]

CATEGORIES = ("gemm", "nic", "nvlink", "latency", "planning", "gather", "sync", "reduce", "copy", "wait", "other")
# tasks that are not transfers, by kind (kernel calls and flag waits are dispatch / combine tasks)
_OF_KIND = {"gemm": "gemm", "plan": "planning", "allgather": "gather", "barrier": "sync", "proxy": "latency",
            "reduce": "reduce", "copy": "copy", "other": "other", "dispatch": "sync", "combine": "sync"}


def _predecessors(graph: TaskGraph, c: dict, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of each task's candidate predecessors: its dependencies, plus the task that ran just
    before it on its stream (streams run one task at a time); ``c``: the graph's columns."""
    n = len(graph)
    pre, post = graph.deps()
    stream = c["stream"].astype(np.int64)
    key = np.where(stream >= 0, c["rank"].astype(np.int64) * len(STREAMS) + stream, -1)
    on = np.flatnonzero(key >= 0)
    order = on[np.lexsort((start[on], key[on]))]
    same = key[order[1:]] == key[order[:-1]]
    pre = np.concatenate([pre, order[:-1][same]])
    post = np.concatenate([post, order[1:][same]])
    srt = np.argsort(post, kind="stable")
    ptr = np.concatenate(([0], np.cumsum(np.bincount(post, minlength=n))))
    return ptr, pre[srt]


def critical_path(graph: TaskGraph, start: np.ndarray, end: np.ndarray) -> dict[str, float]:
    """Seconds per category (``CATEGORIES``) along the critical path of a simulated run.

    ``start``, ``end`` ``[n]``: the tasks' times (``Timeline``); a transfer's bytes count as ``nic``
    where its link crosses nodes, else ``nvlink``. The categories sum to the latest end."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    if len(graph) == 0:
        return out
    c = graph.columns()
    ptr, pred = _predecessors(graph, c, start)
    src, dst, L = c["src"].astype(np.int64), c["dst"].astype(np.int64), graph.cluster.gpus_per_node
    cross = (src >= 0) & (src // L != dst // L)
    kind = c["kind"].astype(np.int64)
    fixed = c["fixed"].astype(float)
    is_xfer = src >= 0
    t = int(np.nanargmax(end))
    while True:
        dur = end[t] - start[t]
        if is_xfer[t]:
            lat = min(fixed[t], dur)
            out["latency"] += lat
            out["nic" if cross[t] else "nvlink"] += dur - lat
        else:
            out[_OF_KIND.get(KINDS[kind[t]], "other")] += dur
        cands = pred[ptr[t]:ptr[t + 1]]
        cands = cands[end[cands] <= start[t] + 1e-12]
        if cands.size == 0:
            out["wait"] += start[t]
            break
        p = int(cands[np.argmax(end[cands])])
        out["wait"] += start[t] - end[p]
        t = p
    return out


def mean_path(paths: list[dict]) -> dict[str, float]:
    """Seconds per category averaged over several runs' critical paths (0 for none)."""
    return {c: float(sum(p[c] for p in paths) / len(paths)) if paths else 0.0 for c in CATEGORIES}


def format_path(path: dict[str, float]) -> str:
    """``gemm 12.31 ms, nic 4.02 ms, ...``: the categories that took any time, largest first."""
    parts = sorted(((v, c) for c, v in path.items() if v > 5e-7), reverse=True)
    return ", ".join(f"{c} {v * 1e3:.2f} ms" for v, c in parts)
