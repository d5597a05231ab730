"""The simulator against the emulated cluster (zepp.emulate.simcheck, zepp.emulate.glooexec) and
the stage-collective rule of the layer builder (zepp.sim.collectives): no cluster needed, the
calibration is a fixed dict of the shape ``simcheck.calibrate`` returns."""

from __future__ import annotations

import numpy as np
import pytest

from zepp.emulate import simcheck
from zepp.emulate.glooexec import (GLOO_BLOCKING, GLOO_OVERLAP, emulated_cluster, emulated_gemm, emulated_net,
                                   gloo_mechanics)
from zepp.errors import ZeppInputError
from zepp.planner.overlap.grouping import arrival_stage
from zepp.registry import system
from zepp.planner.flows.call_scopes import NODE, RAIL, WORLD
from zepp.runtime.collectives import plan_scopes
from zepp.runtime.program import compile_rank
from zepp.runtime.worker import default_config
from zepp.sim.engine import simulate
from zepp.sim.layer import build_layer
from zepp.sim.layer_work import LayerWork
from zepp.sim.task_graph import TaskGraph

CAL = {"cluster_fields": {"nic_bw": 120e6, "nvlink_bw": 1.5e9, "nic_msg_cost": 300e-6, "nvlink_msg_cost": 400e-6},
       "a2a_empty_s": 1.5e-3, "cores": 2,
       "compute": {"up": [40e-6, 1.5e-6], "down": [30e-6, 0.8e-6]}}
PARAMS = {"stage_overhead": 1e-3, "cpu_per_byte": 0.2e-9, "bw_scale": 1.0}
PLAN_S = 5e-3


@pytest.fixture(scope="module")
def plans():
    cfg = default_config()
    cfg.update(nodes=2, gpus_per_node=2, model="k2", hidden=256, ffn=16, tokens=64, iters=1, warmup=0,
               systems=["a2av", "relay", "zepp-overlap", "zepp-sync"])
    wp = simcheck.worker_plans(cfg)
    return wp["spec"], {s: p[0] for s, p in wp["plans"].items()}


