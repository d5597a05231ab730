"""The torch planner equals the numpy planner element for element: routing ``slot [R, T, k]``
and every column of both hop tables, for every routing and transport pair, on random clusters
(1-4 nodes x 1-4 GPUs), skews and degenerate batches (T=0, k=1, one hot expert, one node,
missing entries), with host reads allowed (``sync=True``) and without (``sync=False``, the
capturable path). On CUDA tensors too when a GPU is present."""

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zepp.planner.torch as tp
from planner_cases import ROUTING_CASE, assert_same_flows, random_placement, routing_case, skewed_batch
from test_planner_volumes import assert_same_volumes
from zepp.errors import ZeppInputError
from zepp.planner import Stages, plan_batch
from zepp.planner.flows import build_flows
from zepp.planner.routing import ROUTINGS, route
from zepp.planner.types import HOP_COLUMNS

COLS = tuple(HOP_COLUMNS)
TWINNED_ROUTINGS = ROUTINGS.having("torch_twin")  # what tp.route plans (which: test_planner_torch_tree.py)
PAIRS = (("a2av", None), ("dedup", None), ("relay", None), ("relay", "reduce"), ("relay", "reduce-direct"),
         ("zepp", None), ("zepp", "reduce-direct"), ("zepp", "dedup"), ("zepp", "a2av"), ("allgather", None))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def assert_same_plan(ids, pl, name, relaxation, device, sync):
    ref = route(name, ids, pl, relaxation)
    got = tp.route(name, torch.as_tensor(ids, device=device), pl, relaxation, sync=sync)
    assert got.slot.device.type == device
    np.testing.assert_array_equal(got.slot.cpu().numpy(), ref.slot, err_msg=f"routing {name}")
    if got.unplaced is not None:
        assert int(got.unplaced) == 0
    for dispatch, combine in PAIRS:
        want = build_flows(ref, dispatch, 16, combine)
        have = tp.build_flows(got, dispatch, 16, combine)
        for phase in ("dispatch", "combine"):
            w, h = getattr(want, phase), getattr(have, phase)
            assert int(h.count) == w.size, f"{name} {dispatch}/{combine} {phase}: {int(h.count)} hops, want {w.size}"
            hn = h.to_numpy()
            for c in COLS:
                np.testing.assert_array_equal(getattr(hn, c), getattr(w, c),
                                              err_msg=f"{name} {dispatch}/{combine} {phase}.{c}")
                assert getattr(hn, c).dtype == getattr(w, c).dtype
            # the buffer tail past the count is zero (fixed-capacity layout)
            assert not bool(h.src[int(h.count):].any())
        assert have.to_numpy().transport == want.transport
        for phase in (0, 1):  # the volumes from counts, cell for cell
            assert_same_volumes(have.volumes[phase].to_numpy(), want.volumes[phase], f"{name} {dispatch}/{combine}")


# routing cases with a hot expert, missing entries and absent tokens
cases = st.fixed_dictionaries({**ROUTING_CASE, "T": st.integers(0, 10), "hot": st.booleans(),
                               "missing": st.sampled_from([0.0, 0.0, 0.2, 1.0])})


def make_case(case):
    rng = np.random.default_rng(case["seed"])
    pl, ids = routing_case(case, rng)
    if case["hot"]:  # one hot expert: every token picks expert 0 (ids need not be distinct)
        ids[..., 0] = 0
    if case["missing"]:
        ids[rng.random(ids.shape) < case["missing"] * 0.5] = -1  # missing entries
        ids[:, rng.random(ids.shape[1]) < case["missing"] * 0.3] = -1  # absent tokens (ragged ranks)
    return pl, ids


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.sampled_from(TWINNED_ROUTINGS), st.booleans())
def test_torch_planner_equals_numpy(case, name, sync):
    pl, ids = make_case(case)
    for device in DEVICES:
        assert_same_plan(ids, pl, name, case["relaxation"], device, sync if device == "cpu" else False)


@pytest.mark.parametrize("device", DEVICES)
def test_zepp_on_a_realistic_batch_both_modes(device):
    """A 4 x 4 cluster with the zepp placement and a skewed batch large enough for the vacate pass
    to move tokens over several rounds; sync and capture-safe modes agree with numpy."""
    from zepp.planner.placement import make_placement

    rng = np.random.default_rng(3)
    E, nodes, L = 64, 4, 4
    ids = skewed_batch(rng, nodes * L, 96, 4, E, 1.2)
    hist = np.stack([np.bincount(ids[n * L:(n + 1) * L].ravel(), minlength=E) for n in range(nodes)])
    pl = make_placement("zepp", hist, E, nodes * L, L)
    assert (pl.replica_count > 1).any()
    for sync in ((True, False) if device == "cpu" else (False,)):
        assert_same_plan(ids, pl, "zepp", 0.1, device, sync)


