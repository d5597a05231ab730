"""Today's clusters: DeepEP's kernels in the simulator, the systems that run on them, and the
presets' network figures (published for today's presets, fitted for the paper's), which every
simulated FlowPlan runs on."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.cli import main
from zepp.cluster import cluster_preset
from zepp.errors import ZeppInputError
from zepp.model import model_preset
from zepp.sim.calibrate import FITTED, PUBLISHED, calibrated, has_network, network_label, network_of
from zepp.sim.chunks import add_pieces, link_pieces, piece_counts
from zepp.sim.engine import simulate
from zepp.sim.mechanics import DEEPEP_FP8, DEEPEP_NET, MECHANICS, Net
from zepp.sim.planning_cost import lp_solver_data, planning_seconds
from zepp.sim.run import Config, Shared, run_system, simulate_flowplan, simulate_plan
from zepp.sim.task_graph import TaskGraph


def uniform_config(nodes: int, tokens: int = 128, model: str = "deepseek-v3", preset: str = "h200-8",
                   fast_gemm: bool = True, iters: int = 1, gpus_per_node: int = 8) -> Config:
    """DeepEP's benchmark setting: ``tokens`` per GPU, each picking top-8 experts uniformly at
    random. ``fast_gemm``: GEMMs (almost) free, so the combine starts when the dispatch ends."""
    cl, net = calibrated(preset, nodes, gpus_per_node=gpus_per_node)
    if fast_gemm:
        cl = cl.with_(peak_flops=1e21, hbm_bw=1e21)
    spec = model_preset(model)
    rng = np.random.default_rng(0)
    R, E, k = cl.ranks, spec.num_experts, spec.top_k
    ids = np.argsort(rng.random((iters, R, tokens, E)), axis=-1)[..., :k].astype(np.int32)
    return Config(cl, spec, net, np.ones((nodes, E)), ids, warmup=0)


def timeline(cfg: Config, name: str):
    s = registry.system(name)
    tl, _, _ = simulate_plan(cfg, s, Shared().plan(s, cfg, 0), keep=True)
    return tl


def phases(tl) -> tuple[float, float]:
    """``(dispatch, combine)`` seconds: the dispatch from its first kernel to its last arrival;
    the combine from the last second GEMM to its last kernel."""
    kind = np.array(tl.kind)
    d, c = kind == "dispatch", kind == "combine"
    g2 = np.array([lab == "gemm2" for lab in tl.label])
    return tl.end[d].max() - tl.start[d].min(), tl.end[c].max() - tl.end[g2].max()


@pytest.mark.parametrize("nodes", [2, 4, 8])  # EP 16, 32, 64 of DeepEP's published EP 8-256
def test_low_latency_kernels_land_in_deepeps_published_range(nodes):
    # PAPER.md section 5: "DeepEP low-latency (128 tokens, top-8): dispatch 77-194 us, combine
    # 114-369 us for EP 8-256". DEEPEP_NET takes nothing from these figures.
    dispatch, combine = phases(timeline(uniform_config(nodes), "sglang-deepep-ll"))
    assert 77e-6 <= dispatch <= 194e-6, dispatch
    assert 114e-6 <= combine <= 369e-6, combine


def test_deepep_timelines_hold_no_proxy_task_and_proxy_mechanics_do():
    cfg = uniform_config(2, tokens=64)
    for name in ("sglang-deepep-ll", "sglang-deepep-normal", "zepp-deepep-normal", "zepp-deepep-overlap"):
        tl = timeline(cfg, name)
        assert "proxy" not in tl.kind, name
        assert not any(r.endswith(".proxy") for r in tl.resource), name
    assert "proxy" in timeline(cfg, "sglang").kind  # the same routing through NVSHMEM's proxy


def test_dispatch_moves_fp8_rows_and_combine_bf16():
    cfg = uniform_config(2, tokens=32)
    tl = timeline(cfg, "sglang-deepep-ll")
    kind = np.array(tl.kind)
    entries = cfg.cluster.ranks * 32 * 8
    d_bytes, c_bytes = tl.bytes[kind == "dispatch"].sum(), tl.bytes[kind == "combine"].sum()
    # a2av both ways moves the same rows (one per entry off its own GPU): FP8 out, BF16 back
    assert d_bytes == pytest.approx(c_bytes * DEEPEP_FP8 / cfg.spec.dtype_bytes)
    assert 0 < d_bytes <= entries * cfg.spec.hidden * DEEPEP_FP8


def test_mode_switches_at_the_threshold():
    s = registry.SYSTEMS["sglang-deepep"]
    assert s.switch_tokens == 256
    for name in ("sglang-deepep", "vllm-eplb", "sglang-lp"):
        low, high = registry.SYSTEMS[name].best_of
        assert registry.pick_variant(name, 256, {}) == low and low.endswith("-ll")
        assert registry.pick_variant(name, 257, {}) == high and high.endswith("-normal")
    for tokens, mode in ((256, "sglang-deepep-ll"), (257, "sglang-deepep-normal")):
        res = run_system("sglang-deepep", uniform_config(1, tokens=tokens, model="qwen"))
        assert res.variant == mode
    # a best-of meta-system still picks the fastest variant
    assert registry.pick_variant("zepp-deepep", 64, {"zepp-deepep-ll": 2.0, "zepp-deepep-normal": 1.0}) == \
        "zepp-deepep-normal"


def test_new_rows_run_exactly_where_their_executors_say(capsys):
    rows = ["sglang-deepep", "vllm-eplb", "sglang-lp", "zepp-deepep"]
    rows += [v for n in rows for v in registry.SYSTEMS[n].best_of]
    table = [n for n in rows if registry.SYSTEMS[n].routing.startswith("zepp-table")]
    assert table  # Zepp's table-routed variants: simulator only (a plan needs the table built from history)
    for name in table:
        assert registry.SYSTEMS[name].executors == ("sim",)
        with pytest.raises(ZeppInputError, match="runs in: sim"):
            registry.parse_systems(name, "plan")
    for name in (n for n in rows if n not in table):
        s = registry.SYSTEMS[name]
        assert s.executors == ("plan", "sim")
        assert registry.parse_systems(name, "plan") == [name] and registry.parse_systems(name, "sim") == [name]
        with pytest.raises(ZeppInputError, match="runs in: plan, sim"):
            registry.parse_systems(name, "runtime")
        assert s.mechanics in MECHANICS or s.best_of
    assert registry.parse_systems("sglang-deepep", "plan", expand=True) == ["sglang-deepep-ll", "sglang-deepep-normal"]
    with pytest.raises(SystemExit) as info:
        main(["run", "--systems", "sglang-deepep"])
    assert info.value.code == 2 and "runs in: plan, sim" in capsys.readouterr().err


def test_todays_presets_simulate_with_deepeps_published_network():
    for preset in ("h100-8", "h200-8", "gb200-nvl72"):
        assert network_of(preset) == (DEEPEP_NET, "published")
        assert calibrated(preset, 2, gpus_per_node=8)[1] is DEEPEP_NET
    assert network_of("a100") == (FITTED["a100"], "fitted") and not set(FITTED) & set(PUBLISHED)
    with pytest.raises(ZeppInputError, match="h200-8"):
        network_of("tpu")


@pytest.mark.parametrize("preset, net", [("h100-8", DEEPEP_NET), ("a100", FITTED["a100"])])
def test_one_flowplan_is_simulated_on_its_presets_network(preset, net):
    """``simulate_flowplan`` (``zepp plan``, ``zepp place``) runs the preset's network: DeepEP's
    published figures for today's presets (``zepp place`` ran ``h100-8`` on ``Net()``'s
    defaults before), the fit for the paper's."""
    gpn = 8 if preset == "h100-8" else 4
    cfg = uniform_config(2, tokens=64, model="qwen", preset=preset, fast_gemm=False, gpus_per_node=gpn)
    assert cfg.net is net
    s = registry.system("sglang")
    plan = Shared().plan(s, cfg, 0)
    got = simulate_flowplan(plan, cluster_preset(preset, 2, gpn), cfg.spec, "sglang")[0].latency
    assert got == simulate_plan(cfg, s, plan)[0].latency
    assert got != simulate_plan(replace(cfg, net=Net()), s, plan)[0].latency
    assert has_network(preset) and "figures" in network_label(preset)


