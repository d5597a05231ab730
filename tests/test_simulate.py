"""Engine unit tests with hand-computed answers."""

import numpy as np
import pytest

from zepp.cluster import cluster_preset
from zepp.errors import ZeppInputError
from zepp.model import model_preset
from zepp.sim.layer import LayerBuilder
from zepp.sim.mechanics import Mechanics, Net
from zepp.sim.engine import SimulationError, TaskGraph, maxmin_rates, simulate

BW = 25e9


def cl(nodes=2, **kw):
    # GEMM curve of zepp.calibrate.HARDWARE: thin experts are bound by reading their weights
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


def test_maxmin_matches_hand_solution():
    # links: send0..3 = 0..3, recv4 = 4, recv5 = 5, dummy = 6
    cap = np.array([BW] * 6 + [np.inf])
    a = np.array([0, 1, 1, 2, 3])  # A: 0->4, B: 1->4, C: 1->5, D: 2->5, E: 3->5
    b = np.array([4, 4, 5, 5, 5])
    rate = maxmin_rates(a, b, cap)
    # recv5 saturates first at BW/3 (C, D, E); then recv4 splits BW between A and B
    assert rate == pytest.approx([BW / 2, BW / 2, BW / 3, BW / 3, BW / 3])


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


def test_gemm_roofline_switches_from_weights_to_flops():
    c = cl(nodes=1)
    spec = model_preset("k2")
    b = LayerBuilder(TaskGraph(c), c, spec, Net(), Mechanics())
    b.S, b.T = 2, 1
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
    c = cl(nodes=1)
    spec = model_preset("k2")
    b = LayerBuilder(TaskGraph(c), c, spec, Net(), Mechanics())
    b.S, b.T = 4, 1
    w = spec.hidden * spec.ffn * spec.dtype_bytes
    tab = b.gemm_tasks(np.zeros(3, np.int64), np.array([0, 1, 2]), 1, lambda k: k, "g")
    assert b.g.columns()["dur"][tab[0, 0]] == pytest.approx(3 * w / c.hbm_bw + c.kernel_launch)