def _graph(plan, spec, mech, cal=CAL, params=PARAMS):
    R, L = plan.ranks, plan.gpus_per_node
    cl = emulated_cluster(cal, R // L, L)
    net = emulated_net(cal, R, L, params["stage_overhead"], params["cpu_per_byte"])
    g = TaskGraph(cl)
    build_layer(g, cl, spec, LayerWork.of(plan), mech, net, np.full(R, PLAN_S), planning=np.full(R, PLAN_S),
                gemm_cost=emulated_gemm(cal))
    return g, cl


@pytest.mark.parametrize("name", ["a2av", "relay", "zepp-overlap", "zepp-sync"])
def test_simcheck_layer_is_the_shared_builders(plans, name):
    spec, ps = plans
    mech = gloo_mechanics(system(name))
    g, cl = _graph(ps[name], spec, mech)
    direct = simulate(g, labels=False).latency
    assert simcheck.simulate_layer(ps[name], spec, CAL, mech, PLAN_S, PARAMS) == direct
    # the layer is more than its prologue: messages, GEMMs and the calls' CPU are on the path
    assert direct > PLAN_S + 2 * CAL["a2a_empty_s"]


def test_overlap_systems_get_the_wave_and_arrival_stage_record():
    assert gloo_mechanics(system("zepp-overlap"), cpu=False) == GLOO_OVERLAP
    # on CPU tensors the runtime's cost model (no separate compute engine) runs overlap blocking
    assert gloo_mechanics(system("zepp-overlap")) == GLOO_BLOCKING
    assert gloo_mechanics(system("a2av")) == GLOO_BLOCKING == gloo_mechanics(system("zepp-sync"))
    with pytest.raises(ZeppInputError, match="zepp-p2p"):
        gloo_mechanics(system("zepp-p2p"))


@pytest.mark.parametrize("name", ["a2av", "relay", "zepp-overlap"])
def test_calls_per_rank_are_the_runtimes_all_to_alls(plans, name):
    """One costed post per ``all_to_all_single`` the runtime issues for that rank's program: every
    call of the program whose group moves something (the runtime's ``plan_scopes``), none where
    this rank's group has nothing to move."""
    spec, ps = plans
    plan, mech = ps[name], gloo_mechanics(system(name))
    g, _ = _graph(plan, spec, mech)
    c = g.columns()
    posts = np.array([lab == "post call" for lab in c["label"]]) & (np.asarray(c["dur"]) > 0)
    waves = mech.gemm2 == "waves"
    N = plan.ranks // plan.gpus_per_node
    for r in range(plan.ranks):
        prog = compile_rank(plan, r, waves=waves)
        runtime_calls = len(prog.dispatch) + (prog.num_waves if waves else 1) + len(prog.combine) - 1
        sc = plan_scopes(plan, prog.num_waves, np.arange(N) if waves else None)
        assert sc.active.shape[0] == runtime_calls
        assert int(np.sum(posts & (c["rank"] == r))) == int(sc.active[:, r].sum())
    if name != "a2av":  # relay and Zepp: intra-node stages on node groups, the NIC stage on rail groups
        assert {NODE, RAIL} <= set(sc.kind.tolist())
    else:
        assert set(sc.kind.tolist()) == {WORLD}


def test_a_serial_ring_call_takes_at_least_its_messages_link_times(plans):
    """Each rank's messages of a call run one after another in ring order, so the span of its
    sends is at least the sum of their fixed costs and bytes at the link's full rate."""
    spec, ps = plans
    plan = ps["a2av"]
    g, cl = _graph(plan, spec, GLOO_BLOCKING)
    tl = simulate(g, labels=False)
    c = g.columns()
    R, L = plan.ranks, plan.gpus_per_node
    for phase in ("dispatch", "combine"):
        for r in range(R):
            ids = np.flatnonzero((c["src"] == r) & np.array([lab.startswith(phase) for lab in c["label"]]))
            assert ids.size == R - 1  # one message per peer, empty or not
            dst = c["dst"][ids]
            ring = (dst - r) % R
            ids = ids[np.argsort(ring)]
            assert np.all(tl.start[ids[1:]] >= tl.end[ids[:-1]] - 1e-12), "sends overlap: not one after another"
            cap = np.where(dst[np.argsort(ring)] // L == r // L, cl.nvlink_bw, cl.nic_bw)
            need = np.sum(c["fixed"][ids] + c["bytes"][ids] / cap)
            assert tl.end[ids].max() - tl.start[ids].min() >= need * (1 - 1e-9)


def test_more_ranks_per_core_make_the_layer_longer(plans):
    """The CPU cost per byte is paid once per rank sharing a core (``max(1, R / cores)``)."""
    spec, ps = plans
    plan = ps["relay"]
    many_cores = dict(CAL, cores=8)  # 4 ranks: each has a core
    one_core = dict(CAL, cores=1)  # 4 ranks share it
    lat = {name: simcheck.simulate_layer(plan, spec, cal, GLOO_BLOCKING, PLAN_S, PARAMS)
           for name, cal in (("many", many_cores), ("one", one_core))}
    assert lat["one"] > lat["many"]
    no_bytes_cost = dict(PARAMS, cpu_per_byte=0.0)
    assert simcheck.simulate_layer(plan, spec, one_core, GLOO_BLOCKING, PLAN_S, no_bytes_cost) == \
        simcheck.simulate_layer(plan, spec, many_cores, GLOO_BLOCKING, PLAN_S, no_bytes_cost)


def test_measured_gemm_cost_replaces_the_roofline(plans):
    """A GEMM cost of 1 ms per row puts the busiest rank's rows on the critical path."""
    spec, ps = plans
    plan = ps["a2av"]
    slow_gemm = dict(CAL, compute={"up": [0.0, 1e-3], "down": [0.0, 1e-3]})
    lat = simcheck.simulate_layer(plan, spec, slow_gemm, GLOO_BLOCKING, PLAN_S, PARAMS)
    rows = np.bincount(LayerWork.of(plan).comp, minlength=plan.ranks)
    assert lat >= PLAN_S + 2e-3 * rows.max()
    base = simcheck.simulate_layer(plan, spec, CAL, GLOO_BLOCKING, PLAN_S, PARAMS)
    assert base < PLAN_S + 2e-3 * rows.max()


def test_arrival_stage_is_the_runtimes_arrival_group(plans):
    """``zepp.planner.overlap.grouping.arrival_stage`` gives every computed entry the group the runtime's
    program computes it in (``(arrival_event + 1) // 2``)."""
    _, ps = plans
    plan = ps["zepp-overlap"]
    T = plan.routing.topk_ids.shape[1]
    assert plan.dispatch.num_stages >= 2
    seen = set()
    for r in range(plan.ranks):
        prog = compile_rank(plan, r, waves=True)
        got = arrival_stage(prog.e_owner, prog.e_token, np.full(prog.n_entries, r), plan.dispatch, T)
        np.testing.assert_array_equal(got, (prog.e_event + 1) // 2)
        seen |= set(got.tolist())
    assert len(seen) >= 3  # own rows and at least two stages' arrivals


def test_free_parameters_recover_known_costs(plans):
    """Measurements made by the model itself with known CPU costs give those costs back (two
    blocking cases with different call counts and bytes, so both parameters are determined)."""
    spec, ps = plans
    truth = {"stage_overhead": 2e-3, "cpu_per_byte": 0.3e-9}
    cases = [{"plans": [ps[n]], "spec": spec, "plan_s": PLAN_S, "key": "k",
              "measured_s": simcheck.simulate_system([ps[n]], spec, CAL, GLOO_BLOCKING, PLAN_S, truth)}
             for n in ("a2av", "relay")]
    fit = simcheck.fit_free_parameters(cases, lambda k: CAL)
    assert fit["stage_overhead"] == pytest.approx(truth["stage_overhead"], rel=0.05)
    assert fit["cpu_per_byte"] == pytest.approx(truth["cpu_per_byte"], rel=0.05)
    assert np.max(np.abs(fit["rel_err"])) < 0.01


def test_cpu_cost_model_picks_one_group_and_wave(plans):
    """What ``gloo_mechanics`` assumes: with no separate compute engine (``overlap=0``) the
    granularity model picks one dispatch group and one combine wave, with one (GPUs) it does not."""
    from zepp.cluster import cluster_preset
    from zepp.planner.overlap.granularity import Figures, choose

    spec, ps = plans
    plan = ps["zepp-overlap"]
    cl = cluster_preset("a100", plan.ranks // plan.gpus_per_node, plan.gpus_per_node)
    g = choose(plan, spec, Figures.of(cl, overlap=0.0))
    assert (g.groups, g.waves) == (1, 1)
    g = choose(plan, spec, Figures.of(cl, overlap=1.0))
    assert (g.groups, g.waves) != (1, 1)
