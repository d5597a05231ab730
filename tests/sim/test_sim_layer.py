"""One simulated layer (``zepp.sim.layer``): a FlowPlan's entries and the program order of its
tasks on every rank."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.sim.layer_work import LayerWork
from zepp.sim.run import Shared, run_system
from simcases import skewed_config


@pytest.fixture(scope="module")
def cfg():
    return skewed_config(0, 2, 3, 48, hidden=1024, ffn=512)


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


def test_layer_program_order_on_every_rank(cfg):
    """Nothing computes before the rank's plan exists, the weighted reduce comes after the
    rank's GEMMs and every partial into it, and every rank does work."""
    res = run_system("zepp-overlap", cfg, keep_timeline=True)
    tl = res.timeline
    R = cfg.cluster.ranks
    assert (tl.per_rank_latency(R) > 0).all()
    assert {"gemm", "dispatch", "combine", "plan", "reduce"} <= set(tl.kind)
    kind, rank, label = np.array(tl.kind), tl.rank, np.array(tl.label)
    for r in range(R):
        plan_end = tl.end[(kind == "plan") & (rank == r)].max()
        gemm = (kind == "gemm") & (rank == r)
        reduce_ = (kind == "reduce") & (label == "reduce") & (rank == r)  # the weighted reduce at home
        assert tl.start[gemm].min() >= plan_end
        assert tl.start[reduce_].min() >= tl.end[gemm].max()
        into_r = (kind == "combine") & (rank == r)
        assert not into_r.any() or tl.start[reduce_].min() >= tl.end[into_r].max()
