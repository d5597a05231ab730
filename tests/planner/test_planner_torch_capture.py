"""The torch planner's capture-safe path (``sync=False``) does nothing a CUDA graph cannot capture,
checked on the CPU by ``zepp.planner.torch.host_traffic`` (every aten operation seen), for every
routing with a torch twin and every transport pair, the volumes and the hop tables, and through
``plan_batch`` as the device benchmark calls it. The guard's own controls: each kind of
operation it exists to catch is caught. The device's own forms of two building blocks (the
atomic-free count, the running maximum by shifts) equal the CPU's. The older checks of the same
conditions (no Tensor-to-Python conversion; every pair planned on the meta device, shapes only)
are here too."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zepp.planner.torch as tp
from planner_cases import random_placement, skewed_batch
from test_planner_torch import PAIRS, TWINNED_ROUTINGS
from zepp.planner import Stages, plan_batch
from zepp.planner.torch._ops import shifted_cummax, sorted_counts
from zepp.planner.torch.host_traffic import HostTraffic, forbid_host_traffic


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(3)
    pl = random_placement(rng, 3, 2, 2, 2)
    ids = skewed_batch(rng, pl.ranks, 9, 3, pl.num_experts, 1.0)
    ids[0, 2] = -1  # an absent token
    tp.device_placement(pl, "cpu")  # the per-placement tables are built on the host, before capture
    return pl, torch.as_tensor(ids)


def _plan_every_pair(name, ids, pl):
    r = tp.route(name, ids, pl, 0.25, sync=False, sweeps=1)
    for dispatch, combine in PAIRS:
        plan = tp.build_flows(r, dispatch, 8, combine, sync=False)
        plan.volumes, plan.dispatch, plan.combine
    return plan


@pytest.mark.parametrize("name", TWINNED_ROUTINGS)
def test_capture_safe_planning_has_no_host_traffic(case, name):
    """After one warm-up call (as before any capture: a routing's per-placement tables are made
    on first use and kept), nothing in the call moves data between host and device."""
    pl, ids = case
    _plan_every_pair(name, ids, pl)
    with forbid_host_traffic():
        plan = _plan_every_pair(name, ids, pl)
    assert plan.dispatch.count.dim() == 0  # the counts stay tensors


def test_plan_batch_as_captured_has_no_host_traffic(case):
    """What the device benchmark captures: ``plan_batch(..., sync=False, sweeps=1)``, its volumes
    and hop tables; and the result is the host-reading mode's plan."""
    pl, ids = case
    plan_batch(ids, pl, Stages("zepp", "zepp", "reduce"), 8, 0.25, sync=False, sweeps=1)  # the warm-up
    with forbid_host_traffic():
        p = plan_batch(ids, pl, Stages("zepp", "zepp", "reduce"), 8, 0.25, sync=False, sweeps=1)
        p.volumes, p.hop_tables
    want = plan_batch(ids, pl, Stages("zepp", "zepp", "reduce"), 8, 0.25, sync=True)
    assert int(p.routing.unplaced) == 0
    assert torch.equal(p.routing.slot, want.routing.slot)
    for phase in ("dispatch", "combine"):
        assert int(getattr(p, phase).count) == int(getattr(want, phase).count)


@pytest.mark.parametrize("what", ["item", "bool", "tensor from a list", "scalar assignment", "list index",
                                  "nonzero", "mask index", "mask assignment", "repeat_interleave", "unique"])
def test_the_guard_catches_what_capture_refuses(what):
    x = torch.arange(6)
    ops = {
        "item": lambda: x.sum().item(),
        "bool": lambda: bool(x[0] > 0),
        "tensor from a list": lambda: torch.as_tensor([1, 2]),
        "scalar assignment": lambda: x.clone().__setitem__(1, 7),
        "list index": lambda: x[[1, 2]],
        "nonzero": lambda: torch.nonzero(x),
        "mask index": lambda: x[x > 2],
        "mask assignment": lambda: x.clone().__setitem__(x > 2, torch.zeros((), dtype=x.dtype)),
        "repeat_interleave": lambda: torch.repeat_interleave(x, x),
        "unique": lambda: torch.unique(x),
    }
    with pytest.raises(HostTraffic, match="CUDA graph cannot capture"):
        with forbid_host_traffic():
            ops[what]()


