"""Demand schedules: what a placement is planned from and how the evaluation batches move
between topics (``zepp.traces.topics``) over the iterations of a run.

``SCHEDULES`` is the one table of names (``--schedule`` everywhere reads it);
:func:`drift_workload` builds a run's history and batches for one of them. Batches of the topic
schedules are pure: batch ``i`` samples rows (uniformly, with replacement, seeded) from the eval
window of one topic, and the topic changes every ``period`` batches (``DEFAULT_PERIOD``).
``stationary`` is the benchmark as it always was (its batches are ``sample_batches``'s, bit for
bit); its topic mix is measured on the rows drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.sampling import node_demand, sample_rows
from zepp.traces.topics import Topics, find_topics
from zepp.traces.trace import Trace

__all__ = ["SCHEDULES", "DEFAULT_SCHEDULE", "DEFAULT_PERIOD", "DriftWorkload", "drift_workload", "check_schedule",
           "unseen_topic"]

SCHEDULES = {
    "stationary": "history = the whole pool window; every batch sampled from the whole eval window (today's "
                  "benchmark, the default)",
    "in-history": "history = the whole pool window (every topic); the batches move through all topics, one topic "
                  "per period",
    "rotating": "history = the pool rows of the first half of the topics; the batches drift through the other "
                "topics, one topic per period",
    "unseen": "history = the pool rows of every topic but one (the one the others predict worst); every batch "
              "from that topic",
}
DEFAULT_SCHEDULE = "stationary"
DEFAULT_PERIOD = 4  # batches per topic


def check_schedule(name: str, option: str = "--schedule") -> str:
    """``name`` if it is a schedule; else one error naming the option and the choices."""
    if name not in SCHEDULES:
        raise ZeppInputError(f"{option} {name!r}: unknown schedule; choose from {', '.join(SCHEDULES)}")
    return name


@dataclass(frozen=True)
class DriftWorkload:
    """One run's demand. ``history``: the rows a placement is planned from (a ``Trace``, as
    ``node_demand`` takes it: :meth:`hist`); ``batches [iters, R, T, k]`` int32;
    ``topic_mix [iters, n]`` float64, each batch's share of rows per topic (rows sum to 1);
    ``topics``: the ``Topics`` (names and statistics); ``history_topics``: ids the history holds."""

    schedule: str
    period: int
    history: Trace
    batches: np.ndarray
    topic_mix: np.ndarray
    topics: Topics
    history_topics: tuple[int, ...]

    def hist(self, nodes: int, gpus_per_node: int) -> np.ndarray:
        """``[N, E]`` history histogram, as the placement code takes it."""
        return node_demand(self.history, nodes, gpus_per_node)

    def mix_names(self, it: int) -> dict[str, float]:
        """Batch ``it``'s topic shares by name (topics with no rows left out)."""
        return {n: round(float(x), 4) for n, x in zip(self.topics.names, self.topic_mix[it]) if x > 0}

    def report(self, first: int = 0) -> dict:
        """JSON-ready: the schedule, period, history topics and the mix of batches ``first..``."""
        return dict(schedule=self.schedule, period=self.period,
                    history_topics=[self.topics.names[i] for i in self.history_topics],
                    topic_mix=[self.mix_names(i) for i in range(first, self.batches.shape[0])])

    def describe(self, first: int = 0) -> str:
        """One line: the schedule, the history's topics and the batches' topics in runs."""
        runs: list[list] = []
        for i in range(first, self.batches.shape[0]):
            m = self.mix_names(i)
            label = next(iter(m)) if len(m) == 1 else "mix(" + ",".join(f"{n}:{x:.2f}" for n, x in m.items()) + ")"
            if runs and runs[-1][0] == label:
                runs[-1][1] += 1
            else:
                runs.append([label, 1])
        seq = ", ".join(f"{lab} x{n}" for lab, n in runs)
        hist = "+".join(self.topics.names[i] for i in self.history_topics)
        return f"schedule {self.schedule} (period {self.period}): history {hist}; batches {seq}"


