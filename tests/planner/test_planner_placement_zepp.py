"""``zepp``: Zepp's history-driven placement (PAPER.md section 2.1): its exact rules on hand-worked
cases, its replica counts against the paper's greedy, and its properties on random histories."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planner_cases import SETTINGS, histories
from zepp.planner.placement import place_zepp, zepp_slots
from zepp.planner.placement.base_placement import lcm_scale
from zepp.planner.placement.zepp_placement import _zepp_counts


def node_of_slots(p):
    return np.repeat(np.arange(p.nodes), p.gpus_per_node)


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
    assert _zepp_counts(load, spare, cap, lcm_scale(cap)) == reference_counts(load, spare, cap)


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
@given(histories())
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


def test_zepp_slots_fills_any_slot_count():
    # E = 6 experts on 2 nodes x 2 GPUs with 2 slots each (6 is no multiple of 4): zepp_slots still
    # follows place_zepp's rules, and gives place_zepp's placement where E is a multiple.
    hist = np.array([[9, 1, 4, 0, 2, 6], [1, 8, 0, 5, 2, 3]])
    p = zepp_slots(hist.astype(np.int64), 2, 2)
    assert p.slot_expert.shape == (4, 2) and (p.replica_count >= 1).all()
    assert p.replica_count.sum() == 8
    h8 = np.array([[9, 1, 4, 0, 2, 6, 3, 3], [1, 8, 0, 5, 2, 3, 7, 0]])
    assert np.array_equal(zepp_slots(h8, 2, 3).slot_expert, place_zepp(h8, 2, 1).slot_expert)


def test_rack_scale_node_puts_hot_experts_on_several_gpus():
    # one node of 16 GPUs (a rack-scale NVLink domain): the spare slots go to hot experts, at most
    # one copy per GPU; on a board (8 GPUs or fewer) the one-copy-per-node rule stays
    from zepp.planner.placement.zepp_placement import BOARD_GPUS, copies_per_node

    assert copies_per_node(BOARD_GPUS) == 1 and copies_per_node(BOARD_GPUS + 1) == BOARD_GPUS + 1
    E, L = 32, 16
    load = (np.arange(E, 0, -1) ** 2).astype(np.int64)
    p = place_zepp(load[None, :], gpus_per_node=L, extra=1)
    assert (p.slot_expert >= 0).all()  # every spare slot holds a copy
    assert p.replica_count[0] > 2  # the hottest expert has copies on several GPUs of the node
    for r in range(L):  # never two copies of an expert on one GPU
        row = p.slot_expert[r]
        assert len(set(row.tolist())) == row.size
    q = place_zepp(load[None, :], gpus_per_node=8, extra=1)  # a board: one copy per node
    assert (q.replica_count == 1).all()
