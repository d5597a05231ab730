"""The event engine (``zepp.sim.engine``) running task graphs (``zepp.sim.task_graph``): flows
sharing links, message costs, streams, priorities and dependencies on hand-computed answers; the
compiled loop against the Python loop."""

import numpy as np
import pytest

from zepp.cluster import cluster_preset
from zepp.errors import ZeppInputError
from zepp.sim.engine import native_available, simulate
from zepp.sim.task_graph import SimulationError, TaskGraph

BW = 25e9


def cl(nodes=2, **kw):
    # GEMM curve of zepp.sim.calibrate.HARDWARE: thin experts are bound by reading their weights
    return cluster_preset("a100", nodes, nic_bw=BW, nvlink_bw=100e9, nic_msg_cost=0.0, nvlink_msg_cost=0.0,
                          gemm_eff_max=0.5, gemm_rows_half=64.0, **kw)


def end_of(tl, i):
    return float(tl.end[i])


def test_two_flows_sharing_a_send_link_get_half_each():
    g = TaskGraph(cl())
    a = g.add_transfer(0, 4, 1e9, 0.0)
    b = g.add_transfer(0, 5, 1e9, 0.0)
    tl = simulate(g)
    assert end_of(tl, a) == pytest.approx(2e9 / BW)
    assert end_of(tl, b) == pytest.approx(2e9 / BW)


def test_freed_bandwidth_goes_to_the_remaining_flow():
    g = TaskGraph(cl())
    a = g.add_transfer(0, 4, 1e9, 0.0)
    c = g.add_transfer(0, 5, 2e9, 0.0)
    tl = simulate(g)
    assert end_of(tl, a) == pytest.approx(2e9 / BW)  # half rate until done
    assert end_of(tl, c) == pytest.approx(3e9 / BW)  # 1e9 at half rate, then 1e9 at full rate


def test_flow_limited_by_the_receive_side():
    g = TaskGraph(cl())
    a = g.add_transfer(0, 4, 1e9, 0.0)  # senders 0 and 1 are free, receiver 4 is shared
    b = g.add_transfer(1, 4, 1e9, 0.0)
    tl = simulate(g)
    assert end_of(tl, a) == pytest.approx(2e9 / BW)
    assert end_of(tl, b) == pytest.approx(2e9 / BW)


def test_message_cost_is_paid_before_bytes_flow():
    g = TaskGraph(cl())
    a = g.add_transfer(0, 4, 1e9, 30e-6)
    b = g.add_transfer(0, 5, 1e9, 0.0)  # alone on send0 for the first 30 us
    tl = simulate(g)
    # b: 30 us alone (0.75 GB), then shares; a: starts at 30 us
    t_share = (1e9 - 30e-6 * BW) / (BW / 2)
    assert end_of(tl, b) == pytest.approx(30e-6 + t_share)
    assert end_of(tl, a) == pytest.approx(30e-6 + t_share + (1e9 - t_share * BW / 2) / BW)


def test_intra_node_transfer_uses_nvlink():
    g = TaskGraph(cl())
    a = g.add_transfer(0, 1, 1e9, 5e-6)
    tl = simulate(g)
    assert end_of(tl, a) == pytest.approx(5e-6 + 1e9 / 100e9)
    assert tl.resource[a] == "nvl0>1"


def test_dependencies_and_stream_serialisation():
    g = TaskGraph(cl())
    x = g.add_fixed(0, 1e-3, kind="gemm")
    y = g.add_fixed(0, 2e-3, kind="gemm")  # same compute stream: runs after x
    z = g.add_transfer(0, 4, 0.5 * BW * 1e-3, 0.0, deps=y)  # 0.5 ms of bytes after y
    w = g.add_fixed(4, 1e-3, kind="gemm", deps=z)
    tl = simulate(g)
    assert (tl.start[x], tl.end[x]) == pytest.approx((0.0, 1e-3))
    assert (tl.start[y], tl.end[y]) == pytest.approx((1e-3, 3e-3))
    assert tl.end[z] == pytest.approx(3.5e-3)
    assert tl.end[w] == pytest.approx(4.5e-3)
    assert tl.latency == pytest.approx(4.5e-3)


def test_stream_runs_lowest_priority_ready_task_first():
    g = TaskGraph(cl())
    gate = g.add_fixed(1, 1e-3, kind="other")
    late = g.add_fixed(0, 1e-3, kind="gemm", prio=0, deps=gate)  # ready at 1 ms
    early = g.add_fixed(0, 1e-3, kind="gemm", prio=5)  # ready at once: runs first
    tl = simulate(g)
    assert tl.start[early] == pytest.approx(0.0)
    assert tl.start[late] == pytest.approx(1e-3)


def test_cycle_is_an_engine_error_not_bad_input():
    g = TaskGraph(cl())
    a = g.add_fixed(0, 1e-3)
    b = g.add_fixed(1, 1e-3, deps=a)
    g.after(b, a)
    with pytest.raises(SimulationError, match="cycle") as info:
        simulate(g)
    assert not isinstance(info.value, ZeppInputError)  # a bug in a graph builder, never the user's input
    with pytest.raises(SimulationError, match="different GPUs"):
        g.add_transfer(2, 2, 1.0, 0.0)


