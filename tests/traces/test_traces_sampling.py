"""Trace readers, sampler and demand histograms; every bad input ends in one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zepp.errors import ZeppInputError
from zepp.traces import (
    Trace, load_model_traces, node_demand, rank_demand, read_load_histogram, read_trace, sample_batches,
)

from shared_traces import TRACES, needs_traces  # noqa: E402


def write(tmp_path: Path, text: str, name: str = "t.txt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- text format


def test_text_round_trip(tmp_path):
    p = write(tmp_path, "0 1 2\n3 4 5\r\n\n  6\t7 8  \n")
    t = read_trace(p, num_experts=9, top_k=3)
    assert t.topk_ids.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert t.topk_ids.dtype == np.int32 and t.top_k == 3 and len(t) == 3 and t.num_experts == 9
    assert t.source == str(p)


def test_text_infers_experts_and_k(tmp_path):
    t = read_trace(write(tmp_path, "5 1\n2 3"))  # no trailing newline
    assert t.topk_ids.tolist() == [[5, 1], [2, 3]] and t.num_experts == 6 and t.top_k == 2


def test_text_matches_loadtxt_on_random_file(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, size=(500, 8))
    p = tmp_path / "r.txt"
    np.savetxt(p, ids, fmt="%d")
    assert np.array_equal(read_trace(p, num_experts=1000, top_k=8, allow_duplicates=True).topk_ids, ids)


@pytest.mark.parametrize(
    "text, kwargs, needles",
    [
        ("0 1 2\n3 4 500\n", dict(num_experts=384), ["line 2", "500", "[0, 384)", "--experts"]),
        ("0 1 2\n3 4\n5 6 7\n", {}, ["line 2", "has 2 expert ids", "expected 3", "ragged"]),
        ("0 1 2\n\n3 4 5 6\n", {}, ["line 3", "has 4 expert ids", "expected 3"]),
        ("0 1 2\n3 4 5\n", dict(top_k=8), ["3 expert ids", "top-8", "--topk 3"]),
        ("", {}, ["empty"]),
        ("\n \n\n", {}, ["no expert ids"]),
        ("0 1 2\n3 x 5\n", {}, ["line 2", "'x'", "not an integer"]),
        ("0 1 2\n3 4.0 5\n", {}, ["line 2", "'4.0'", "not an integer"]),
        ("0 1 2\n3 - 5\n", {}, ["line 2", "'-'", "not an integer"]),
        ("0 1 2\n3 -4 5\n", dict(num_experts=8), ["line 2", "negative expert id -4"]),
        ("0 1 2\n3 -4 5\n", {}, ["line 2", "negative expert id -4"]),
        ("0 1 2\n3 4 99999999999999\n", dict(num_experts=8), ["line 2", "99999999999999", "out of range"]),
    ],
)
def test_bad_text_inputs(tmp_path, text, kwargs, needles):
    p = write(tmp_path, text)
    with pytest.raises(ZeppInputError) as exc:
        read_trace(p, **kwargs)
    msg = str(exc.value)
    assert str(p) in msg or "empty" in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_ragged_row_with_wrong_k_everywhere_else(tmp_path):
    with pytest.raises(ZeppInputError, match=r"line 1 has 3 expert ids, expected 8 \(top-8\)"):
        read_trace(write(tmp_path, "0 1 2\n3 4\n"), top_k=8)


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(ZeppInputError, match="does not exist"):
        read_trace(tmp_path / "nope.txt")
    with pytest.raises(ZeppInputError, match="unknown trace format"):
        read_trace(write(tmp_path, "1 2\n", "t.csv"))
    with pytest.raises(ZeppInputError, match="directory"):
        read_trace(tmp_path)


# ---------------------------------------------------------------- npz and SGLang


def test_npz_named_and_single_array(tmp_path):
    ids = np.array([[0, 3], [2, 1]], dtype=np.int64)
    w = np.array([[0.7, 0.3], [0.5, 0.5]], dtype=np.float32)
    np.savez(tmp_path / "a.npz", topk_ids=ids, topk_weights=w, other=np.zeros(3))
    t = read_trace(tmp_path / "a.npz", num_experts=4, top_k=2)
    assert t.topk_ids.tolist() == ids.tolist() and np.allclose(t.topk_weights, w)
    np.savez(tmp_path / "b.npz", ids)
    assert read_trace(tmp_path / "b.npz").topk_ids.tolist() == ids.tolist()


def test_npz_bad_inputs(tmp_path):
    np.savez(tmp_path / "r.npz", topk_ids=np.array([[0, 1], [2, 9]]))
    with pytest.raises(ZeppInputError, match=r"row \(0-based\) 1: expert id 9 .*\[0, 4\)"):
        read_trace(tmp_path / "r.npz", num_experts=4)
    np.savez(tmp_path / "m.npz", x=np.zeros((2, 2), int), y=np.zeros((2, 2), int))
    with pytest.raises(ZeppInputError, match="no array named 'topk_ids'"):
        read_trace(tmp_path / "m.npz")
    np.savez(tmp_path / "e.npz", topk_ids=np.zeros((0, 8), int))
    with pytest.raises(ZeppInputError, match="empty"):
        read_trace(tmp_path / "e.npz")
    np.savez(tmp_path / "f.npz", topk_ids=np.array([[0.5, 1.0]]))
    with pytest.raises(ZeppInputError, match=r"must be integers, found .*0\.5.*refused rather than truncated"):
        read_trace(tmp_path / "f.npz")
    np.savez(tmp_path / "k.npz", topk_ids=np.zeros((3, 6), int))
    with pytest.raises(ZeppInputError, match="top-8"):
        read_trace(tmp_path / "k.npz", top_k=8)


def test_sglang_per_token_dump(tmp_path):
    torch = pytest.importorskip("torch")
    layer0 = torch.tensor([[1, 2], [3, 4], [-1, -1]])  # last row: SGLang padding, dropped
    layer1 = torch.tensor([[5, 6], [7, 0], [1, 3]])
    rec = {"forward_pass_id": 0, "rank": 0, "topk_ids_of_layer": torch.stack([layer0, layer1])}
    rec2 = {"forward_pass_id": 1, "rank": 0, "topk_ids_of_layer": torch.stack([layer1, layer0])}
    torch.save({"records": [rec, rec2]}, tmp_path / "d.pt")
    t = read_trace(tmp_path / "d.pt", num_experts=8, top_k=2)
    assert t.topk_ids.tolist() == [[1, 2], [3, 4], [5, 6], [7, 0], [1, 3]]
    t1 = read_trace(tmp_path / "d.pt", num_experts=8, top_k=2, layer=1)
    assert t1.topk_ids.tolist() == [[5, 6], [7, 0], [1, 3], [1, 2], [3, 4]]
    with pytest.raises(ZeppInputError, match="layer=5 is out of range"):
        read_trace(tmp_path / "d.pt", layer=5)
    torch.save({"logical_count": torch.zeros(2, 3)}, tmp_path / "s.pt")
    with pytest.raises(ZeppInputError, match="per_token"):
        read_trace(tmp_path / "s.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(ZeppInputError, match="cannot read"):
        read_trace(tmp_path / "bad.pt")


def test_load_histogram_formats(tmp_path):
    torch = pytest.importorskip("torch")
    count = torch.tensor([[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [0, 0, 9]]])  # [steps, layers, E]
    torch.save({"rank": 0, "logical_count": count}, tmp_path / "c.pt")
    assert read_load_histogram(tmp_path / "c.pt").tolist() == [2, 3, 4]
    assert read_load_histogram(tmp_path / "c.pt", layer=1).tolist() == [4, 5, 15]
    (tmp_path / "c.json").write_text(json.dumps({"logical_count": [[7, 8], [9, 10]]}))
    assert read_load_histogram(tmp_path / "c.json", layer=1).tolist() == [9, 10]
    np.savez(tmp_path / "c.npz", np.array([3, 0, 1]))
    assert read_load_histogram(tmp_path / "c.npz").tolist() == [3, 0, 1]
    (tmp_path / "n.json").write_text(json.dumps({"logical_count": [1, -2]}))
    with pytest.raises(ZeppInputError, match="negative"):
        read_load_histogram(tmp_path / "n.json")
    (tmp_path / "k.json").write_text(json.dumps({"physical_to_logical_map": [[0]]}))
    with pytest.raises(ZeppInputError, match="no 'logical_count'"):
        read_load_histogram(tmp_path / "k.json")


# ---------------------------------------------------------------- Trace, sampler, demand


def test_trace_constructor_checks():
    with pytest.raises(ZeppInputError, match=r"row 1: expert id 4"):
        Trace(np.array([[0, 1], [4, 0]]), 4, "x")
    with pytest.raises(ZeppInputError, match=r"\[tokens, k\]"):
        Trace(np.array([1, 2]), 4)
    with pytest.raises(ZeppInputError, match="topk_weights"):
        Trace(np.array([[0, 1]]), 4, topk_weights=np.ones((1, 3)))


def test_sample_batches_seeded_with_replacement():
    t = Trace(np.arange(40).reshape(20, 2) % 7, 7, "x")
    a = sample_batches(t, ranks=3, tokens_per_rank=50, iters=4, seed=5)
    b = sample_batches(t, ranks=3, tokens_per_rank=50, iters=4, seed=5)
    c = sample_batches(t, ranks=3, tokens_per_rank=50, iters=4, seed=6)
    assert a.shape == (4, 3, 50, 2) and a.dtype == np.int32
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # every sampled row is a row of the trace; 150 draws from 20 rows must repeat some
    rows = {tuple(r) for r in t.topk_ids.tolist()}
    assert all(tuple(r) in rows for r in a.reshape(-1, 2).tolist())
    with pytest.raises(ZeppInputError, match="ranks"):
        sample_batches(t, 0, 5, 1, 0)


def test_rank_and_node_demand():
    ids = np.array([[[0, 1], [1, 2]], [[2, 2], [0, 3]]])  # [R=2, T=2, k=2]
    assert rank_demand(ids, 4).tolist() == [[1, 2, 1, 0], [1, 0, 2, 1]]
    t = Trace(np.array([[0, 1], [2, 3], [0, 2], [1, 2], [3, 3]]), 4, "x")
    # round-robin, 2 nodes x 1 GPU: rows 0, 2, 4 -> node 0; rows 1, 3 -> node 1
    d = node_demand(t, nodes=2, gpus_per_node=1, deal="round-robin")
    assert d.tolist() == [[2, 1, 1, 2], [0, 1, 2, 1]] and d.dtype == np.int64
    # 2 nodes x 2 GPUs: rows 0,1,4 -> ranks 0,1,0 (node 0); rows 2,3 -> ranks 2,3 (node 1)
    assert node_demand(t, 2, 2, deal="round-robin").tolist() == [[1, 1, 1, 3], [1, 1, 2, 0]]
    # blocks: rows 0-2 -> ranks 0,0,1 (node 0), rows 3-4 -> ranks 2,3 (node 1) at 2 x 2
    assert node_demand(t, 2, 2, deal="blocks").tolist() == [[2, 1, 2, 1], [0, 1, 1, 2]]
    with pytest.raises(ZeppInputError, match="deal must be"):
        node_demand(t, 2, 2, deal="random")


def test_node_demand_shuffle_ignores_row_order():
    """A trace sorted by position (like prompt-ordered traces) would be sliced by
    round-robin dealing; the default shuffled dealing gives every node the same mix."""
    e, nodes = 16, 4
    ids = np.repeat(np.arange(e)[:, None], 64, axis=0)  # 1024 rows: 64 of expert 0, then of 1...
    t = Trace(ids.reshape(-1, 1) % e, e, "x")
    rr = node_demand(t, nodes, 4, deal="round-robin")
    sh = node_demand(t, nodes, 4)
    assert sh.sum() == rr.sum() == len(t) and np.array_equal(sh.sum(0), t.expert_load())
    assert np.array_equal(sh, node_demand(t, nodes, 4))  # deterministic
    # each node holds a quarter of each expert's rows, up to sampling noise
    assert np.all(np.abs(sh - 16) <= 12)
    periodic = Trace(np.tile(np.arange(e), 64)[:, None], e, "x")  # row i -> expert i mod 16
    assert np.count_nonzero(node_demand(periodic, nodes, 4, deal="round-robin")) == e  # sliced: 4 per node
    assert np.count_nonzero(node_demand(periodic, nodes, 4)) == nodes * e


# ---------------------------------------------------------------- the real traces


@needs_traces
def test_real_traces_load():
    for model, rows, experts in (("k2", 15264, 384), ("qwen", 15328, 128)):
        pool, ev = load_model_traces(TRACES, model)
        assert len(pool) == len(ev) == rows
        assert pool.top_k == ev.top_k == 8 and pool.num_experts == experts
        assert pool.topk_ids.min() >= 0 and pool.topk_ids.max() < experts
        # a token never picks one expert twice
        s = np.sort(ev.topk_ids, axis=1)
        assert not np.any(s[:, 1:] == s[:, :-1])
        assert np.array_equal(ev.topk_ids, np.loadtxt(ev.source, dtype=np.int64))


@needs_traces
def test_real_trace_with_wrong_model_shapes():
    with pytest.raises(ZeppInputError, match="out of range .*--experts"):
        read_trace(TRACES / "k2" / "pool.txt", num_experts=128)
    with pytest.raises(ZeppInputError, match="top-6"):
        read_trace(TRACES / "k2" / "pool.txt", top_k=6)


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


# ---------------------------------------------------------------- SGLang expert-location files


@pytest.mark.parametrize("suffix", [".json", ".pt"])
def test_sglang_placement_round_trip(tmp_path, suffix):
    if suffix == ".pt":
        pytest.importorskip("torch")
    from zepp.interop.sglang import read_placement, write_init_expert_location, write_logical_count
    from zepp.planner.types import Placement

    pl = Placement(np.array([[0, 1, 4], [2, 3, 0], [4, 5, 1], [6, 7, 2]]), 8, gpus_per_node=2)
    write_init_expert_location(tmp_path / f"loc{suffix}", pl, layers=3)
    back = read_placement(tmp_path / f"loc{suffix}", num_experts=8, ranks=4, gpus_per_node=2, layer=2)
    assert np.array_equal(back.slot_expert, pl.slot_expert)
    with pytest.raises(ZeppInputError, match="do not split evenly over 5 ranks"):
        read_placement(tmp_path / f"loc{suffix}", num_experts=8, ranks=5, gpus_per_node=1)
    write_logical_count(tmp_path / f"c{suffix}", np.array([3, 1, 2]), layers=2)
    assert read_load_histogram(tmp_path / f"c{suffix}", layer=1).tolist() == [3, 1, 2]


def test_sglang_refuses_empty_slots(tmp_path):
    from zepp.interop.sglang import write_init_expert_location
    from zepp.planner.types import Placement

    pl = Placement(np.array([[0, 1], [2, -1]]), 3, gpus_per_node=1)
    with pytest.raises(ZeppInputError, match=r"1 empty slot\(s\) \(first: rank 1, slot 1\)"):
        write_init_expert_location(tmp_path / "x.json", pl)