def test_backend_follows_the_input_type():
    rng = np.random.default_rng(0)
    pl = random_placement(rng, 2, 2, 2, 1)
    ids = skewed_batch(rng, 4, 5, 2, pl.num_experts, 1.0)
    stages = Stages("zepp", "zepp")
    p_np = plan_batch(ids, pl, stages, 8)
    p_t = plan_batch(torch.as_tensor(ids), pl, stages, 8)
    assert isinstance(p_np.routing.slot, np.ndarray) and isinstance(p_t.routing.slot, torch.Tensor)
    assert isinstance(p_t.dispatch, tp.TorchHops)
    p_forced = plan_batch(ids, pl, stages, 8, backend="torch")
    np.testing.assert_array_equal(p_forced.routing.slot.numpy(), p_np.routing.slot)
    assert_same_flows(p_t.to_numpy(), p_np)
    host = plan_batch(torch.as_tensor(ids), pl, stages, 8, host=True)
    host.validate()
    assert_same_flows(host, p_np)
    assert_same_flows(plan_batch(torch.as_tensor(ids), pl, stages, 8, backend="numpy"), p_np)
    with pytest.raises(ZeppInputError, match="backend"):
        plan_batch(ids, pl, stages, 8, backend="jax")
    with pytest.raises(ZeppInputError, match="no torch planner"):
        plan_batch(ids, pl, Stages("moonep", "dedup"), 8, backend="torch")


def test_bad_input_is_named():
    rng = np.random.default_rng(0)
    pl = random_placement(rng, 1, 2, 2, 0)
    with pytest.raises(ZeppInputError, match="expert id 99"):
        tp.route("home", torch.full((2, 1, 1), 99), pl)
    with pytest.raises(ZeppInputError, match="ranks"):
        tp.route("home", torch.zeros((3, 1, 1), dtype=torch.int64), pl)
    with pytest.raises(ZeppInputError, match="integers"):
        tp.route("home", torch.zeros((2, 1, 1)), pl)
    with pytest.raises(ZeppInputError, match="moonep"):
        tp.route("moonep", torch.zeros((2, 1, 1), dtype=torch.int64), pl)
    r = tp.route("home", torch.zeros((2, 1, 1), dtype=torch.int64), pl)
    with pytest.raises(ZeppInputError, match="needs a relay or zepp dispatch"):
        tp.build_flows(r, "a2av", 8, "reduce")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_fewer_sweeps_are_flagged_or_exact(case):
    """With one water-fill sweep (and the vacate pass's short move lists) the routing is either
    the numpy planner's or says it is not (``shortfall() > 0``); ``plan_batch(..., host=True)``
    then re-plans and is always exact."""
    pl, ids = make_case(case)
    ref = route("zepp", ids, pl, case["relaxation"])
    t = torch.as_tensor(ids)
    got = tp.route("zepp", t, pl, case["relaxation"], sync=False, sweeps=1)
    if int(got.shortfall()) == 0:
        np.testing.assert_array_equal(got.slot.numpy(), ref.slot)
    else:
        with pytest.raises(tp.IncompletePlan):
            got.to_numpy()
    plan = plan_batch(t, pl, Stages("zepp", "zepp"), 16, case["relaxation"], sweeps=1, sync=False, host=True)
    assert_same_flows(plan, build_flows(ref, "zepp", 16))


def test_zero_sweeps_leave_demand_unplaced():
    """The flag can fire: no sweep at all leaves every multi-replica entry unplaced."""
    rng = np.random.default_rng(5)
    pl = random_placement(rng, 2, 2, 2, 2)
    assert (pl.replica_count > 1).any()
    ids = np.full((4, 3, 1), int(np.flatnonzero(pl.replica_count > 1)[0]), np.int32)
    got = tp.route("zepp", torch.as_tensor(ids), pl, 0.25, sync=False, sweeps=0)
    assert int(got.unplaced) == ids.size
    with pytest.raises(tp.IncompletePlan):
        plan_batch(torch.as_tensor(ids), pl, Stages("zepp", "zepp"), 8, 0.25, sync=False, sweeps=0).to_numpy()
    assert plan_batch(torch.as_tensor(ids), pl, Stages("zepp", "zepp"), 8, 0.25, sweeps=0, host=True).routing.slot.size


def _realistic_case(seed=3, T=96):
    """A 4 x 4 cluster with the zepp placement and a skewed batch (the vacate pass moves tokens
    over several rounds)."""
    from zepp.planner.placement import make_placement

    rng = np.random.default_rng(seed)
    E, nodes, L = 64, 4, 4
    ids = skewed_batch(rng, nodes * L, T, 4, E, 1.2)
    hist = np.stack([np.bincount(ids[n * L:(n + 1) * L].ravel(), minlength=E) for n in range(nodes)])
    return make_placement("zepp", hist, E, nodes * L, L), ids