# ---------------------------------------------------------------- the compiled loop equals the Python loop

needs_native = pytest.mark.skipif(not native_available(), reason="zepp.sim._engine not built (no C compiler at install)")


def _random_graph(seed: int, nodes: int = 3, L: int = 4) -> TaskGraph:
    """Transfers of all sizes (tiny ones too), fixed tasks on every stream, priorities, chains,
    joins and fan-outs, several tasks per stream waiting at once."""
    rng = np.random.default_rng(seed)
    c = cluster_preset("a100", nodes, gpus_per_node=L)
    g = TaskGraph(c)
    R = c.ranks
    ids = []
    for _ in range(6):
        n = int(rng.integers(5, 60))
        src = rng.integers(0, R, n)
        dst = (src + rng.integers(1, R, n)) % R
        nbytes = np.where(rng.random(n) < 0.2, rng.integers(1, 400, n), rng.integers(10_000, 5_000_000, n))
        x = g.add_transfer(src, dst, nbytes.astype(float), rng.choice([0.0, 2e-6, 20e-6], n),
                           stream=rng.choice([None, "copy"]))
        f = g.add_fixed(rng.integers(0, R, n), rng.random(n) * 50e-6, kind="gemm",
                        stream=str(rng.choice(["compute", "proxy", "host"])),
                        prio=rng.integers(0, 5, n) if rng.random() < 0.5 else None)
        ids.extend([x, f])
        if len(ids) > 2:
            prev = ids[int(rng.integers(0, len(ids) - 2))]
            k = min(prev.size, x.size)
            g.after(prev[:k], x[:k])
            g.after(x[rng.integers(0, x.size)], f)
            g.after_all(ids[int(rng.integers(0, len(ids) - 2))][:3], f[: n // 2])  # edges go forward: no cycle
    return g


def _same(a, b) -> bool:
    return (np.array_equal(a.start, b.start, equal_nan=True) and np.array_equal(a.end, b.end, equal_nan=True)
            and a.events == b.events and a.latency == b.latency)


@needs_native
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("opts", [dict(), dict(rel_quantum=5e-4, rate_tol=1e-3), dict(quantum=0.0, rate_tol=0.0)])
def test_native_loop_gives_bit_identical_times_to_the_python_loop(seed, opts):
    g = _random_graph(seed)
    a = simulate(g, loop="python", **opts)
    b = simulate(g, loop="native", **opts)
    assert np.isfinite(a.end).all()
    assert _same(a, b)


@needs_native
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("opts", [dict(rel_quantum=5e-4, rate_tol=1e-3), dict(quantum=0.0, rate_tol=0.0)])
def test_native_loop_equals_python_loop_on_dense_all_to_alls(seed, opts):
    """Several messages per GPU pair of all-to-alls on 4 nodes, of many sizes and starts, share
    the NICs: the max-min filling needs many passes, so the compiled loop also runs its passes by
    link (past its first passes by flow), which must give the same rates."""
    rng = np.random.default_rng(seed)
    g = TaskGraph(cluster_preset("a100", 4, gpus_per_node=4))
    R = 16
    src, dst = np.nonzero(~np.eye(R, dtype=bool))
    for wave in range(3):
        rep = int(rng.integers(1, 4))
        s, d = np.repeat(src, rep), np.repeat(dst, rep)
        nbytes = rng.integers(20_000, 4_000_000, s.size).astype(float)
        g.add_transfer(s, d, nbytes, rng.choice([0.0, 2e-6, 5e-6], s.size) * (wave + 1))
    a = simulate(g, loop="python", **opts)
    b = simulate(g, loop="native", **opts)
    assert np.isfinite(a.end).all()
    assert _same(a, b)


@needs_native
def test_native_loop_equals_python_loop_on_every_simulated_system(monkeypatch):
    from zepp.registry import SYSTEMS, names_for
    from zepp.sim import run as simrun
    from zepp.sim.bench_jobs import make_config

    cfg = make_config(dict(cluster="a100", nodes=2, gpus_per_node=4, model="qwen", budget_mb=1.0, iters=1, warmup=1,
                           seed=0, traces=None))
    graphs = []
    orig = simrun.simulate

    def capture(g, **kw):
        graphs.append((g, kw))
        return orig(g, **kw)

    monkeypatch.setattr(simrun, "simulate", capture)
    for name in names_for("sim"):
        if not SYSTEMS[name].best_of:
            simrun.run_system(name, cfg)
    assert len(graphs) >= 10
    for g, kw in graphs:
        kw = dict(kw, labels=False)
        assert _same(simulate(g, loop="python", **kw), simulate(g, loop="native", **kw))


@needs_native
def test_native_loop_reports_a_cycle_like_the_python_loop():
    g = TaskGraph(cl())
    a = g.add_fixed(0, 1e-3)
    b = g.add_transfer(0, 4, 1e6, 0.0, deps=a)
    g.after(b, a)
    for loop in ("python", "native"):
        with pytest.raises(SimulationError, match="stuck after 0 of 2"):
            simulate(g, loop=loop)


def test_the_compiled_loop_is_built_in_ci():
    import os

    if not os.environ.get("CI"):
        pytest.skip("only CI promises a C compiler")
    assert native_available(), "CI installs with a C compiler: zepp.sim._engine must have been built"
