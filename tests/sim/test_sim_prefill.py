"""Zepp's prefill on DeepEP's chunked normal kernels: in-order sends (``zepp.sim.chunks.order_sends``)
and the ``zepp-deepep-lp`` row (Zepp's placement and flows, LPLB's per-batch balance)."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.cluster import cluster_preset
from zepp.model import model_preset
from zepp.planner.overlap.grouping import dispatch_group
from zepp.sim.calibrate import calibrated
from zepp.sim.chunks import add_pieces, order_sends, send_classes
from zepp.sim.engine import simulate
from zepp.sim.mechanics import MECHANICS
from zepp.sim.planning_cost import _lplb, planning_seconds, zepp_planning
from zepp.sim.run import Config, Shared
from zepp.sim.task_graph import TaskGraph


def test_send_class_is_the_receivers_dispatch_group_order():
    rng = np.random.default_rng(0)
    L, N = 8, 4
    owner, dst = rng.integers(0, L * N, 500), rng.integers(0, L * N, 500)
    far = owner != dst  # a message never goes to its own rows' GPU
    cls = send_classes(owner[far] // L, dst[far], L, N)
    assert (cls == dispatch_group(owner[far], dst[far], L, N) - 1).all()


def test_a_sender_starts_a_class_only_after_its_earlier_classes_are_sent():
    """GPU 0 sends two NVLink messages of class 1 and one of class 0 (pieces each), and two NIC
    messages of classes 1 and 2; GPU 1 sends one of class 1. Class 1 of GPU 0's NVLink starts
    when its class 0 has ended; NIC class 2 after NIC class 1; NIC and NVLink do not wait for
    each other, nor GPU 1 for GPU 0."""
    cl = cluster_preset("h200-8", 4, 8)
    g = TaskGraph(cl)
    src = np.array([0, 0, 0, 0, 0, 1])
    dst = np.array([2, 3, 4, 8, 16, 5])
    cross = (src // 8) != (dst // 8)
    cls = np.array([1, 1, 0, 1, 2, 1])
    pieces = np.array([3, 2, 4, 2, 2, 1])
    first, last = add_pieces(g, src, dst, np.full(6, 2e6), np.zeros(6), pieces, "dispatch")
    order_sends(g, src, cross, cls, first, last, cl.ranks)
    tl = simulate(g, nic_bw=46e9, nvlink_bw=20e9, labels=True)
    s, e = tl.start, tl.end
    assert min(s[first[0]], s[first[1]]) >= e[last[2]] > 0
    assert s[first[4]] >= e[last[3]]
    assert s[first[3]] == pytest.approx(0.0) and s[first[2]] == pytest.approx(0.0)
    assert s[first[5]] == pytest.approx(0.0)


def test_only_zepps_overlap_mechanics_order_their_sends():
    ordered = {name for name, m in MECHANICS.items() if m.ordered_sends}
    assert ordered == {"deepep-overlap"}
    users = {s.name for s in registry.SYSTEMS.values() if s.mechanics == "deepep-overlap"}
    assert users == {"zepp-deepep-overlap", "zepp-deepep-lp"}


def skewed_config(nodes: int = 2, tokens: int = 256) -> Config:
    cl, net = calibrated("h200-8", nodes, gpus_per_node=8)
    spec = model_preset("qwen")
    skew = (np.random.default_rng(3).zipf(1.6, (1, cl.ranks, tokens, spec.top_k)) % spec.num_experts).astype(np.int32)
    hist = np.bincount(skew.ravel(), minlength=spec.num_experts)[None].repeat(nodes, 0).astype(float)
    return Config(cl, spec, net, hist, skew, warmup=0)


def test_zepp_deepep_lp_is_zepps_placement_and_flows_with_the_lp_balance():
    s = registry.system("zepp-deepep-lp")
    assert (s.placement, s.routing, s.dispatch, s.combine) == ("zepp", "lp", "zepp", "reduce")
    assert "zepp-deepep-lp" in registry.system("zepp-deepep").best_of
    cfg = skewed_config()
    sh = Shared()
    lp = sh.plan(s, cfg, 0)
    water = sh.plan(registry.system("zepp-deepep-overlap"), cfg, 0)
    assert lp.routing.placement is water.routing.placement  # the same placement, another routing
    assert lp.routing.rows_per_rank().max() <= water.routing.rows_per_rank().max()


def test_zepp_deepep_lp_is_charged_the_lp_solve_and_zepps_flows_without_the_water_fill():
    s = registry.system("zepp-deepep-lp")
    cl, net = calibrated("h200-8", 2, gpus_per_node=8)
    spec = model_preset("k2")
    T = 2048
    prologue, planning = planning_seconds(s.planning, s, cl, spec, T, net)
    entries = cl.ranks * T * spec.top_k
    flows = zepp_planning("zepp", "reduce", False, entries, cl.hbm_bw, route=False)
    assert planning == pytest.approx(_lplb(s, cl, T * spec.top_k) + flows)
    assert flows < zepp_planning("zepp", "reduce", False, entries, cl.hbm_bw)
    _, zepp_plan = planning_seconds("zepp", replace(s, routing="zepp"), cl, spec, T, net)
    assert prologue - planning == pytest.approx(planning_seconds("zepp", s, cl, spec, T, net)[0] - zepp_plan)


def test_pre_dispatched_rows_are_exactly_those_no_plan_can_reroute():
    """Flagged hops go from the owner, inside its node, to the GPU holding the single copy of one
    of the token's experts; every such direct hop of the plan is flagged."""
    from zepp.sim.layer_work import LayerWork
    from zepp.sim.predispatch import plan_free_hops, single_copy_slots

    cfg = skewed_config(tokens=128)
    plan = Shared().plan(registry.system("zepp-deepep-lp"), cfg, 0)
    w = LayerWork.of(plan)
    P, R, L, T = plan.routing.placement, cfg.cluster.ranks, cfg.cluster.gpus_per_node, 128
    single = single_copy_slots(P)
    assert single.sum() == (P.replica_count[P.slot_expert[P.slot_expert >= 0]] == 1).sum()
    assert 0 < single.sum() < single.size
    h = w.dispatch
    free = plan_free_hops(h, w.owner, w.token, w.comp, w.slot, single, R, T, L)
    assert free.any() and not free.all()
    held = {(int(c), int(o), int(t)) for c, o, t, s in zip(w.comp, w.owner, w.token, w.slot) if single[s]}
    direct = (h.stage == 0) & (h.src == h.owner) & (h.src // L == h.dst // L)
    want = np.array([d and (int(y), int(o), int(t)) in held for d, y, o, t in zip(direct, h.dst, h.owner, h.token)])
    assert (free == want).all()


def test_pre_dispatch_sends_only_after_the_gather_and_the_rest_after_planning():
    from zepp.sim.run import simulate_plan

    cfg = skewed_config(tokens=128)
    s = registry.system("zepp-deepep-lp")
    tl, planning, _ = simulate_plan(cfg, s, Shared().plan(s, cfg, 0), keep=True)
    kind, label = np.array(tl.kind), np.array(tl.label)
    plan_end = tl.end[kind == "plan"].min()
    gather_end = tl.end[kind == "allgather"].max()
    pre = label == "pre-dispatch"
    assert pre.sum() == cfg.cluster.ranks and tl.start[pre].min() >= gather_end
    moves = (kind == "dispatch") & ~pre & (label != "dispatch kernels")
    early = moves & (tl.start < plan_end)
    assert early.any()  # some rows travel during planning ...
    assert (tl.rank[early] // 8 == np.array([int(r.split(">")[1]) if ">" in r else -1 for r in np.array(tl.resource)[early]]) // 8).all()  # ... over NVLink only
