"""Topics: groups of prompts with similar expert usage, the units demand drifts between.

The recorded traces (``../shared/traces/<model>/{pool,eval}.txt``) hold the decode tokens of
each prompt in prompt order, 32 rows per prompt and window (``pool`` = decode steps [32, 64),
``eval`` = [64, 96) of the same prompts). A *prompt* here is a block of ``rows_per_prompt``
consecutive rows; K2's windows hold 15,264 rows = 477 blocks where the manifest counts 479
prompts, so 64 rows are missing somewhere and the blocks after them may straddle two prompts.

:func:`find_topics` groups the prompts by k-means on their expert histograms (both windows
together: a topic is what a prompt asks for over all its recorded steps). Each prompt's
histogram is normalised and square-rooted (the Hellinger embedding, in which Euclidean
distance compares distributions); k-means++ seeding, Lloyd iterations, ``restarts`` seeded
runs, the lowest inertia kept; topics are numbered by size (largest first, ties by first
prompt). ``DEFAULT_TOPICS = 4``: on both recorded models the silhouette is low for every k
from 2 to 10 (0.03-0.06 K2, 0.07-0.21 Qwen3), so the data names no natural count; 4 is the
smallest number the schedules need (``rotating`` plans from two topics and drifts through two
others; ``unseen`` leaves one out and keeps three) while every topic keeps 50+ prompts.

Built-in synthetic traces have no prompts: :func:`synthetic_topics` draws prompt-structured
windows from the same fitted generator (every row of a prompt from one latent token type,
:func:`zepp.traces.synthetic.synthetic_prompts`) and groups them the same way, so every
model preset can drift. The stationary benchmark keeps its own synthetic windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.trace import Trace

__all__ = ["Topics", "find_topics", "synthetic_topics", "model_topics", "DEFAULT_TOPICS", "ROWS_PER_PROMPT",
           "kmeans", "topic_statistics"]

ROWS_PER_PROMPT = 32  # decode steps per prompt and window in ../shared/traces
DEFAULT_TOPICS = 4
TOPIC_SEED = 0  # topics are a property of the data: the benchmark's --seed does not move them
HOT_FRACTION = 0.1  # a topic's hot set: its most loaded 10% of experts


@dataclass(frozen=True)
class Topics:
    """Prompts grouped into topics.

    ``pool`` / ``eval``: the two windows (``[P * rows_per_prompt, k]`` rows used, prompt
    order); ``prompt_topic [P]`` int64 topic of each prompt; ``names`` one per topic
    (``t0``, ``t1``, ...: ``t0`` the largest); ``stats``: :func:`topic_statistics`.
    """

    pool: Trace
    eval: Trace
    prompt_topic: np.ndarray
    rows_per_prompt: int
    names: tuple[str, ...]
    source: str
    stats: dict = field(default_factory=dict, compare=False)

    @property
    def count(self) -> int:
        return len(self.names)

    def row_topic(self) -> np.ndarray:
        """``[P * rows_per_prompt]`` topic of each row (same in both windows)."""
        return np.repeat(self.prompt_topic, self.rows_per_prompt)

    def rows_of(self, topics) -> np.ndarray:
        """Row indices (either window) of the prompts of ``topics`` (ids), ascending."""
        return np.flatnonzero(np.isin(self.row_topic(), np.asarray(list(topics), dtype=np.int64)))

    def window(self, name: str, topics=None) -> Trace:
        """Window ``pool`` or ``eval`` restricted to the rows of ``topics`` (default: all)."""
        t = self.pool if name == "pool" else self.eval
        if topics is None:
            return t
        ids = [int(x) for x in topics]
        tag = "+".join(self.names[i] for i in ids)
        return Trace(t.topk_ids[self.rows_of(ids)], t.num_experts, f"{t.source}[topics {tag}]")


def prompt_histograms(trace: Trace, rows_per_prompt: int) -> np.ndarray:
    """``[P, E]`` int64 entries per prompt and expert (``P = len(trace) // rows_per_prompt``)."""
    p = len(trace) // rows_per_prompt
    e = trace.num_experts
    ids = trace.topk_ids[:p * rows_per_prompt].reshape(p, -1)
    key = np.arange(p, dtype=np.int64)[:, None] * e + ids
    return np.bincount(key.ravel(), minlength=p * e).reshape(p, e).astype(np.int64)


def _sq_dist(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``[n, k]`` squared Euclidean distances of rows ``x [n, d]`` to centres ``c [k, d]``."""
    d = (x * x).sum(1)[:, None] - 2.0 * x @ c.T + (c * c).sum(1)[None, :]
    return np.maximum(d, 0.0)


def _lloyd(x: np.ndarray, k: int, rng, iters: int) -> tuple[float, np.ndarray]:
    """One k-means++-seeded Lloyd run: ``(inertia, labels [n])``."""
    n = x.shape[0]
    centres = [x[rng.integers(n)]]
    for _ in range(1, k):  # k-means++: next centre drawn in proportion to squared distance
        d = _sq_dist(x, np.asarray(centres)).min(1)
        centres.append(x[rng.choice(n, p=d / d.sum())] if d.sum() > 0 else x[rng.integers(n)])
    c = np.asarray(centres)
    labels = np.full(n, -1)
    for _ in range(iters):
        new = _sq_dist(x, c).argmin(1)
        if np.array_equal(new, labels):
            break
        labels = new
        counts = np.bincount(labels, minlength=k)
        sums = np.zeros_like(c)
        np.add.at(sums, labels, x)
        c = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], c)
    return float(_sq_dist(x, c)[np.arange(n), labels].sum()), labels


def kmeans(x: np.ndarray, k: int, seed: int = TOPIC_SEED, restarts: int = 8, iters: int = 200) -> np.ndarray:
    """``[n]`` labels of rows ``x [n, d]`` into ``k`` groups: the lowest-inertia of ``restarts``
    seeded k-means++ / Lloyd runs, relabelled by group size (largest 0, ties by first row)."""
    if not 1 <= k <= x.shape[0]:
        raise ZeppInputError(f"topics: cannot make {k} topics of {x.shape[0]} prompts; choose 1..{x.shape[0]}")
    best = min((_lloyd(x, k, np.random.default_rng([seed, r]), iters) for r in range(restarts)), key=lambda t: t[0])
    labels = best[1]
    first = np.full(k, x.shape[0])
    np.minimum.at(first, labels, np.arange(x.shape[0]))
    order = np.lexsort((first, -np.bincount(labels, minlength=k)))
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k)
    return rank[labels]


def find_topics(pool: Trace, eval_: Trace, n_topics: int = DEFAULT_TOPICS, rows_per_prompt: int = ROWS_PER_PROMPT,
                seed: int = TOPIC_SEED) -> Topics:
    """Group the prompts of two prompt-ordered windows into ``n_topics`` topics (module doc)."""
    if pool.num_experts != eval_.num_experts:
        raise ZeppInputError(f"{pool.source} has {pool.num_experts} experts, {eval_.source} {eval_.num_experts}; "
                             f"topics need the two windows of one model")
    p = min(len(pool), len(eval_)) // rows_per_prompt
    if p < n_topics:
        raise ZeppInputError(f"{pool.source}: {p} prompts of {rows_per_prompt} rows cannot make {n_topics} topics")
    n = p * rows_per_prompt
    pool = Trace(pool.topk_ids[:n], pool.num_experts, pool.source)
    eval_ = Trace(eval_.topk_ids[:n], eval_.num_experts, eval_.source)
    h = (prompt_histograms(pool, rows_per_prompt) + prompt_histograms(eval_, rows_per_prompt)).astype(np.float64)
    x = np.sqrt(h / np.maximum(h.sum(1, keepdims=True), 1.0))
    labels = kmeans(x, n_topics, seed)
    names = tuple(f"t{i}" for i in range(n_topics))
    t = Topics(pool, eval_, labels, rows_per_prompt, names, f"{pool.source} ({n_topics} topics)")
    object.__setattr__(t, "stats", topic_statistics(t))
    return t


def topic_statistics(t: Topics, top: int = 8) -> dict:
    """How different the topics are (plain numbers, JSON-ready).

    Per topic: ``prompts``, ``hottest`` (the ``top`` most loaded experts and their share of the
    topic's entries, both windows), ``max_over_mean`` (busiest expert's load / mean expert load,
    eval window), ``tv_pool_eval`` (total variation between the topic's pool and eval
    popularity). Across topics: ``hot_overlap [n, n]`` (Jaccard overlap of the hot sets, the
    top ``HOT_FRACTION`` of experts) and ``tv [n, n]`` (total variation between topics'
    eval popularity).
    """
    e = t.pool.num_experts
    rt = t.row_topic()
    n = t.count
    loads = np.zeros((2, n, e), dtype=np.int64)
    for w, tr in enumerate((t.pool, t.eval)):
        key = rt[:, None] * e + tr.topk_ids
        loads[w] = np.bincount(key.ravel(), minlength=n * e).reshape(n, e)
    share = loads / np.maximum(loads.sum(2, keepdims=True), 1)
    both = loads.sum(0)
    n_hot = max(1, int(round(HOT_FRACTION * e)))
    hot = np.zeros((n, e), dtype=bool)
    hot[np.arange(n)[:, None], np.argsort(-both, axis=1, kind="stable")[:, :n_hot]] = True
    inter = (hot[:, None] & hot[None]).sum(2)
    union = (hot[:, None] | hot[None]).sum(2)
    tv = 0.5 * np.abs(share[1][:, None] - share[1][None]).sum(2)
    per = []
    for i in range(n):
        order = np.argsort(-both[i], kind="stable")[:top]
        per.append(dict(name=t.names[i], prompts=int((t.prompt_topic == i).sum()),
                        hottest=[[int(x), round(float(both[i, x] / max(both[i].sum(), 1)), 4)] for x in order
                                 if both[i, x] > 0],
                        max_over_mean=round(float(loads[1, i].max() / max(loads[1, i].mean(), 1e-12)), 3),
                        tv_pool_eval=round(float(0.5 * np.abs(share[0, i] - share[1, i]).sum()), 4)))
    return dict(topics=per, hot_set_size=n_hot, hot_overlap=np.round(inter / np.maximum(union, 1), 3).tolist(),
                tv=np.round(tv, 4).tolist())


def format_statistics(t: Topics) -> str:
    """The statistics as text: one line per topic, then the overlap of hot sets."""
    s = t.stats or topic_statistics(t)
    lines = [f"{t.source}: {t.count} topics of {len(t.prompt_topic)} prompts"]
    for d in s["topics"]:
        hot = " ".join(f"{x}:{p:.1%}" for x, p in d["hottest"][:5])
        lines.append(f"  {d['name']}: {d['prompts']} prompts, eval load max/mean {d['max_over_mean']:.2f}, "
                     f"pool->eval TV {d['tv_pool_eval']:.3f}, hottest {hot}")
    lines.append(f"  hot-set overlap (Jaccard, top {s['hot_set_size']} experts): {s['hot_overlap']}")
    lines.append(f"  eval popularity TV between topics: {s['tv']}")
    return "\n".join(lines)


def synthetic_topics(model_name: str, seed: int = 0, n_topics: int = DEFAULT_TOPICS, profile: str | None = None) -> Topics:
    """Topics of a preset's built-in generator: prompt-structured windows
    (:func:`zepp.traces.synthetic.synthetic_prompts`) grouped by :func:`find_topics`."""
    from zepp.traces.synthetic import synthetic_prompts

    pool, ev = synthetic_prompts(model_name, seed=seed, rows_per_prompt=ROWS_PER_PROMPT, profile=profile)
    return find_topics(pool, ev, n_topics)


def model_topics(model_name: str, traces_dir: str | None, seed: int = 0, n_topics: int = DEFAULT_TOPICS) -> Topics:
    """The topics of ``model_name``: from ``traces_dir/<model>/`` when given, else built-in."""
    if traces_dir:
        from zepp.traces.formats import load_model_traces

        return find_topics(*load_model_traces(traces_dir, model_name), n_topics)
    return synthetic_topics(model_name, seed, n_topics)
