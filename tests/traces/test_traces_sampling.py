"""The Trace object's checks, the batch sampler and the demand histograms per rank and per node."""

from __future__ import annotations

import numpy as np
import pytest

from zepp.errors import ZeppInputError
from zepp.traces import Trace, node_demand, rank_demand, sample_batches


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
