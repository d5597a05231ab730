"""The layer builder's primitives (``zepp.sim.layer_builder``): the GEMM cost model (roofline,
active experts) and GEMM 2's column splits."""

import numpy as np
import pytest

from zepp.cluster import cluster_preset
from zepp.model import model_preset
from zepp.sim.calibrate import calibrated
from zepp.sim.layer_builder import LayerBuilder
from zepp.sim.mechanics import Mechanics, Net
from zepp.sim.task_graph import TaskGraph


def builder(nodes=1, slots=4):
    """A ``LayerBuilder`` on ``nodes`` a100 nodes (the calibration's GEMM curve: thin experts
    are bound by reading their weights) with ``slots`` slots per rank."""
    c = cluster_preset("a100", nodes, nic_msg_cost=0.0, nvlink_msg_cost=0.0, gemm_eff_max=0.5, gemm_rows_half=64.0)
    b = LayerBuilder(TaskGraph(c), c, model_preset("k2"), Net(), Mechanics())
    b.S, b.T = slots, 1
    return b


def test_gemm_roofline_switches_from_weights_to_flops():
    b = builder(slots=2)
    c, spec = b.cl, b.spec
    w = spec.hidden * spec.ffn * spec.dtype_bytes
    # few rows on one slot: bound by reading the weights
    tab = b.gemm_tasks(np.zeros(3, np.int64), np.zeros(3, np.int64), 1, lambda k: k, "g")
    dur_small = b.g.columns()["dur"][tab[0, 0]]
    assert dur_small == pytest.approx(w / c.hbm_bw + c.kernel_launch)
    # many rows: bound by FLOPs at the efficiency of that many rows per expert
    n = 4000
    tab = b.gemm_tasks(np.zeros(n, np.int64), np.zeros(n, np.int64), 1, lambda k: k, "g")
    dur_big = b.g.columns()["dur"][tab[0, 0]]
    flops = 2.0 * spec.hidden * spec.ffn * n
    assert dur_big == pytest.approx(flops / (c.peak_flops * c.gemm_efficiency(n)) + c.kernel_launch)
    assert dur_big > w / c.hbm_bw + c.kernel_launch


def test_grouped_gemm_counts_active_experts():
    b = builder()
    w = b.spec.hidden * b.spec.ffn * b.spec.dtype_bytes
    tab = b.gemm_tasks(np.zeros(3, np.int64), np.array([0, 1, 2]), 1, lambda k: k, "g")
    assert b.g.columns()["dur"][tab[0, 0]] == pytest.approx(3 * w / b.cl.hbm_bw + b.cl.kernel_launch)


def test_column_splits_read_the_weights_once():
    """GEMM 2 split by columns (COMET): the splits sum to one GEMM's time plus a launch each (no
    re-read of the weights per split, unlike one GEMM per destination wave), chained in order."""
    cl, net = calibrated("a100", 1)
    b = LayerBuilder(TaskGraph(cl), cl, model_preset("k2"), net, Mechanics())
    b.S, b.T = 4, 1
    cls, slot = np.zeros(40, np.int64), np.arange(40) % 4
    single = b.gemm_tasks(cls, slot, 1, lambda k: k, "g")[0, 0]
    first = b.gemm_tasks(cls, slot, 1, lambda k: k, "g", splits=4)[0, 0]
    dur = b.g.columns()["dur"]
    parts = dur[b.column_splits[:, 0, 0]]
    assert first == b.column_splits[0, 0, 0]
    assert parts.sum() == pytest.approx(dur[single] + 3 * cl.kernel_launch)
    pre, post = b.g.deps()
    chain = set(zip(pre.tolist(), post.tolist()))
    assert all((int(b.column_splits[c, 0, 0]), int(b.column_splits[c + 1, 0, 0])) in chain for c in range(3))
