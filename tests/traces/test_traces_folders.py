"""Recorded trace folders (``<dir>/<model>/{pool,eval}.txt``, the layout of ../shared/traces):
every preset's folder found, the recorded traces read as they are, and every missing piece named."""

from __future__ import annotations

import numpy as np
import pytest

from zepp.errors import ZeppInputError
from zepp.model import model_preset
from zepp.traces import load_model_traces, read_trace


def test_real_traces_load(traces_dir):
    for model, rows, experts in (("k2", 15264, 384), ("qwen", 15328, 128)):
        pool, ev = load_model_traces(traces_dir, model)
        assert len(pool) == len(ev) == rows
        assert pool.top_k == ev.top_k == 8 and pool.num_experts == experts
        assert pool.topk_ids.min() >= 0 and pool.topk_ids.max() < experts
        # a token never picks one expert twice
        s = np.sort(ev.topk_ids, axis=1)
        assert not np.any(s[:, 1:] == s[:, :-1])
        assert np.array_equal(ev.topk_ids, np.loadtxt(ev.source, dtype=np.int64))


def test_real_trace_with_wrong_model_shapes(traces_dir):
    with pytest.raises(ZeppInputError, match="out of range .*--experts"):
        read_trace(traces_dir / "k2" / "pool.txt", num_experts=128)
    with pytest.raises(ZeppInputError, match="top-6"):
        read_trace(traces_dir / "k2" / "pool.txt", top_k=6)


def test_load_model_traces_errors(tmp_path):
    with pytest.raises(ZeppInputError, match=r"no folder for model 'mixtral': looked for .*mixtral/ holding pool.txt"):
        load_model_traces(tmp_path, "mixtral")
    with pytest.raises(ZeppInputError, match=r"looked for .*/qwen/ and .*/qwen3/"):
        load_model_traces(tmp_path, "qwen")
    with pytest.raises(ZeppInputError, match="does not exist"):
        load_model_traces(tmp_path / "missing", "k2")
    (tmp_path / "k2").mkdir()
    (tmp_path / "k2" / "pool.txt").write_text("0 1 2 3 4 5 6 7\n")
    with pytest.raises(ZeppInputError, match="eval.txt: missing"):
        load_model_traces(tmp_path, "k2")
    with pytest.raises(ZeppInputError, match="unknown model preset"):
        load_model_traces(tmp_path, "gpt")


@pytest.mark.parametrize("model", ["deepseek-v3", "mixtral", "qwen"])
def test_load_model_traces_any_preset(tmp_path, model):
    spec = model_preset(model)
    rng = np.random.default_rng(0)
    sub = tmp_path / ("qwen3" if model == "qwen" else model)
    sub.mkdir()
    for w in ("pool", "eval"):
        ids = np.argsort(rng.random((50, spec.num_experts)), axis=1)[:, :spec.top_k]
        (sub / f"{w}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
    pool, ev = load_model_traces(tmp_path, model)
    assert pool.num_experts == spec.num_experts and ev.top_k == spec.top_k