def test_the_guard_lets_fixed_shape_work_through():
    x = torch.arange(6)
    with forbid_host_traffic():
        y = torch.repeat_interleave(x, x, output_size=15)
        z = torch.zeros(7, dtype=torch.int64).scatter_add_(0, x, x) + torch.full((), 3)
        w = torch.where(x > 2, x, -1).cumsum(0)
    assert y.numel() == 15 and int(z.sum()) == 15 + 21 and w.shape == (6,)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.sampled_from([1, 7, 384, 40000]), st.sampled_from([torch.int32, torch.int64]),
       st.integers(0, 2**16))
def test_sorted_counts_equal_bincount(n, num_keys, dtype, seed):
    """The device's atomic-free count (``_ops.sorted_counts``, used on a GPU from
    ``SORTED_COUNTS_FROM`` keys) gives ``bincount``'s counts, the drop bin ``num_keys`` left out,
    with nothing a CUDA graph refuses; for int16 and int32 sort types alike."""
    g = torch.Generator().manual_seed(seed)
    key = torch.randint(0, num_keys + 1, (n,), generator=g, dtype=torch.int64)
    if n:
        key[: n // 3] = num_keys // 2  # a hot bin
    want = torch.bincount(key, minlength=num_keys + 1)[:num_keys]
    with forbid_host_traffic():
        got = sorted_counts(key.to(dtype), num_keys)
    assert got.dtype == torch.int64 and torch.equal(got, want)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(1, 12), st.sampled_from([torch.int8, torch.int32, torch.int64, torch.float32]),
       st.integers(0, 2**16))
def test_shifted_cummax_equals_cummax(n, k, dtype, seed):
    """The device's running maximum along rows (``_ops.row_cummax`` off the CPU) is ``cummax``'s,
    negative values and every row length included, with nothing a CUDA graph refuses."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-100, 100, (n, k), generator=g).to(dtype)
    with forbid_host_traffic():
        got = shifted_cummax(x)
    assert got.dtype == dtype and torch.equal(got, torch.cummax(x, dim=1).values)


def test_capture_safe_mode_reads_nothing_back(monkeypatch):
    """With ``sync=False`` the planning path never converts a tensor to a Python value."""
    rng = np.random.default_rng(1)
    pl = random_placement(rng, 2, 2, 2, 2)
    ids = torch.as_tensor(skewed_batch(rng, 4, 8, 2, pl.num_experts, 1.0))
    tp.device_placement(pl, "cpu")  # the per-placement tables are built (with numpy) outside

    def forbidden(self, *a, **k):
        raise AssertionError("host read in the capture-safe planning path")

    for meth in ("item", "tolist", "__bool__", "__int__", "__index__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, meth, forbidden)
    for name in TWINNED_ROUTINGS:
        for sweeps in (None, 1):  # the default bounds, and the short form (fixed-capacity lists)
            r = tp.route(name, ids, pl, 0.25, sync=False, sweeps=sweeps)
            for dispatch, combine in PAIRS:
                plan = tp.build_flows(r, dispatch, 8, combine)
                plan.dispatch, plan.volumes
    monkeypatch.undo()


def test_capture_safe_path_runs_on_the_meta_device(monkeypatch):
    """On the meta device (shapes only, no data) every routing and transport pair plans with
    ``sync=False``: no host read and no operation whose output size depends on the data (the
    conditions of CUDA-graph capture). Hop-table capacities depend on the shape alone. The
    host-reading mode cannot run there (the test's own control)."""
    rng = np.random.default_rng(1)
    pl = random_placement(rng, 2, 2, 2, 2)
    ids = torch.as_tensor(skewed_batch(rng, 4, 8, 2, pl.num_experts, 1.0)).to("meta")
    import zepp.planner.torch.flows.gateway_volumes as gv
    import zepp.planner.torch.routing.zepp_assign as za
    import zepp.planner.torch.routing.zepp_vacate as zv

    for module, name in ((zv, "_MIN_CAPACITY"), (za, "_MIN_SPLIT"), (gv, "_MIN_HANDED")):
        monkeypatch.setattr(module, name, 1)  # the short form's lists shorter than the batch: every list path runs
    for name, sweeps in [(n, None) for n in TWINNED_ROUTINGS] + [("zepp", 1)]:
        r = tp.route(name, ids, pl, 0.25, sync=False, sweeps=sweeps)
        assert r.slot.shape == ids.shape and r.slot.device.type == "meta"
        for dispatch, combine in PAIRS:
            plan = tp.build_flows(r, dispatch, 8, combine, sync=False)
            assert plan.dispatch.count.device.type == "meta"
            assert plan.volumes.combine.rows.device.type == "meta"
            if dispatch != "allgather":
                assert plan.dispatch.capacity >= ids.numel()
    with pytest.raises(Exception):
        tp.route("zepp", ids, pl, 0.25, sync=True)
