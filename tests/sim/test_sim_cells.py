"""A layer built from the plan's counts (``zepp.sim.cell_flows``, ``cell_links``) is the layer built
from its hop tables: for every system the simulator runs, the same timeline (every task's end, the
latency) and the same floor; and the cells' messages and stage pairs are the hop tables'."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import zepp.sim.run as run
from simcases import skewed_config
from zepp import registry
from zepp.planner.flows import build_flows, transport_pairs
from zepp.planner.overlap.grouping import messages
from zepp.planner.routing import route
from zepp.sim.cell_links import plan_cells
from zepp.sim.joins import stage_message_pairs

SYSTEMS = [n for n in registry.names_for("sim") if not registry.SYSTEMS[n].best_of]


@pytest.mark.parametrize("name", SYSTEMS)
def test_counted_layer_is_the_hop_layer(name):
    """The same plan simulated from its counts and, given its hop tables (``FlowPlan.hops``), from
    them: the same timeline to the last digit."""
    s = registry.system(name)
    cfg = skewed_config(3, nodes=2, iters=1, tokens=96, warmup=0)
    plan = run.Shared().plan(s, cfg, 0)
    given = replace(plan, hops=(plan.dispatch, plan.combine))
    assert not run.plan_counted(given, False)
    counted, planning, floor = run.simulate_plan(cfg, s, plan, keep=True)
    hops, planning_h, floor_h = run.simulate_plan(cfg, s, given, keep=True)
    assert (planning, floor) == (planning_h, floor_h)
    np.testing.assert_array_equal(counted.end, hops.end)
    np.testing.assert_array_equal(counted.start, hops.start)


def test_most_systems_take_the_counted_path():
    """The comparison above is not vacuous: the rows without phases, stage collectives or
    arrival-stage GEMM groups build their layer from counts."""
    cfg = skewed_config(3, nodes=2, iters=1, tokens=32, warmup=0)
    shared = run.Shared()
    took = [n for n in SYSTEMS if not registry.system(n).plugins
            and run.plan_counted(shared.plan(registry.system(n), cfg, 0), False)]
    assert len(took) >= len(SYSTEMS) // 2, took
    assert {"a2av", "zepp-overlap", "zepp-deepep-normal", "sglang-zepp-normal"} <= set(took), took


def test_cells_give_the_hop_tables_messages_and_stage_pairs():
    cfg = skewed_config(5, nodes=4, iters=1, tokens=64, warmup=0)
    from zepp.planner.placement import make_placement

    cl = cfg.cluster
    pl = make_placement("zepp", cfg.hist, cfg.spec.num_experts, cl.ranks, cl.gpus_per_node)
    r = route("zepp", cfg.batches[0], pl, 0.25)
    R, T = cl.ranks, cfg.batches.shape[2]
    for dispatch, combine in transport_pairs():
        for coalesce in (True, False):
            plan = build_flows(r, dispatch, 8, combine, coalesce)
            for cells, h in zip(plan_cells(plan), (plan.dispatch, plan.combine)):
                m = messages(cells, R, cells.rows)
                want = messages(h, R)
                for f in ("stage", "src", "dst", "rows"):
                    np.testing.assert_array_equal(getattr(m, f), getattr(want, f), err_msg=f"{plan.transport} {f}")
                got_pairs = cells.stage_pairs(m.keys, R)
                want_pairs = stage_message_pairs(h, want.hop_msg, R, T)
                for g, w in zip(got_pairs, want_pairs):
                    np.testing.assert_array_equal(g, w, err_msg=f"{plan.transport} coalesce={coalesce}")
