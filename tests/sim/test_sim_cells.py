"""A layer built from the plan's counts (``zepp.sim.cell_flows``, ``cell_links``) is the layer built
from its hop tables: for every system the simulator runs, the same timeline (every task's end, the
latency) and the same floor; and the cells' messages and stage pairs are the hop tables'."""

from __future__ import annotations

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
def test_counted_layer_is_the_hop_layer(monkeypatch, name):
    cfg = skewed_config(3, nodes=3, iters=2, tokens=96, warmup=0)
    counted = run.run_system(name, cfg, keep_timeline=True)
    monkeypatch.setattr(run, "plan_counted", lambda plan, predispatch: False)
    hops = run.run_system(name, cfg, keep_timeline=True)
    assert counted.latencies == hops.latencies and counted.lower_bound == hops.lower_bound
    np.testing.assert_array_equal(counted.timeline.end, hops.timeline.end)


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
                m, keys = cells.message_table(R)
                want = messages(h, R)
                for f in ("stage", "src", "dst", "rows"):
                    np.testing.assert_array_equal(getattr(m, f), getattr(want, f), err_msg=f"{plan.transport} {f}")
                got_pairs = cells.stage_pairs(keys, R)
                want_pairs = stage_message_pairs(h, want.hop_msg, R, T)
                for g, w in zip(got_pairs, want_pairs):
                    np.testing.assert_array_equal(g, w, err_msg=f"{plan.transport} coalesce={coalesce}")