def test_a_cluster_without_network_figures_is_not_simulated():
    cl = cluster_preset("h100-8", 1).with_(name="my-cluster")  # a --cluster-file without a base preset
    assert not has_network(cl.name) and "not simulated" in network_label(cl.name)
    plan = Shared().plan(registry.system("a2av"), uniform_config(1, tokens=8, model="qwen"), 0)
    with pytest.raises(ZeppInputError, match="my-cluster"):
        simulate_flowplan(plan, cl, model_preset("qwen"), "a2av")


def deepep_benchmark_config(nodes: int, tokens: int = 4096) -> Config:
    """DeepEP's internode benchmark (``tests/test_internode.py`` of deepseek-ai/DeepEP): 4096
    tokens per GPU, hidden 7168, 256 experts, top-8 among the experts of the ``min(nodes, 4)``
    nodes with the highest expert score (scores ``|N(0,1)| + 1``; node-limited routing), expert
    ``e`` on rank ``e // (E / R)``; GEMMs (almost) free."""
    cfg = uniform_config(nodes, tokens=tokens)
    R, E, k = cfg.cluster.ranks, cfg.spec.num_experts, cfg.spec.top_k
    rng = np.random.default_rng(0)
    scores = np.abs(rng.standard_normal((R * tokens, E), dtype=np.float32)) + 1
    node_best = scores.reshape(R * tokens, nodes, -1).max(-1)
    top_nodes = np.argpartition(-node_best, min(nodes, 4) - 1, axis=1)[:, :min(nodes, 4)]
    keep = np.zeros((R * tokens, nodes), bool)
    np.put_along_axis(keep, top_nodes, True, 1)
    masked = np.where(np.repeat(keep, E // nodes, 1), scores, 0)
    ids = np.argpartition(-masked, k - 1, axis=1)[:, :k].astype(np.int32)
    return replace(cfg, batches=ids.reshape(1, R, tokens, k))


def deepep_rdma_rate(nodes: int, chunked: bool = True) -> float:
    """DeepEP's normal-mode dispatch "RDMA bandwidth" as its benchmark counts it: every (token,
    destination node) pair, the token's own node included, times the FP8 row, over the dispatch
    time (first kernel to last arrival); home placement (``sglang-deepep-normal``'s mechanics
    and transports over DeepEP's own expert layout). bytes/s per rank."""
    cfg = deepep_benchmark_config(nodes)
    s = replace(registry.system("sglang-deepep-normal"), placement="home", routing="home")
    mech = replace(MECHANICS[s.mechanics], chunked=chunked)
    tl = simulate_plan(cfg, s, Shared().plan(s, cfg, 0), keep=True, mech=mech)[0]
    d = np.array(tl.kind) == "dispatch"
    node = cfg.batches[0].reshape(-1, cfg.spec.top_k) // (cfg.spec.num_experts // nodes)
    seen = np.zeros((node.shape[0], nodes), bool)
    np.put_along_axis(seen, node, True, 1)
    counted = seen.sum() * cfg.spec.hidden * DEEPEP_FP8 / cfg.cluster.ranks
    return float(counted / (tl.end[d].max() - tl.start[d].min()))


# DeepEP's README (H800, CX7 400 Gb/s): 43 / 58 / 51 GB/s RDMA bottleneck bandwidth at EP 16 / 32 / 64.
# DEEPEP_NET and the chunk sizes (zepp.sim.chunks) take nothing from these figures; the model gave
# 50.2 / 59.2 / 50.0 GB/s when this test was written (47.2 / 38.9 / 34.2 without chunking).
@pytest.mark.parametrize("nodes, published", [(2, 43e9), (4, 58e9), (8, 51e9)])
def test_normal_kernels_reach_deepeps_published_rdma_rate(nodes, published):
    got = deepep_rdma_rate(nodes)
    assert got >= 43e9, got
    assert abs(got / published - 1) <= 0.2, (got, published)


def test_chunked_pipelining_is_what_reaches_the_published_rate():
    # EP 32: whole messages forwarded after they land stay below DeepEP's lowest published figure
    assert deepep_rdma_rate(4, chunked=False) < 43e9 <= deepep_rdma_rate(4)


def test_a_forwarder_passes_each_piece_on_as_it_lands():
    """Two-stage relay 0 -> 8 (NIC) -> 9 (NVLink), 4 pieces each: the forward ends one piece
    after the NIC stage, not a whole message after it."""
    cl = cluster_preset("h200-8", 2, 8)
    nic, nvl, nbytes = 50e9, 50e9 / 4, 4e6
    g = TaskGraph(cl)
    pieces = np.array([4, 4])
    first, last = add_pieces(g, np.array([0, 8]), np.array([8, 9]), np.full(2, nbytes), np.zeros(2), pieces, "dispatch")
    link_pieces(g, first, pieces, np.array([0]), np.array([1]))
    tl = simulate(g, nic_bw=nic, nvlink_bw=nvl, labels=True)
    assert tl.end[last[0]] == pytest.approx(nbytes / nic)
    # NVLink is 4x slower: the forward streams from the first piece on; its 4 pieces end at
    # (piece on NIC) + 4 pieces on NVLink
    assert tl.end[last[1]] == pytest.approx(nbytes / 4 / nic + nbytes / nvl)
    assert piece_counts(np.array([4000, 1000, 50]), np.array([True, False, False]), np.array([0]), np.array([1]),
                        nvl_chunk=16, rdma_chunk=20).tolist() == [20, 20, 1]


def test_lp_solver_time_is_the_published_figure_plus_the_count_all_reduce():
    """LPLB's "~100 us for intra-node optimization (longer for inter-node)": the solve is the
    recorded figure (one more launch for the per-entry draw); across nodes the all-reduce of the
    counts over the NIC makes it longer, from the simulated network's own figures."""
    rec = lp_solver_data()
    assert rec["solver_s"] == 100e-6 and "LPLB" in rec["solver_source"]
    spec = model_preset("k2")
    s = registry.system("sglang-lp-ll")
    got = {}
    for nodes in (1, 2, 8):
        cl, net = calibrated("h200-8", nodes, gpus_per_node=8)
        prologue, planning = planning_seconds(s.planning, s, cl, spec, 64, net)
        assert planning == pytest.approx(100e-6 + cl.kernel_launch)
        got[nodes] = prologue - planning
    assert 0 < got[1] < got[2] < got[8]
    cl, net = calibrated("h200-8", 2, gpus_per_node=8)
    assert got[2] == pytest.approx(4 * (net.put(16) + spec.num_experts * 4 / (cl.nic_bw * net.nic_eff)))


def test_sglang_lp_balances_the_busiest_gpu_at_least_as_well_as_static_dispatch():
    """SGLang's lp draws from its candidate lists: a rank with a nearby copy keeps it whatever the
    LP says, so with lists shrunk from a placement file lp is no worse than static dispatch on the
    busiest GPU; with every copy a candidate (after an EPLB rebalance: routing ``lp``) it is better."""
    cfg = uniform_config(2, tokens=512, model="qwen", fast_gemm=False)
    skew = np.random.default_rng(3).zipf(1.6, cfg.batches.shape) % cfg.spec.num_experts
    cfg = replace(cfg, batches=skew.astype(np.int32), hist=np.bincount(skew.ravel(), minlength=cfg.spec.num_experts)
                  [None].repeat(2, 0).astype(float))
    sh = Shared()
    after = replace(registry.system("sglang-lp-normal"), name="lp-after-rebalance", routing="lp")
    rows = {s.name: sh.plan(s, cfg, 0).routing.rows_per_rank().max()
            for s in (registry.system("sglang-deepep-normal"), registry.system("sglang-lp-normal"), after)}
    assert rows["sglang-lp-normal"] <= rows["sglang-deepep-normal"], rows
    assert rows["lp-after-rebalance"] < rows["sglang-deepep-normal"], rows
    res = run_system("sglang-lp", cfg)
    assert res.variant == "sglang-lp-normal" and min(res.planning) >= 100e-6
