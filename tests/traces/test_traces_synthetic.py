"""Built-in synthetic traces: shape, determinism, the fit, and agreement with the real traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zepp.errors import ZeppInputError
from zepp.model import PRESET_NAMES, model_preset
from zepp.traces import Trace, load_model_traces
from zepp.traces.synthetic import (
    PROFILES, SynthParams, default_profile, load_params, sample_window, synthetic_history, synthetic_traces,
)
from zepp.traces.synthetic_fit import fit_synth
from zepp.traces.trace_stats import distinct_nodes, merge_saving, pair_concentration, popularity_tv, trace_statistics

from shared_traces import TRACES, needs_traces  # noqa: E402

REAL_ROWS = {"k2": 15264, "qwen": 15328}  # rows per window of ../shared/traces (its manifest.json)


@pytest.fixture(scope="module")
def synth():
    return {m: synthetic_traces(m, seed=0) for m in REAL_ROWS}


@pytest.fixture(scope="module")
def real():
    return {m: load_model_traces(TRACES, m) for m in REAL_ROWS}


def test_shipped_generators_shapes(synth):
    for model, (pool, ev) in synth.items():
        spec = model_preset(model)
        assert len(pool) == len(ev) == REAL_ROWS[model]
        for t in (pool, ev):
            assert t.num_experts == spec.num_experts and t.top_k == spec.top_k
            assert t.topk_ids.dtype == np.int32 and t.topk_ids.min() >= 0 and t.topk_ids.max() < spec.num_experts
            assert np.all(np.diff(t.topk_ids, axis=1) > 0)  # k distinct experts, sorted
            assert t.source.startswith(f"synthetic:{model}/")
        p = load_params(model)
        assert p.count() < 12 * spec.num_experts  # small: types x E + tilts + kernel


def test_seeded(synth):
    pool, ev = synthetic_traces("qwen", seed=0)
    assert np.array_equal(pool.topk_ids, synth["qwen"][0].topk_ids)
    assert np.array_equal(ev.topk_ids, synth["qwen"][1].topk_ids)
    other, _ = synthetic_traces("qwen", seed=1)
    assert not np.array_equal(other.topk_ids, pool.topk_ids)
    assert not np.array_equal(pool.topk_ids, ev.topk_ids)


def test_unknown_model_and_bad_file(tmp_path):
    with pytest.raises(ZeppInputError, match="unknown model preset 'gpt'"):
        synthetic_traces("gpt")
    with pytest.raises(ZeppInputError, match="unknown skew profile 'olmoe'; choose one of k2, qwen"):
        synthetic_traces("mixtral", profile="olmoe")
    with pytest.raises(ZeppInputError, match="no fitted skew profile 'mixtral'"):
        load_params("mixtral")
    (tmp_path / "p.json").write_text(json.dumps({"model": "x"}))
    with pytest.raises(ZeppInputError, match="not a synthetic-trace parameter file"):
        load_params("x", tmp_path / "p.json")


def _toy_params() -> SynthParams:
    """A known generator: 48 experts, top-4, two token types, neighbours repel."""
    rng = np.random.default_rng(3)
    e = 48
    logits = rng.normal(0, 1.0, size=(2, e))
    logits[0, :8] += 2.0  # type 0 favours experts 0..7, type 1 experts 40..47
    logits[1, 40:] += 2.0
    kernel = np.zeros(7)
    kernel[1:] = [-1.0, -0.7, -0.4, -0.2, -0.1, 0.0]
    return SynthParams("toy", e, 4, logits, np.array([[0.6, 0.4], [0.3, 0.7]]),
                       np.stack([np.zeros(e), rng.normal(0, 0.5, e)]), kernel, (6000, 6000))


def test_fit_recovers_a_known_generator():
    truth = _toy_params()
    pool, ev = synthetic_traces("toy", seed=0, params=truth)
    fit = fit_synth(pool, ev, types=2, kernel_range=6, em_iters=40, scale_iters=20, seed=0, model="toy")
    # popularity per window is matched by construction (up to Monte Carlo error)
    fp, fe = synthetic_traces("toy", seed=5, params=fit)
    assert popularity_tv(pool, fp) < 0.05 and popularity_tv(ev, fe) < 0.05
    # the repulsion of neighbours is recovered: pairs at distance 1 are rarer than at 6
    assert fit.kernel[1] < -0.5 and abs(fit.kernel[6]) < 0.25
    assert fit.kernel[1] == pytest.approx(truth.kernel[1], abs=0.3)
    # the drift between windows carries over
    assert popularity_tv(fp, fe) == pytest.approx(popularity_tv(pool, ev), abs=0.03)
    # the two types are found: the window mixing weights come back in order
    order = np.argsort(-fit.logits[:, :8].sum(1))  # the type favouring 0..7 first
    assert fit.weights[0, order[0]] == pytest.approx(0.6, abs=0.1)
    assert fit.weights[1, order[0]] == pytest.approx(0.3, abs=0.1)


def test_statistics_on_hand_examples():
    ids = np.array([[0, 1, 4, 5], [0, 2, 6, 7]])  # E = 8, N = 2: nodes {0, 1} and {0, 1}
    assert distinct_nodes(ids, 8, 2) == 2.0 and distinct_nodes(ids, 8, 4) == 2.5  # {0, 2} and {0, 1, 3}
    # 2 ranks x 1 GPU per node: rank 0 on node 0, rank 1 on node 1
    batch = np.array([[[0, 1, 4, 5]], [[0, 2, 6, 7]]])
    # rank 0: remote entries 4, 5 -> 1 merged row; rank 1: remote 0, 2 -> 1 row: 1 - 2/4
    assert merge_saving(batch, 8, 2, gpus_per_node=1) == 0.5
    a, b = Trace(np.array([[0, 1]]), 4), Trace(np.array([[2, 3]]), 4)
    assert popularity_tv(a, b) == 1.0 and popularity_tv(a, a) == 0.0
    assert pair_concentration(np.array([[0, 1], [0, 1], [2, 3]]), 4, top=1 / 6) == pytest.approx(2 / 3)


# Agreement with the real traces. Tolerances: popularity is fitted, so skew and drift differ
# only by sampling noise plus one effect we accept: each synthetic window is a fresh sample
# of a distribution whose popularity equals the real window's, so the pool-eval distance
# gains that sampling noise (about +0.01 TV). Distinct nodes and merge savings come from the
# co-selection model (types + id-distance kernel) and are predictions, not fitted targets.
TOLERANCE = {  # statistic prefix -> (relative tolerance, absolute tolerance)
    "skew": (0.05, 0.0),
    "gpu_skew": (0.05, 0.0),
    "nodes": (0.015, 0.0),
    "merge": (0.0, 0.012),
    "drift_tv": (0.0, 0.02),
    "pairs_top1pct": (0.25, 0.0),
}
BUDGET_TOKENS = {"k2": 1168, "qwen": 2048}  # 16 MB per GPU


@needs_traces
@pytest.mark.parametrize("model", sorted(REAL_ROWS))
def test_synthetic_agrees_with_real(model, synth, real):
    r = trace_statistics(*real[model], BUDGET_TOKENS[model], iters=2)
    s = trace_statistics(*synth[model], BUDGET_TOKENS[model], iters=2)
    failures = []
    for key, rv in r.items():
        rel, ab = TOLERANCE[key.split("@")[0]]
        if abs(s[key] - rv) > max(rel * abs(rv), ab):
            failures.append(f"{key}: real {rv:.4f} synthetic {s[key]:.4f}")
    assert not failures, f"{model}: " + "; ".join(failures)


@needs_traces
def test_independent_experts_would_fail_the_check(real):
    """The co-selection model matters: drawing experts independently by popularity alone
    (types = 1, no kernel) misses distinct nodes per token by more than the tolerance."""
    pool, ev = real["k2"]
    p = load_params("k2")
    flat = SynthParams("k2", p.num_experts, p.top_k, np.zeros((1, p.num_experts)), np.ones((2, 1)),
                       np.log(np.maximum(np.stack([pool.expert_load(), ev.expert_load()]), 1e-12)),
                       np.zeros(1), p.rows)
    ids = sample_window(flat, "eval", len(ev), seed=0)
    gaps = [abs(distinct_nodes(ids, 384, n) / distinct_nodes(ev.topk_ids, 384, n) - 1) for n in (8, 16)]
    assert max(gaps) > TOLERANCE["nodes"][0]


@pytest.mark.parametrize("model", PRESET_NAMES)
def test_every_preset_has_builtin_traces(model):
    """Every preset gets traces of its own shape, named after the profile they come from, skewed
    (hot experts well above the mean), with distinct ids per token."""
    spec = model_preset(model)
    pool, ev = synthetic_traces(model, seed=0)
    prof = default_profile(model)
    assert prof == (model if model in PROFILES else ("k2" if spec.num_experts > 128 else "qwen"))
    for t in (pool, ev):
        assert t.topk_ids.shape[1] == spec.top_k and t.num_experts == spec.num_experts
        assert (model == prof) == ("profile=" not in t.source) and (model == prof or f"profile={prof}" in t.source)
        s = np.sort(t.topk_ids, axis=1)
        assert not (s[:, 1:] == s[:, :-1]).any()
        load = t.expert_load()
        assert load.max() > 1.5 * load.mean()
    other, _ = synthetic_traces(model, seed=0, profile="k2" if prof == "qwen" else "qwen")
    assert not np.array_equal(other.topk_ids, pool.topk_ids)


def test_shipped_profiles_unchanged_by_adaptation():
    """k2 and qwen draw from their own fit, exactly as before the profiles existed."""
    for m in PROFILES:
        p = load_params(m)
        pool, _ = synthetic_traces(m, seed=3)
        assert np.array_equal(pool.topk_ids, sample_window(p, "pool", p.rows[0], seed=[3, 0]))


def test_synthetic_history_layers_differ():
    h = synthetic_history("deepseek-v3", seed=0)
    spec = model_preset("deepseek-v3")
    assert h.layers == spec.moe_layers and h.form == "tokens"
    hot = [int(np.argmax(t.expert_load())) for t in h.tokens]
    assert len(set(hot)) > len(hot) // 2  # hot experts move between layers