def unseen_topic(topics: Topics) -> int:
    """The topic whose eval popularity is farthest (total variation) from the pooled pool
    popularity of all other topics: the one a history without it predicts worst."""
    e = topics.pool.num_experts
    rt = topics.row_topic()
    n = topics.count
    pool = np.bincount((rt[:, None] * e + topics.pool.topk_ids).ravel(), minlength=n * e).reshape(n, e)
    ev = np.bincount((rt[:, None] * e + topics.eval.topk_ids).ravel(), minlength=n * e).reshape(n, e)
    others = pool.sum(0)[None] - pool
    p = ev / np.maximum(ev.sum(1, keepdims=True), 1)
    q = others / np.maximum(others.sum(1, keepdims=True), 1)
    return int(np.argmax(0.5 * np.abs(p - q).sum(1)))


def _plan(topics: Topics, schedule: str, iters: int, period: int) -> tuple[tuple[int, ...], np.ndarray]:
    """``(history topic ids, [iters] topic of each batch)`` of a topic schedule."""
    n = topics.count
    pos = np.arange(iters) // period
    if schedule == "in-history":
        return tuple(range(n)), pos % n
    if schedule == "rotating":
        h = n // 2
        if h < 1 or n - h < 1:
            raise ZeppInputError(f"--schedule rotating needs at least 2 topics, {topics.source} has {n}")
        return tuple(range(h)), h + pos % (n - h)
    u = unseen_topic(topics)
    if n < 2:
        raise ZeppInputError(f"--schedule unseen needs at least 2 topics, {topics.source} has {n}")
    return tuple(i for i in range(n) if i != u), np.full(iters, u)


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ZeppInputError(f"drift_workload: {name} must be a positive integer, got {v!r}")
    return int(v)


def drift_workload(source, schedule: str, ranks: int, tokens_per_rank: int, iters: int, seed: int,
                   period: int | None = None) -> DriftWorkload:
    """The history and ``iters`` batches of ``schedule`` (``SCHEDULES``).

    ``source``: a ``Topics``, or ``(pool, eval)`` Traces (grouped with ``find_topics``'s
    defaults; under ``stationary`` the Traces are used whole, so history and batches equal
    today's ``node_demand(pool)`` / ``sample_batches(eval, ...)``). ``period``: batches per topic
    (default ``DEFAULT_PERIOD``). Seeded: the same arguments give the same workload.
    """
    check_schedule(schedule)
    R, T, iters = _positive("ranks", ranks), _positive("tokens_per_rank", tokens_per_rank), _positive("iters", iters)
    period = DEFAULT_PERIOD if period is None else _positive("period", period)
    whole = None
    if isinstance(source, Topics):
        topics = source
    else:
        pool, ev = source
        topics, whole = find_topics(pool, ev), (pool, ev)
    n = topics.count
    if schedule == "stationary":
        pool, ev = whole or (topics.pool, topics.eval)
        rows = sample_rows(len(ev), R, T, iters, seed)
        rt = np.concatenate([topics.row_topic(), np.full(len(ev) - len(topics.eval), n)])  # n: rows of no prompt
        counts = np.stack([np.bincount(rt[r].ravel(), minlength=n + 1)[:n] for r in rows]).astype(np.float64)
        mix = counts / np.maximum(counts.sum(1, keepdims=True), 1.0)
        return DriftWorkload(schedule, period, pool, ev.topk_ids[rows], mix, topics, tuple(range(n)))
    hist_topics, batch_topic = _plan(topics, schedule, iters, period)
    rng = np.random.default_rng(seed)
    batches = np.empty((iters, R, T, topics.eval.top_k), dtype=np.int32)
    for i, t in enumerate(batch_topic):  # per batch, vectorised over its R * T rows
        idx = topics.rows_of([t])
        batches[i] = topics.eval.topk_ids[idx[rng.integers(0, idx.size, size=(R, T))]]
    mix = np.zeros((iters, n))
    mix[np.arange(iters), batch_topic] = 1.0
    return DriftWorkload(schedule, period, topics.window("pool", hist_topics), batches, mix, topics, hist_topics)