@pytest.mark.parametrize("token_share,min_capacity,split_share", [(1, 1, 1), (2, 1, 16), (4, 1, 4), (64, 1, 16),
                                                                 (2, 1024, 16), (1, 1, 4096)])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_short_lists_are_exact_or_flagged(monkeypatch, token_share, min_capacity, split_share, seed):
    """The fixed-capacity lists of the short form (``sweeps`` given, ``sync=False``: the vacate
    pass's candidate tokens and moves, the assignment's entries of split groups), made short on
    purpose: the routing is the numpy planner's unless ``overflow`` is set, and then
    ``to_numpy`` refuses it and ``plan_batch(..., host=True)`` re-plans with full lists (exact)."""
    import zepp.planner.torch.flows.gateway_volumes as gv
    import zepp.planner.torch.routing.zepp_assign as za
    import zepp.planner.torch.routing.zepp_vacate as zv

    monkeypatch.setattr(zv, "_TOKEN_SHARES", (1, token_share, token_share + 1))
    monkeypatch.setattr(zv, "_MIN_CAPACITY", min_capacity)
    monkeypatch.setattr(za, "_SPLIT_SHARE", split_share)
    monkeypatch.setattr(za, "_MIN_SPLIT", min_capacity)
    monkeypatch.setattr(gv, "_MIN_HANDED", min_capacity)
    pl, ids = _realistic_case(seed)
    monkeypatch.setattr(gv, "_HANDED_SHARE", token_share * pl.nodes)  # G / token_share handed rows
    ref = route("zepp", ids, pl, 0.1)
    t = torch.as_tensor(ids)
    got = tp.route("zepp", t, pl, 0.1, sync=False, sweeps=1)
    assert got.overflow is not None and got.overflow.dtype == torch.bool
    if not bool(got.overflow):
        assert int(got.shortfall()) == int(got.unplaced)
        np.testing.assert_array_equal(got.slot.numpy(), ref.slot)
    else:
        assert int(got.shortfall()) >= 1
        with pytest.raises(tp.IncompletePlan, match="overflowed"):
            got.to_numpy()
    if token_share == 64 or split_share == 4096:  # lists too short for this batch
        assert bool(got.overflow)
    assert got.short
    for pair in (("zepp", None), ("zepp", "reduce-direct"), ("relay", "reduce")):  # the flows' short lists
        want = build_flows(ref, pair[0], 16, pair[1]).volumes
        have = tp.build_flows(got, pair[0], 16, pair[1], sync=False).volumes
        overflow = any(v.overflow is not None and bool(v.overflow) for v in have)
        if pair[0] == "zepp" and token_share == 64:  # a sixty-fourth of the tokens: too few handed rows
            assert overflow
        if overflow:
            with pytest.raises(tp.IncompletePlan, match="handed rows"):
                have.dispatch.to_numpy()
        elif not bool(got.overflow):
            for phase in (0, 1):
                assert_same_volumes(have[phase].to_numpy(), want[phase], f"short {pair}")
    plan = plan_batch(t, pl, Stages("zepp", "zepp"), 16, 0.1, sweeps=1, sync=False, host=True)
    assert_same_flows(plan, build_flows(ref, "zepp", 16))
    full = tp.route("zepp", t, pl, 0.1, sync=False)  # the default bound: lists that cannot overflow
    assert full.overflow is None
    np.testing.assert_array_equal(full.slot.numpy(), ref.slot)


