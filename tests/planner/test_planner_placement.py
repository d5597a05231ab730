"""Placements: home, zepp (PAPER.md 2.1), eplb-distinct, epic, and the dispatcher."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zepp.errors import ZeppInputError
from zepp.planner.placement import (
    PLACEMENTS,
    _pack_distinct,
    _scale,
    _zepp_counts,
    make_placement,
    place_epic,
    place_eplb_distinct,
    place_home,
    place_zepp,
    rebalance_experts,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw, max_nodes=4, max_gpus=4):
    """(hist [N, E], gpus_per_node, extra) with a skew drawn from several shapes."""
    n = draw(st.integers(1, max_nodes))
    L = draw(st.integers(1, max_gpus))
    per = draw(st.integers(1, 3))
    extra = draw(st.integers(0, 3))
    E = n * L * per
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["pareto", "uniform", "zero", "one-hot", "node-local"]))
    rng = np.random.default_rng(seed)
    if kind == "pareto":
        hist = (rng.pareto(draw(st.sampled_from([0.5, 1.0, 2.0])), size=(n, E)) * 20).astype(np.int64)
    elif kind == "uniform":
        hist = rng.integers(0, 50, size=(n, E))
    elif kind == "zero":
        hist = np.zeros((n, E), dtype=np.int64)
    elif kind == "one-hot":
        hist = np.zeros((n, E), dtype=np.int64)
        hist[:, rng.integers(E)] = rng.integers(1, 1000, size=n)
    else:  # each node asks mostly for its own slice
        hist = rng.integers(0, 5, size=(n, E))
        for i in range(n):
            hist[i, i * (E // n):(i + 1) * (E // n)] += 100
    return hist, L, extra


def node_of_slots(p):
    return np.repeat(np.arange(p.nodes), p.gpus_per_node)


# --------------------------------------------------------------------------- home


def test_home_layout():
    p = place_home(8, 4, 2)
    assert p.slot_expert.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert (p.replica_count == 1).all()


def test_home_indivisible_names_numbers_and_fix():
    with pytest.raises(ZeppInputError) as err:
        place_home(10, 4, 2)
    msg = str(err.value)
    assert "10" in msg and "4" in msg and "divides" in msg


# --------------------------------------------------------------------------- zepp: exact rules


def test_zepp_hand_example():
    # counts: spare 1 -> expert 0 (load 20, capped at 2 nodes), spare 2 -> expert 1 (load 8).
    # expert 0: tie on request (10/10) and node load -> node 0, then node 1; expert 1 -> node 1
    # (8 > 0), then node 0; expert 2 -> node 0 (3 > 0); expert 3: tie on request (1/1),
    # node loads 17 vs 14 -> node 1.
    hist = np.array([[10, 0, 3, 1], [10, 8, 0, 1]])
    p = place_zepp(hist, gpus_per_node=1, extra=1)
    assert p.slot_expert.tolist() == [[0, 1, 2], [0, 1, 3]]
    assert p.replica_count.tolist() == [2, 2, 1, 1]


def test_zepp_snake_dealing_single_node():
    # one node: no replicas (cap 1); shares 7,5,3,1 dealt GPU 0,1 then 1,0; 2 slots stay empty.
    p = place_zepp(np.array([[5, 1, 7, 3]]), gpus_per_node=2, extra=1)
    assert p.slot_expert.tolist() == [[2, 1, -1], [0, 3, -1]]


def reference_counts(load, spare, cap):
    """Straight from the paper: one slot at a time to the largest load/count, ties lower id."""
    counts = [1] * len(load)
    for _ in range(spare):
        best = None
        for e in range(len(load)):
            if counts[e] < cap and (best is None or Fraction(load[e], counts[e]) > Fraction(load[best], counts[best])):
                best = e
        if best is None:
            break
        counts[best] += 1
    return counts


@SETTINGS
@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(0, 30), st.integers(1, 5))
def test_zepp_counts_follow_the_greedy(load, spare, cap):
    assert _zepp_counts(load, spare, cap, _scale(cap)) == reference_counts(load, spare, cap)


def test_zepp_one_hot_expert_on_every_node():
    hist = np.zeros((4, 16), dtype=np.int64)
    hist[:, 5] = [100, 3, 7, 1]
    p = place_zepp(hist, gpus_per_node=2, extra=1)
    assert p.replica_count[5] == 4  # capped at one per node
    assert sorted(p.replicas[5] // (2 * p.slots_per_rank)) == [0, 1, 2, 3]
    # the hottest replica leads its node's snake: local slot 0 of the node's GPU 0
    assert all(p.slot_expert[n * 2, 0] == 5 for n in range(4))


def test_zepp_zero_history_is_deterministic_and_full():
    hist = np.zeros((2, 8), dtype=np.int64)
    p = place_zepp(hist, gpus_per_node=2, extra=1)
    q = place_zepp(hist.astype(np.int32), gpus_per_node=2, extra=1)
    assert np.array_equal(p.slot_expert, q.slot_expert)
    # 4 spare slots, shares all 0: experts 0..3 get their second (last allowed) replica
    assert p.replica_count.tolist() == [2, 2, 2, 2, 1, 1, 1, 1]
    assert (p.slot_expert >= 0).all()


def test_zepp_single_node_no_replicas():
    hist = np.arange(24).reshape(1, 24)
    p = place_zepp(hist, gpus_per_node=4, extra=2)
    assert p.slot_expert.shape == (4, 8)
    assert (p.replica_count == 1).all()
    assert (p.slot_expert == -1).sum() == 8


@SETTINGS
@given(clusters())
def test_zepp_properties(case):
    hist, L, extra = case
    n, E = hist.shape
    R = n * L
    p = place_zepp(hist, L, extra)
    S = E // R + extra
    assert p.slot_expert.shape == (R, S)
    assert (p.replica_count >= 1).all()
    assert p.replica_count.sum() == (p.slot_expert >= 0).sum()
    node = node_of_slots(p)
    per_node = np.zeros((n, E), dtype=int)
    for r in range(R):
        for e in p.slot_expert[r]:
            if e >= 0:
                per_node[node[r], e] += 1
    assert per_node.max() <= 1, "two replicas of one expert on one node"
    # a slot stays empty only when its node already holds every expert
    for r in range(R):
        if (p.slot_expert[r] < 0).any():
            assert per_node[node[r]].all()
    # deterministic, also across input dtypes
    assert np.array_equal(p.slot_expert, place_zepp(hist.astype(np.int32), L, extra).slot_expert)
    # snake: reading each node in dealing order gives non-increasing shares (ties: lower id),
    # and GPU share sums differ by at most the node's largest share
    load = hist.sum(axis=0)
    share = [Fraction(int(load[e]), int(p.replica_count[e])) for e in range(E)]
    for i in range(n):
        block = p.slot_expert[i * L:(i + 1) * L]
        dealt = []
        for rnd in range(S):
            gpus = range(L) if rnd % 2 == 0 else range(L - 1, -1, -1)
            dealt += [int(block[g, rnd]) for g in gpus]
        real = [e for e in dealt if e >= 0]
        assert dealt[:len(real)] == real, "empty slots are dealt last"
        assert real == sorted(real, key=lambda e: (-share[e], e))
        sums = [sum((share[e] for e in block[g] if e >= 0), Fraction(0)) for g in range(L)]
        if real:
            assert max(sums) - min(sums) <= share[real[0]]


# --------------------------------------------------------------------------- eplb-distinct and epic


def gpu_duplicates(p):
    return max(
        int(np.bincount(row[row >= 0], minlength=p.num_experts).max(initial=0)) for row in p.slot_expert
    )


@SETTINGS
@given(clusters(), st.sampled_from(["eplb-distinct", "epic"]))
def test_distinct_placements_never_share_a_gpu(case, name):
    hist, L, extra = case
    n, E = hist.shape
    R = n * L
    p = make_placement(name, hist, E, R, L, extra)
    assert p.slot_expert.shape == (R, E // R + extra)
    assert gpu_duplicates(p) <= 1
    assert (p.replica_count <= R).all()
    assert np.array_equal(p.slot_expert, make_placement(name, hist, E, R, L, extra).slot_expert)
    # same counts as EPLB whenever EPLB itself stays within one replica per GPU
    _, _, logcnt = rebalance_experts(hist.sum(axis=0)[None].astype(np.float32), R * (E // R + extra), 1, 1, R)
    if int(logcnt.max()) <= R:
        assert p.replica_count.tolist() == logcnt[0].tolist()


def test_eplb_distinct_avoids_eplb_flaw():
    hist = np.array([[50, 1, 1, 0], [50, 0, 0, 1]])  # EPLB puts three copies of 0 on GPU 0 here
    p = place_eplb_distinct(hist, ranks=2, gpus_per_node=1, extra=2)
    assert gpu_duplicates(p) == 1
    # expert 0 stops at one replica per GPU; the other spares go to experts 1, 2, 3
    assert p.replica_count.tolist() == [2, 2, 2, 2]
    assert (p.slot_expert >= 0).all()


def test_epic_puts_bins_where_their_demand_is():
    p = place_epic(np.array([[10, 0], [0, 10]]), ranks=2, gpus_per_node=1, extra=0)
    assert p.slot_expert.tolist() == [[0], [1]]
    p = place_epic(np.array([[0, 10], [10, 0]]), ranks=2, gpus_per_node=1, extra=0)
    assert p.slot_expert.tolist() == [[1], [0]]


# --------------------------------------------------------------------------- dispatcher


@pytest.mark.parametrize("name", PLACEMENTS)
def test_make_placement_all_names(name):
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 100, size=(2, 16))
    p = make_placement(name, hist, 16, 4, 2)
    assert p.slot_expert.shape == (4, 4 if name == "home" else 6)
    assert (p.replica_count >= 1).all()


def test_home_needs_no_history():
    assert make_placement("home", None, 8, 4, 2).slot_expert.shape == (4, 2)


@pytest.mark.parametrize(
    "args, words",
    [
        (("nope", np.ones((2, 8), int), 8, 4, 2), ["unknown placement", "zepp"]),
        (("zepp", np.ones(8, int), 8, 4, 2), ["hist", "2-D"]),
        (("zepp", -np.ones((2, 8), int), 8, 4, 2), ["negative"]),
        (("zepp", np.full((2, 8), 0.5), 8, 4, 2), ["whole"]),
        (("zepp", np.ones((3, 8), int), 8, 4, 2), ["3 node rows", "one history row per node"]),
        (("zepp", np.ones((2, 8), int), 12, 4, 2), ["8 expert columns", "num_experts=12"]),
        (("zepp", np.ones((2, 10), int), 10, 4, 2), ["10", "4"]),
        (("zepp", np.ones((2, 8), int), 8, 4, 3), ["gpus_per_node"]),
        (("eplb", np.ones((2, 8), int), 8, 4, 2, -1), ["extra"]),
        (("epic", None, 8, 4, 2), ["needs a history"]),
        (("zepp", np.ones((2, 8), bool), 8, 4, 2), ["dtype"]),
    ],
)
def test_make_placement_errors(args, words):
    with pytest.raises(ZeppInputError) as err:
        make_placement(*args)
    for w in words:
        assert w in str(err.value)


def test_pack_distinct_repair_move():
    # lightest-first: A(10) -> bin 0; B(4), C(3), D(2) -> bin 1 (full); X -> bin 0; the second X
    # is stuck (bin 0 holds X). Repair: bin 1's lightest replica whose expert bin 0 lacks (D)
    # moves to bin 0 and X takes its slot.
    load = np.array([10, 4, 3, 2, 2], dtype=np.float32)
    out = _pack_distinct(load, np.array([1, 1, 1, 1, 2]), bins=2, per_bin=3)
    assert out.tolist() == [[0, 4, 3], [1, 2, 4]]


def test_zepp_drops_a_copy_without_a_free_node_and_refills():
    # Expert 3 is planned 2 replicas, but by its turn the only nodes with room already hold it;
    # the copy is dropped and the slot goes to expert 5 (highest current share missing there).
    hist = np.array([[0, 3, 9, 6, 22, 22, 46, 190], [1, 23, 27, 13, 3, 39, 8, 116],
                     [5, 38, 3, 3, 98, 3, 0, 6], [14, 3, 9, 6, 5, 7, 72, 8]])
    load = [int(x) for x in hist.sum(axis=0)]
    p = place_zepp(hist, gpus_per_node=2, extra=2)
    assert reference_counts(load, 8 * 3 - 8, 4) == [1, 3, 3, 2, 4, 3, 4, 4]  # planned
    assert p.replica_count.tolist() == [1, 3, 3, 1, 4, 4, 4, 4]
    assert (p.slot_expert >= 0).all()
