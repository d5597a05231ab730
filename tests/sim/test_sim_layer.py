"""The layer builder (``zepp.sim.layer``): a FlowPlan's entries, the GEMM cost model, GEMM 2's
column splits, the key joins behind the row-level dependencies, and the program order of one
simulated layer."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.cluster import cluster_preset
from zepp.model import model_preset
from zepp.sim.calibrate import calibrated
from zepp.sim.engine import TaskGraph
from zepp.sim.layer import LayerBuilder, LayerWork, _join
from zepp.sim.mechanics import Mechanics, Net
from zepp.sim.run import Shared, run_system
from simcases import skewed_config


@pytest.fixture(scope="module")
def cfg():
    return skewed_config(0, 2, 3, 48, hidden=1024, ffn=512)


def builder(nodes=1, slots=4):
    """A ``LayerBuilder`` on ``nodes`` a100 nodes (the calibration's GEMM curve: thin experts
    are bound by reading their weights) with ``slots`` slots per rank."""
    c = cluster_preset("a100", nodes, nic_msg_cost=0.0, nvlink_msg_cost=0.0, gemm_eff_max=0.5, gemm_rows_half=64.0)
    b = LayerBuilder(TaskGraph(c), c, model_preset("k2"), Net(), Mechanics())
    b.S, b.T = slots, 1
    return b


def test_layer_work_holds_every_present_entry_once(cfg):
    s = registry.system("zepp-overlap")
    plan = Shared().plan(s, cfg, 0)
    r = plan.routing
    slot = r.slot.copy()
    slot[0, :5, 0] = -1  # five missing entries (a rank holding fewer tokens)
    w = LayerWork.of(replace(plan, routing=replace(r, slot=slot)))
    R, T, k = slot.shape
    assert w.owner.size == R * T * k - 5
    assert (w.slot >= 0).all() and (w.comp == w.slot // r.placement.slots_per_rank).all()
    # every entry points back at its own slot: (owner, token, entry) -> slot
    assert (slot[w.owner, w.token, w.entry] == w.slot).all()
    assert np.unique((w.owner * T + w.token) * k + w.entry).size == w.owner.size


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


@pytest.mark.parametrize("seed", range(6))
def test_join_finds_every_pair_of_equal_keys(seed):
    """The key join (dense table with a sorted fallback for repeated keys, or one sort of both
    sides for wide keys) against every pair by brute force."""
    rng = np.random.default_rng(seed)
    hi = [50, 50, 1 << 30, 7, 200, 1 << 26][seed]
    left = rng.integers(0, hi, int(rng.integers(0, 60)))
    right = rng.integers(0, hi, int(rng.integers(1, 80)))
    if seed == 4:
        left = np.unique(left)  # distinct on the table side: the one-pass path
    i, j = _join(left, right)
    got = sorted(zip(i.tolist(), j.tolist()))
    want = sorted((a, c) for a in range(left.size) for c in range(right.size) if left[a] == right[c])
    assert got == want


def test_layer_program_order_on_every_rank(cfg):
    """Nothing computes before the rank's plan exists, the weighted reduce comes after the
    rank's GEMMs and every partial into it, and every rank does work."""
    res = run_system("zepp-overlap", cfg, keep_timeline=True)
    tl = res.timeline
    R = cfg.cluster.ranks
    assert (tl.per_rank_latency(R) > 0).all()
    assert {"gemm", "dispatch", "combine", "plan", "reduce"} <= set(tl.kind)
    kind, rank = np.array(tl.kind), tl.rank
    for r in range(R):
        plan_end = tl.end[(kind == "plan") & (rank == r)].max()
        gemm = (kind == "gemm") & (rank == r)
        reduce_ = (kind == "reduce") & (rank == r)
        assert tl.start[gemm].min() >= plan_end
        assert tl.start[reduce_].min() >= tl.end[gemm].max()
        into_r = (kind == "combine") & (rank == r)
        assert not into_r.any() or tl.start[reduce_].min() >= tl.end[into_r].max()