@pytest.mark.parametrize("sync,sweeps", [(True, None), (False, None), (False, 1)])
def test_vacate_targets_without_node_masks(monkeypatch, sync, sweeps):
    """Past ``_MASK_NODES`` nodes a move's target is read off the candidate nodes in turn (no bit
    masks): the same routing as numpy, in every mode."""
    import zepp.planner.torch.routing.zepp_vacate as zv

    monkeypatch.setattr(zv, "_MASK_NODES", 1)
    pl, ids = _realistic_case(4)
    got = tp.route("zepp", torch.as_tensor(ids), pl, 0.1, sync=sync, sweeps=sweeps)
    np.testing.assert_array_equal(got.slot.numpy(), route("zepp", ids, pl, 0.1).slot)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_plan_is_captured_in_a_cuda_graph():
    """Routing and flows captured once in a CUDA graph for a fixed batch shape; replays on new
    ids (copied into the static input) equal the numpy planner's plan."""
    from zepp.planner.placement import make_placement

    rng = np.random.default_rng(11)
    E, nodes, L = 64, 4, 4
    batches = [skewed_batch(rng, nodes * L, 48, 4, E, 1.2) for _ in range(3)]
    hist = np.stack([np.bincount(batches[0][n * L:(n + 1) * L].ravel(), minlength=E) for n in range(nodes)])
    pl = make_placement("zepp", hist, E, nodes * L, L)
    static = torch.as_tensor(batches[0], device="cuda").long()
    tp.device_placement(pl, "cuda")
    run = lambda: plan_batch(static, pl, Stages("zepp", "zepp"), 16, 0.25, sweeps=1)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for ids in batches:
        static.copy_(torch.as_tensor(ids, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        got = out.to_numpy()
        ref = route("zepp", ids, pl, 0.25)
        assert_same_flows(got, build_flows(ref, "zepp", 16))


def test_device_part_seconds_interpolates_recorded_device_figures():
    from zepp.sim.planner_times import device_part_seconds, recorded_times

    assert recorded_times()["records"], "the data file holds the measured CPU figures"
    cpu_only = {"records": recorded_times()["records"], "device_records": []}
    assert device_part_seconds("route:zepp", 10**6, data=cpu_only) is None  # CPU figures are no device figures
    rows = [{"entries": 1000, "parts_ms": {"route:zepp": 0.2}}, {"entries": 3000, "parts_ms": {"route:zepp": 0.6}}]
    data = {"device_records": [{"cuda_graph": True, "hbm_bw": 4.8e12, "measured_at": "x", "rows": rows}]}
    assert device_part_seconds("route:zepp", 10, data=data) == pytest.approx(0.2e-3)  # floor
    assert device_part_seconds("route:zepp", 2000, data=data) == pytest.approx(0.4e-3)  # linear
    assert device_part_seconds("route:zepp", 5000, data=data) == pytest.approx(1.0e-3)  # last slope
    assert device_part_seconds("route:zepp", 5000, hbm_bw=2.4e12, data=data) == pytest.approx(0.2e-3 + 1.6e-3)
    assert device_part_seconds("flows:zepp/reduce", 5000, data=data) is None


def _dispatcher_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    """One rank: the same batches planned by the numpy planner and by the torch planner
    (``dispatcher.planner = "torch"``; the numpy path is made to fail), identity experts."""
    import torch.distributed as dist

    import zepp.planner.batch as B
    import zepp.runtime.dispatcher as D
    from zepp.model import MoESpec
    from zepp.runtime.rank_process import leave_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        rng = np.random.default_rng(7)
        E, L = 8, 1
        pl = random_placement(rng, world // L, L, E // world, 2)
        spec = MoESpec("tiny", E, 3, 8, 4, 4)
        results = {}
        numpy_plan = B._plan_numpy
        for planner in ("numpy", "torch"):
            B._plan_numpy = numpy_plan if planner == "numpy" else _forbidden
            d = D.Dispatcher(spec, pl, routing="zepp", relaxation=0.25, dispatch="zepp")
            if planner == "torch":
                d.planner = "torch"
            ys, tables = [], []
            for b in range(2):
                g = torch.Generator().manual_seed(100 * b + rank)
                T = (5 + 3 * rank) if (b, rank) != (1, world - 1) else 0  # ragged; in batch 1 rank 1 holds none
                x = torch.randn(T, spec.hidden, generator=g)
                ids = torch.as_tensor(np.random.default_rng(1000 * b + rank).integers(0, E, size=(T, spec.top_k)))
                w = torch.rand(T, spec.top_k, generator=g)
                inputs, h = d.dispatch(x, ids, w)
                ys.append(d.combine(inputs.rows.clone(), h))
                tables.append({f"{ph}.{c}": getattr(getattr(d.last_plan, ph), c) for ph in ("dispatch", "combine")
                               for c in COLS})
            results[planner] = (ys, tables)
            del d  # its node and rail groups go with leave_group
        B._plan_numpy = numpy_plan
        for (y0, t0), (y1, t1) in [(results["numpy"], results["torch"])]:
            for a, b in zip(y0, y1):
                assert torch.equal(a, b)
            for a, b in zip(t0, t1):
                for key in a:
                    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        Path(out_dir, f"ok{rank}").write_text("ok")
    except BaseException:
        dist.destroy_process_group()  # no barrier: the peer may be gone
        raise
    leave_group()  # in order: no subgroup outlives the process group (a rare SIGABRT at exit)


def _forbidden(*a, **k):
    raise AssertionError("the numpy planner ran although planner='torch'")


def test_dispatcher_plans_with_the_torch_planner(tmp_path):
    """Two gloo ranks on two nodes: ``Dispatcher.plan`` with ``planner = "torch"`` gives the
    numpy planner's plans (every hop column) and bit-identical layer outputs, with a ragged batch
    (one rank holds no token). Two processes only: spawning is slow on the shared machine."""
    import torch.multiprocessing as mp

    world = 2
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(_dispatcher_worker, args=(world, init, str(tmp_path)), nprocs=world, join=True,
                       start_method="spawn")
    assert sorted(p.name for p in tmp_path.glob("ok*")) == [f"ok{r}" for r in range(world)]
