"""Intra-node swaps (PAPER.md section 2, item 6)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zepp.errors import ZeppInputError
from zepp.planner.placement import make_placement
from zepp.planner.types import Placement
from zepp.planner.adaptation.swaps import gate_swaps, gpu_loads, out_of_band, plan_swaps

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def swap_cases(draw):
    n = draw(st.integers(1, 3))
    L = draw(st.integers(1, 4))
    per = draw(st.integers(1, 3))
    extra = draw(st.integers(0, 3))
    E = n * L * per
    R = n * L
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    name = draw(st.sampled_from(["zepp", "eplb", "eplb-distinct", "epic", "home"]))
    hist = rng.integers(0, 30, size=(n, E))
    p = make_placement(name, hist, E, R, L, extra)
    kind = draw(st.sampled_from(["pareto", "one-hot", "zero", "uniform"]))
    size = p.slot_expert.size
    if kind == "pareto":
        load = (rng.pareto(0.8, size=size) * 10).astype(np.int64)
    elif kind == "one-hot":
        load = np.zeros(size, dtype=np.int64)
        load[rng.integers(size)] = 1000
    elif kind == "zero":
        load = np.zeros(size, dtype=np.int64)
    else:
        load = rng.integers(0, 100, size=size)
    load[p.slot_expert.ravel() < 0] = 0
    C = draw(st.sampled_from([0.0, 0.1, 0.25, 0.5]))
    limit = draw(st.sampled_from([1, 2, 8]))
    return p, load, C, limit


@SETTINGS
@given(swap_cases())
def test_swap_invariants(case):
    p, load, C, limit = case
    plan = plan_swaps(p, load, C, max_changes_per_gpu=limit)
    q = plan.placement
    L, R, S = p.gpus_per_node, p.ranks, p.slots_per_rank
    old, new = p.slot_expert, q.slot_expert
    assert new.shape == old.shape
    old_gl, new_gl = gpu_loads(load, R), gpu_loads(plan.slot_load, R)
    band = out_of_band(old_gl, L, C)
    for n in range(p.nodes):
        rows = slice(n * L, (n + 1) * L)
        # the node keeps its experts, and each (expert, load) pair moves as one
        assert Counter(old[rows].ravel().tolist()) == Counter(new[rows].ravel().tolist())
        pairs_old = Counter(zip(old[rows].ravel().tolist(), load.reshape(R, S)[rows].ravel().tolist()))
        pairs_new = Counter(zip(new[rows].ravel().tolist(), plan.slot_load.reshape(R, S)[rows].ravel().tolist()))
        assert pairs_old == pairs_new
        assert new_gl[rows].max() <= old_gl[rows].max(), "a node's busiest GPU got busier"
        if not band[n]:
            assert np.array_equal(old[rows], new[rows]), "an in-band node was changed"
    for r in range(R):
        before = Counter(old[r][old[r] >= 0].tolist())
        after = Counter(new[r][new[r] >= 0].tolist())
        for e, c in after.items():
            assert c <= max(before.get(e, 0), 1), f"expert {e} doubled up on GPU {r}"
        assert (old[r] != new[r]).sum() <= limit
    # copies: exactly the slots whose expert changed to a real expert, intra-node, from a holder
    changed = np.flatnonzero((old.ravel() != new.ravel()) & (new.ravel() >= 0))
    c = plan.copies
    assert c.shape == (changed.size, 3)
    assert sorted(c[:, 1].tolist()) == changed.tolist()
    if c.size:
        assert (c[:, 0] // (L * S) == c[:, 1] // (L * S)).all()
        assert (old.ravel()[c[:, 0]] == c[:, 2]).all()
        assert (new.ravel()[c[:, 1]] == c[:, 2]).all()
    again = plan_swaps(p, load, C, max_changes_per_gpu=limit)
    assert np.array_equal(again.placement.slot_expert, new) and np.array_equal(again.copies, c)


def test_swap_balances_a_lopsided_pair():
    p = Placement(np.array([[0, 1], [2, 3]]), 4, 2)
    plan = plan_swaps(p, np.array([10, 10, 0, 0]), 0.25)
    assert gpu_loads(plan.slot_load, 2).tolist() == [10, 10]
    # heavy slot 0 (expert 0) trades with the light GPU's first slot (expert 2)
    assert plan.placement.slot_expert.tolist() == [[2, 1], [0, 3]]
    assert sorted(map(tuple, plan.copies.tolist())) == [(0, 2, 0), (2, 0, 2)]


def test_swap_moves_into_an_empty_slot():
    p = Placement(np.array([[0, 1], [2, -1]]), 3, 2)
    # GPU loads 10 / 2. Best new max is 8, by 8<->2 (experts 0, 2) or by moving expert 1
    # (load 2) into the empty slot; the tie goes to the smaller load change: the move.
    plan = plan_swaps(p, np.array([8, 2, 2, 0]), 0.0)
    assert plan.placement.slot_expert.tolist() == [[0, -1], [2, 1]]
    assert plan.copies.tolist() == [[1, 3, 1]]


def test_swap_never_duplicates_on_a_gpu():
    # both GPUs hold experts 0 and 1: any exchange would put a second copy on a GPU
    p = Placement(np.array([[0, 1], [1, 0]]), 2, 2)
    plan = plan_swaps(p, np.array([10, 10, 0, 0]), 0.0)
    assert np.array_equal(plan.placement.slot_expert, p.slot_expert)
    assert plan.copies.shape == (0, 3)


def test_swap_needs_a_gain_of_at_least_one():
    p = Placement(np.array([[0], [1]]), 2, 2)
    plan = plan_swaps(p, np.array([5, 4]), 0.0)  # swapping gives max 5 again: no gain
    assert np.array_equal(plan.placement.slot_expert, p.slot_expert)


def test_swap_limits():
    p = Placement(np.array([[0, 1], [2, 3]]), 4, 2)
    load = np.array([10, 10, 0, 0])
    for kw in ({"max_rounds": 0}, {"candidates": 0}, {"max_changes_per_gpu": 0}):
        plan = plan_swaps(p, load, 0.25, **kw)
        assert np.array_equal(plan.placement.slot_expert, p.slot_expert)


def test_swap_errors():
    p = Placement(np.array([[0, 1], [2, -1]]), 3, 2)
    with pytest.raises(ZeppInputError, match=r"\[4\]"):
        plan_swaps(p, np.zeros(3, int), 0.25)
    with pytest.raises(ZeppInputError, match="negative"):
        plan_swaps(p, np.array([1, -1, 0, 0]), 0.25)
    with pytest.raises(ZeppInputError, match="empty"):
        plan_swaps(p, np.array([1, 1, 0, 5]), 0.25)
    with pytest.raises(ZeppInputError, match="relaxation"):
        plan_swaps(p, np.zeros(4, int), -0.5)


# ----------------------------------------------------------------------------- gate_swaps


@SETTINGS
@given(swap_cases(), st.sampled_from([0.0, 1e-6, 1.0]), st.sampled_from([0.0, 1e-3, 1e3]))
def test_gate_keeps_or_reverts_whole_nodes(case, row_s, copy_s):
    p, load, _, limit = case
    full = plan_swaps(p, load, 0.0, max_changes_per_gpu=limit)
    gated = gate_swaps(p, full, load, row_s, copy_s)
    L, R, S = p.gpus_per_node, p.ranks, p.slots_per_rank
    old_max = gpu_loads(load, R).reshape(-1, L).max(1)
    new_max = gpu_loads(full.slot_load, R).reshape(-1, L).max(1)
    kept_copies = set(map(tuple, gated.copies.tolist()))
    for n in range(p.nodes):
        rows = slice(n * L, (n + 1) * L)
        same_as_plan = np.array_equal(gated.placement.slot_expert[rows], full.placement.slot_expert[rows])
        same_as_old = np.array_equal(gated.placement.slot_expert[rows], p.slot_expert[rows])
        assert same_as_plan or same_as_old
        node_copies = {tuple(c) for c in full.copies.tolist() if c[1] // (L * S) == n}
        if not same_as_plan:  # reverted: its loads are the input's, and none of its copies run
            assert np.array_equal(gated.slot_load.reshape(R, S)[rows], load.reshape(R, S)[rows])
            assert not node_copies & kept_copies
        elif not same_as_old:
            assert node_copies <= kept_copies
            assert (old_max[n] - new_max[n]) * row_s > 0, "a node kept swaps that gain nothing"
        if row_s == 0.0:
            assert same_as_old, "with GEMMs free no swap can pay"
        if copy_s == 0.0 and row_s > 0 and new_max[n] < old_max[n]:
            assert same_as_plan, "free copies: every node whose busiest GPU got lighter keeps its swaps"


def _two_gpu_case(heavy: int):
    """One node of 2 GPUs x 2 slots: GPU 0 holds experts 0, 1 (loads ``heavy``, ``heavy``),
    GPU 1 expert 2 (load 1) and an empty slot. The swap exchanges experts 0 and 2: GPU 0 gets
    expert 2 (its other slot, load ``heavy``, hides that copy), GPU 1 gets expert 0 (nothing
    hides it)."""
    p = Placement(np.array([[0, 1], [2, -1]], np.int32), 3, 2)
    load = np.array([heavy, heavy, 1, 0], np.int64)
    return p, load, plan_swaps(p, load, 0.0)


def test_gate_counts_only_the_copy_time_the_other_gemms_do_not_hide():
    p, load, full = _two_gpu_case(100)
    assert full.placement.slot_expert.tolist() == [[2, 1], [0, -1]]  # GPU 0's max: 200 -> 101
    row_s = 1.0
    # GPU 1's copy is fully exposed: the node keeps its swaps while the copy is under 99 rows' time
    assert gate_swaps(p, full, load, row_s, copy_seconds=99.0 - 1e-6).num_swapped_slots == 2
    assert gate_swaps(p, full, load, row_s, copy_seconds=99.0 + 1e-6).num_swapped_slots == 0
    # the same copies counted blocking on GPU 0 (hidden there by 100 rows) would not change that:
    # only the larger exposed time decides
    kept = gate_swaps(p, full, load, row_s, 0.0)
    assert np.array_equal(kept.placement.slot_expert, full.placement.slot_expert)
    assert np.array_equal(kept.slot_load, full.slot_load)
    assert np.array_equal(kept.copies, full.copies)


def test_gate_hides_a_copy_behind_the_gpus_other_gemms():
    # GPU 1 keeps a loaded slot (expert 3, load 40): its incoming copy hides behind 40 rows of GEMM
    p = Placement(np.array([[0, 1], [2, 3]], np.int32), 4, 2)
    load = np.array([100, 100, 50, 40], np.int64)
    full = plan_swaps(p, load, 0.0)
    assert full.placement.slot_expert.tolist() == [[2, 1], [0, 3]]  # max 200 -> 150: gain 50 rows
    # exposed: GPU 0 copy - 100 rows, GPU 1 copy - 40 rows; kept while copy - 40 < 50
    assert gate_swaps(p, full, load, 1.0, copy_seconds=89.0).num_swapped_slots == 2  # blocking, 89 > 50
    assert gate_swaps(p, full, load, 1.0, copy_seconds=90.0 + 1e-6).num_swapped_slots == 0


@pytest.mark.parametrize("field, value", [("row_seconds", -1.0), ("copy_seconds", float("nan"))])
def test_gate_rejects_bad_seconds(field, value):
    p, load, full = _two_gpu_case(10)
    kw = dict(row_seconds=1.0, copy_seconds=1.0)
    kw[field] = value
    with pytest.raises(ZeppInputError, match=field):
        gate_swaps(p, full, load, **kw)
