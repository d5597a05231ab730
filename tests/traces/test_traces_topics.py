"""Topics (k-means on per-prompt expert histograms) and the drift schedules built on them."""

from __future__ import annotations

import numpy as np
import pytest

from zepp.errors import ZeppInputError
from zepp.traces import Trace, sample_batches
from zepp.traces.schedules import SCHEDULES, check_schedule, drift_workload, unseen_topic
from zepp.traces.topics import find_topics, kmeans, model_topics, synthetic_topics


def _planted(groups=(6, 4, 3), experts_per_group=4, k=2, rows=32, seed=0):
    """Prompts of ``rows`` rows; prompt group g picks its top-k among experts of block g only."""
    rng = np.random.default_rng(seed)
    e = experts_per_group * len(groups)
    label = np.repeat(np.arange(len(groups)), groups)
    rng.shuffle(label)
    def window():
        ids = np.stack([rng.permuted(np.tile(np.arange(experts_per_group), (rows, 1)), axis=1)[:, :k]
                        + g * experts_per_group for g in label])
        return Trace(ids.reshape(-1, k), e, "planted")
    return window(), window(), label


def test_kmeans_recovers_separated_groups_sorted_by_size():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    sizes = np.array([5, 20, 9])
    x = np.concatenate([c + rng.normal(0, 0.3, (n, 2)) for c, n in zip(centres, sizes)])
    lab = kmeans(x, 3)
    assert np.array_equal(lab, kmeans(x, 3))  # seeded
    assert np.array_equal(np.bincount(lab), [20, 9, 5])  # topic 0 the largest
    truth = np.repeat([2, 0, 1], sizes)
    assert np.array_equal(lab, truth)
    with pytest.raises(ZeppInputError, match="cannot make 40 topics"):
        kmeans(x, 40)


def test_find_topics_groups_planted_prompts_and_reports_disjoint_hot_sets():
    pool, ev, label = _planted()
    t = find_topics(pool, ev, 3)
    # the planted groups (sizes 6, 4, 3) are the topics t0, t1, t2
    assert np.array_equal(t.prompt_topic, label)
    s = t.stats
    assert [d["prompts"] for d in s["topics"]] == [6, 4, 3]
    assert s["hot_overlap"][0][1] == 0.0 and s["hot_overlap"][1][1] == 1.0
    assert s["tv"][0][2] == 1.0  # disjoint experts: popularity totally different
    for i, d in enumerate(s["topics"]):
        assert len(d["hottest"]) == 4 and all(i * 4 <= x < (i + 1) * 4 for x, _ in d["hottest"])
    rows = t.rows_of([1])
    assert rows.size == 4 * 32 and np.all(t.eval.topk_ids[rows] // 4 == 1)


def test_stationary_is_todays_sampling():
    pool, ev, _ = _planted()
    w = drift_workload((pool, ev), "stationary", ranks=3, tokens_per_rank=5, iters=4, seed=7)
    assert np.array_equal(w.batches, sample_batches(ev, 3, 5, 4, 7))
    assert w.history is pool
    assert np.allclose(w.topic_mix.sum(1), 1.0)
    # the mix is measured on the rows drawn: a row's expert block names its planted group, and
    # each of the 4 default topics lies inside one group (one group is split in two)
    t = w.topics
    group_of_topic = [np.unique(t.eval.topk_ids[t.rows_of([i])] // 4) for i in range(t.count)]
    assert all(g.size == 1 for g in group_of_topic)
    blocks = np.stack([np.bincount((b[..., 0] // 4).ravel(), minlength=3) for b in w.batches]) / 15
    by_group = np.zeros((4, 3))
    for i, g in enumerate(group_of_topic):
        by_group[:, g[0]] += w.topic_mix[:, i]
    assert np.allclose(by_group, blocks)


@pytest.mark.parametrize("schedule", ["in-history", "rotating", "unseen"])
def test_topic_schedules_draw_each_batch_from_its_topic(schedule):
    pool, ev, _ = _planted(groups=(5, 5, 4, 4))
    t = find_topics(pool, ev, 4)
    w = drift_workload(t, schedule, ranks=2, tokens_per_rank=6, iters=10, seed=3, period=2)
    assert w.batches.shape == (10, 2, 6, 2) and w.batches.dtype == np.int32
    topic = w.topic_mix.argmax(1)
    assert np.all(w.topic_mix.max(1) == 1.0)
    for i in range(10):  # every row of batch i belongs to its topic's expert block
        assert np.all(w.batches[i] // 4 == topic[i])
    hist_blocks = set(np.unique(w.history.topk_ids // 4).tolist())
    assert hist_blocks == set(w.history_topics)
    if schedule == "in-history":
        assert topic.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0] and w.history_topics == (0, 1, 2, 3)
    elif schedule == "rotating":
        assert w.history_topics == (0, 1) and topic.tolist() == [2, 2, 3, 3, 2, 2, 3, 3, 2, 2]
    else:
        u = unseen_topic(t)
        assert set(topic.tolist()) == {u} and u not in w.history_topics and len(w.history_topics) == 3
    assert "history" in w.describe() and len(w.report()["topic_mix"]) == 10
    assert np.array_equal(w.batches, drift_workload(t, schedule, 2, 6, 10, 3, period=2).batches)


def test_schedule_names_and_bad_arguments():
    assert list(SCHEDULES)[0] == "stationary" and {"in-history", "rotating", "unseen"} <= set(SCHEDULES)
    with pytest.raises(ZeppInputError, match=r"--schedule 'drift': unknown schedule; choose from stationary"):
        check_schedule("drift")
    pool, ev, _ = _planted()
    with pytest.raises(ZeppInputError, match="period must be a positive integer"):
        drift_workload((pool, ev), "rotating", 2, 4, 3, 0, period=0)


def test_synthetic_presets_have_topics():
    t = synthetic_topics("qwen3-30b", seed=0)
    assert t.count == 4 and all(d["prompts"] >= 20 for d in t.stats["topics"])
    assert np.array_equal(t.prompt_topic, synthetic_topics("qwen3-30b", seed=0).prompt_topic)
    w = drift_workload(t, "rotating", ranks=8, tokens_per_rank=16, iters=4, seed=0)
    assert w.batches.shape == (4, 8, 16, t.eval.top_k) and w.batches.max() < t.eval.num_experts


def _tv(a: np.ndarray, b: np.ndarray, e: int) -> float:
    p = np.bincount(a.ravel(), minlength=e) / a.size
    q = np.bincount(b.ravel(), minlength=e) / b.size
    return 0.5 * float(np.abs(p - q).sum())


def test_real_traces_drift_away_from_their_history(traces_dir):
    """On the recorded K2 traces, rotating batches are farther from their history than
    in-history batches are from theirs (the schedules drift as named)."""
    t = model_topics("k2", str(traces_dir))
    assert len(t.prompt_topic) == 477 and all(d["prompts"] >= 50 for d in t.stats["topics"])
    e = t.pool.num_experts
    far = {}
    for s in ("in-history", "rotating", "unseen"):
        w = drift_workload(t, s, ranks=16, tokens_per_rank=296, iters=8, seed=0, period=4)
        far[s] = np.mean([_tv(b, w.history.topk_ids, e) for b in w.batches])
    assert far["rotating"] > far["in-history"] and far["unseen"] > far["in-history"]
