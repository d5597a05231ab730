"""Zepp's per-batch granularity (``zepp.planner.overlap.granularity``): the candidates, the choice (identical
however often it is made, degenerate where it must be), the simulator never worse than the worse
fixed extreme, and the runtime's numerics unchanged by the grouping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zepp import registry
from zepp.cluster import cluster_preset
from zepp.planner.flows import build_flows
from zepp.planner.overlap.granularity import Figures, Granularity, choose, group_map, predict, wave_map
from zepp.model import model_preset
from zepp.planner.placement import make_placement
from zepp.planner.routing import route
from zepp.runtime.program import compile_rank
from zepp.runtime.reference import execute_local, reference_moe
from zepp.sim.run import Shared, plan_granularity, run_system, simulate_plan
from simcases import skewed_batch, skewed_config


def _plan(nodes=4, L=2, E=32, k=4, T=64, seed=0, row_bytes=2048):
    rng = np.random.default_rng(seed)
    R = nodes * L
    ids = skewed_batch(rng, 1, R, T, E, k)[0]
    hist = np.stack([np.bincount(skewed_batch(rng, 1, L, 100, E, k).ravel(), minlength=E) for _ in range(nodes)])
    return ids, build_flows(route("zepp", ids, make_placement("zepp", hist, E, R, L)), "zepp", row_bytes)


@pytest.mark.parametrize("N", [1, 2, 3, 4, 7, 16])
def test_candidate_maps_merge_adjacent_groups_in_order(N):
    for g in range(1, N + 2):
        m = group_map(g, N)
        assert m.shape == (N + 1,) and m[0] == 0 and np.all(np.diff(m) >= 0) and np.all(np.diff(m) <= 1)
        assert set(m.tolist()) == set(range(g))  # exactly g non-empty coarse groups
    for w in range(1, N + 1):
        m = wave_map(w, N)
        assert m.shape == (N,) and m[-1] == w - 1 and set(m.tolist()) == set(range(w))
        assert np.all(np.diff(m) >= 0)
    np.testing.assert_array_equal(Granularity.per_node(N).group_map(), np.arange(N + 1))
    np.testing.assert_array_equal(Granularity.per_node(N).wave_map(), np.arange(N))
    assert not Granularity.single(N).group_map().any() and not Granularity.single(N).wave_map().any()
    if N >= 2:  # two groups: own node first, then every remote node
        np.testing.assert_array_equal(group_map(2, N), [0, 0] + [1] * (N - 1))
    with pytest.raises(ValueError):
        Granularity(N, N + 2, 1)


def test_choice_is_identical_every_time_and_from_a_rebuilt_plan():
    ids, plan = _plan()
    fig = Figures.of(cluster_preset("a100", 4, 2))
    spec = model_preset("qwen").with_(hidden=1024, ffn=512, num_experts=32, top_k=4)
    first = choose(plan, spec, fig)
    # another "rank": the same ids planned again from scratch
    _, again = _plan()
    for p in (plan, again, plan):
        assert choose(p, spec, fig) == first
    (g1, w1, c1), (g2, w2, c2) = predict(plan, spec, fig), predict(again, spec, fig)
    assert (g1, w1) == (g2, w2)
    np.testing.assert_array_equal(c1, c2)  # bit-identical costs


def test_one_group_and_one_wave_when_nothing_crosses():
    """Every token picks experts on its own GPU: nothing to overlap, so one GEMM per phase."""
    R, L, E, k, T = 8, 2, 32, 2, 40
    S = E // R
    ids = np.stack([np.stack([np.random.default_rng(r * 100 + t).choice(S, k, replace=False) + r * S
                              for t in range(T)]) for r in range(R)])
    plan = build_flows(route("home", ids, make_placement("home", np.ones((R // L, E)), E, R, L)), "zepp", 2048)
    assert not ((plan.dispatch.src // L) != (plan.dispatch.dst // L)).any()
    spec = model_preset("qwen").with_(hidden=1024, ffn=512, num_experts=E, top_k=k)
    g = choose(plan, spec, Figures.of(cluster_preset("a100", 4, 2)))
    assert (g.groups, g.waves) == (1, 1)


def test_single_node_weight_bound_batch_runs_one_gemm():
    ids, plan = _plan(nodes=1, L=4, T=8)
    spec = model_preset("k2").with_(num_experts=32, top_k=4)  # huge experts, a few rows each
    g = choose(plan, spec, Figures.of(cluster_preset("a100", 1, 4)))
    assert (g.nodes, g.groups, g.waves) == (1, 1, 1)


def test_per_node_groups_when_communication_dominates():
    """Slow NICs, tiny expert weights, compute-bound GEMMs: every split hides transfer time and
    re-reads cost nothing, so the choice is one group per source node and one wave per node."""
    ids, plan = _plan(nodes=4, L=2, E=16, k=4, T=512, row_bytes=16384)
    spec = model_preset("qwen").with_(hidden=8192, ffn=64, num_experts=16, top_k=4)
    cl = cluster_preset("a100", 4, 2, nic_bw=0.5e9, kernel_launch=1e-7, peak_flops=2e12)
    g = choose(plan, spec, Figures.of(cl))
    assert g.groups >= 4 and g.waves == 4, g  # one group per source node (own GPU may join its node)


@pytest.fixture(scope="module")
def cfg():
    return skewed_config(0, 2, 3, 48, hidden=1024, ffn=512)


@pytest.mark.parametrize("model,tokens", [("qwen", 48), ("k2", 16), ("qwen", 512)])
def test_simulated_auto_never_worse_than_the_worse_fixed_extreme(model, tokens):
    c = skewed_config(1, 2, 2, tokens, model=model, warmup=0, hist_k=None)
    cl = c.cluster
    s = registry.system("zepp-auto")
    shared = Shared()
    for it in range(2):
        plan = shared.plan(s, c, it)
        N = cl.nodes
        lat = {name: simulate_plan(c, s, plan, granularity=g)[0].latency
               for name, g in (("single", Granularity.single(N)), ("per-node", Granularity.per_node(N)),
                               ("auto", plan_granularity(c, s, plan)))}
        assert lat["auto"] <= max(lat["single"], lat["per-node"]) * (1 + 1e-9), lat


def test_zepp_auto_in_the_simulator_is_deterministic_and_zepp_takes_it(cfg):
    a = run_system("zepp-auto", cfg)
    b = run_system("zepp-auto", cfg, shared=Shared())
    assert a.latencies == b.latencies and a.granularity == b.granularity
    assert all(g is not None for g in a.granularity)
    assert "zepp-auto" in registry.SYSTEMS["zepp"].best_of
    # the per-node granularity through the coarse-group path reproduces zepp-overlap bit for bit
    s = registry.system("zepp-overlap")
    plan = Shared().plan(s, cfg, 1)
    fixed = simulate_plan(cfg, s, plan)
    via = simulate_plan(cfg, s, plan, granularity=Granularity.per_node(cfg.cluster.nodes))
    assert fixed[0].latency == via[0].latency
    # and one group / one wave is zepp-sync's compute and messages
    sync = simulate_plan(cfg, registry.system("zepp-sync"), plan)
    one = simulate_plan(cfg, s, plan, granularity=Granularity.single(cfg.cluster.nodes))
    assert sync[0].latency == one[0].latency


@pytest.mark.parametrize("nodes,L", [(2, 2), (4, 2), (3, 1)])
def test_runtime_numerics_unchanged_by_the_grouping(nodes, L):
    R, E, k, T, H = nodes * L, 24, 4, 20, 16
    rng = np.random.default_rng(nodes * 10 + L)
    ids = np.argsort(rng.random((R, T, E)), axis=2)[:, :, :k]
    hist = rng.integers(0, 50, (nodes, E))
    plan = build_flows(route("zepp", ids, make_placement("zepp", hist, E, R, L)), "zepp", H * 4)
    gen = torch.Generator().manual_seed(nodes * 10 + L)
    x, w = torch.randn(R, T, H, generator=gen), torch.rand(R, T, k, generator=gen)
    ref = torch.stack([reference_moe(x[r], ids[r], w[r], 3, 6) for r in range(R)])
    y0, sd0, sc0 = execute_local(plan, x, w, seed=3, ffn=6, waves=True)
    for g in range(1, nodes + 2):
        for wv in range(1, nodes + 1):
            gran = Granularity(nodes, g, wv)
            y, sd, sc = execute_local(plan, x, w, seed=3, ffn=6, waves=True, granularity=gran)
            assert ((y - ref).norm() / ref.norm()).item() <= 1e-5, (g, wv)
            np.testing.assert_array_equal(sd, sd0)  # the same bytes move, only grouped otherwise
            np.testing.assert_array_equal(sc, sc0)
            for r in range(R):
                p = compile_rank(plan, r, waves=True, granularity=gran)
                assert p.num_waves == wv
                if p.combine:  # the first combine stage sends and receives by wave
                    assert p.combine[0].send_counts.shape == p.combine[0].recv_counts.shape == (R, wv)
                else:  # no combine program: the plan combines nothing anywhere
                    assert plan.combine.size == 0
                assert set(np.unique(p.e_group).tolist()) <= set(range(g))
                # a group is released after the last arrival event its rows need
                for gi in np.unique(p.e_group).tolist():
                    assert p.group_need[gi] == p.e_event[p.e_group == gi].max()


def test_transfers_sharing_the_cores_favour_fewer_splits():
    """``Figures.overlap`` below 1 (transfers take the cores the GEMMs need) never makes a split
    look more attractive; at 0 the communication-dominated case is no longer split finely."""
    ids, plan = _plan(nodes=4, L=2, E=16, k=4, T=512, row_bytes=16384)
    spec = model_preset("qwen").with_(hidden=8192, ffn=64, num_experts=16, top_k=4)
    cl = cluster_preset("a100", 4, 2, nic_bw=0.5e9, kernel_launch=1e-7, peak_flops=2e12)
    full = choose(plan, spec, Figures.of(cl))
    none = choose(plan, spec, Figures.of(cl, overlap=0.0))
    assert (none.groups, none.waves) <= (full.groups, full.waves)
    assert none.predicted >= full.predicted
    for r in range(8):
        assert compile_rank(plan, r, waves=True, granularity=Granularity.single(4)).single_gemm
        assert not compile_rank(plan, r, waves=True, granularity=Granularity.per_node(4)).single_gemm
        assert not compile_rank(plan, r, waves=True).single_gemm


def test_column_splits_grow_with_the_combine_and_stay_in_range():
    from zepp.planner.overlap.granularity import MAX_COLUMN_SPLITS, column_splits

    fig = Figures.of(cluster_preset("h200-8", 2, 8))
    got = [column_splits(t, 8, 14336, 8, 8, fig) for t in (1, 8, 40, 144, 512, 4096)]
    assert got == sorted(got) and got[0] == 1 and got[-1] == MAX_COLUMN_SPLITS
    # s = round(sqrt(combine / launch)): 40 tokens of K2 on 2 nodes, half the rows on the NIC
    combine = 40 * 8 * 14336 / 2 / fig.nic_bw
    assert column_splits(40, 8, 14336, 2, 8, fig) == round((combine / fig.launch) ** 0.5)
    assert column_splits(40, 8, 14336, 1, 8, fig) < column_splits(40, 8, 14336, 2, 8, fig)  # NVLink is faster
