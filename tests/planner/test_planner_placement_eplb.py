"""DeepSeek EPLB's ``rebalance_experts`` (re-implemented, PAPER.md section 6) and the placements
built on it: ``eplb`` (its global policy on the summed history) and ``eplb-distinct``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from planner_cases import SETTINGS, gpu_duplicates
from zepp.errors import ZeppInputError
from zepp.planner.placement import place_eplb, place_eplb_distinct, rebalance_experts
from zepp.planner.placement.eplb_placement import pack_distinct

README_WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def check_consistent(phy2log, log2phy, logcnt, num_experts, num_replicas):
    layers = phy2log.shape[0]
    assert phy2log.shape == (layers, num_replicas)
    assert logcnt.shape == (layers, num_experts)
    assert log2phy.shape == (layers, num_experts, num_replicas - num_experts + 1)
    for lay in range(layers):
        counts = torch.bincount(phy2log[lay], minlength=num_experts)
        assert torch.equal(counts, logcnt[lay])
        assert (logcnt[lay] >= 1).all()
        seen = []
        for e in range(num_experts):
            c = int(logcnt[lay, e])
            row = log2phy[lay, e]
            assert (row[c:] == -1).all() and (row[:c] >= 0).all()
            assert (phy2log[lay, row[:c]] == e).all()
            seen += row[:c].tolist()
        assert sorted(seen) == list(range(num_replicas))


def test_readme_golden_example():
    phy2log, log2phy, logcnt = rebalance_experts(torch.tensor(README_WEIGHT), 16, 4, 2, 8)
    assert phy2log.tolist() == README_PHY2LOG
    check_consistent(phy2log, log2phy, logcnt, 12, 16)


def test_float_input_gives_same_maps():
    a = rebalance_experts(torch.tensor(README_WEIGHT), 16, 4, 2, 8)
    b = rebalance_experts(torch.tensor(README_WEIGHT, dtype=torch.float64), 16, 4, 2, 8)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_global_policy_hand_example_and_known_flaw():
    # replication: expert 0 gets all 4 spare slots (100/c stays largest): per-replica loads
    # 20 x5, 1 x3. Packing 4 per GPU, heaviest first into the lightest non-full GPU (ties low):
    # GPU 0 takes three 20s and one 1, GPU 1 two 20s and two 1s.
    phy2log, log2phy, logcnt = rebalance_experts(torch.tensor([[100, 1, 1, 1]]), 8, 1, 1, 2)
    assert phy2log.tolist() == [[0, 0, 0, 3, 0, 0, 1, 2]]
    assert logcnt.tolist() == [[5, 1, 1, 1]]
    check_consistent(phy2log, log2phy, logcnt, 4, 8)
    # the known flaw: three replicas of expert 0 share GPU 0
    assert (phy2log[0, :4] == 0).sum() == 3


def test_global_policy_when_groups_do_not_split_over_nodes():
    w = torch.tensor(README_WEIGHT)
    glob = rebalance_experts(w, 16, 1, 1, 8)
    for groups, nodes in ((3, 2), (4, 3)):  # num_groups % num_nodes != 0
        other = rebalance_experts(w, 16, groups, nodes, 8)
        for x, y in zip(glob, other):
            assert torch.equal(x, y)
    assert not torch.equal(glob[0], rebalance_experts(w, 16, 4, 2, 8)[0])


@st.composite
def eplb_cases(draw):
    nodes = draw(st.integers(1, 3))
    groups = nodes * draw(st.integers(1, 3))
    group_size = draw(st.integers(1, 3))
    E = groups * group_size
    gpus = nodes * draw(st.integers(1, 3))
    per_gpu = draw(st.integers(1, 4))
    P = gpus * per_gpu
    # P >= E, and each node gets at least its E / nodes experts
    while P < E:
        P += gpus
    layers = draw(st.integers(1, 3))
    w = draw(st.lists(st.integers(0, 300), min_size=layers * E, max_size=layers * E))
    return torch.tensor(w).reshape(layers, E), P, groups, nodes, gpus


@SETTINGS
@given(eplb_cases())
def test_hierarchical_maps_consistent_and_groups_stay_on_one_node(case):
    w, P, groups, nodes, gpus = case
    layers, E = w.shape
    phy2log, log2phy, logcnt = rebalance_experts(w, P, groups, nodes, gpus)
    check_consistent(phy2log, log2phy, logcnt, E, P)
    group_size = E // groups
    per_node = P // nodes
    for lay in range(layers):
        node_of = {}
        for p in range(P):
            g = int(phy2log[lay, p]) // group_size
            assert node_of.setdefault(g, p // per_node) == p // per_node, "a group spans two nodes"
        assert sorted(node_of) == list(range(groups))
        for n in range(nodes):  # each node gets groups_per_node whole groups
            assert sum(v == n for v in node_of.values()) == groups // nodes
    again = rebalance_experts(w, P, groups, nodes, gpus)
    assert all(torch.equal(x, y) for x, y in zip((phy2log, log2phy, logcnt), again))


def test_rebalance_errors():
    w = torch.ones(1, 8)
    with pytest.raises(ZeppInputError, match="below the 8"):
        rebalance_experts(w, 6, 1, 1, 2)
    with pytest.raises(ZeppInputError, match="multiple of num_gpus"):
        rebalance_experts(w, 9, 1, 1, 2)
    with pytest.raises(ZeppInputError, match="layers"):
        rebalance_experts(torch.ones(8), 8, 1, 1, 2)


# --------------------------------------------------------------------------- eplb and eplb-distinct

# summed load [100, 1, 1, 1] on 2 GPUs x 4 slots: the global policy's hand case above (its flaw)
FLAW_HIST = np.array([[50, 1, 1, 0], [50, 0, 0, 1]])


def test_place_eplb_is_rebalance_global_policy():
    # the hand case: physical slot p is local slot p % S of rank p // S, flaw included
    p = place_eplb(FLAW_HIST, ranks=2, gpus_per_node=1, extra=2)
    assert p.slot_expert.tolist() == [[0, 0, 0, 3], [0, 0, 1, 2]]
    assert p.replica_count.tolist() == [5, 1, 1, 1]
    rng = np.random.default_rng(3)
    hist = (rng.pareto(1.0, size=(4, 32)) * 10).astype(np.int64)
    p = place_eplb(hist, ranks=8, gpus_per_node=2, extra=2)
    phy2log, _, _ = rebalance_experts(torch.from_numpy(hist.sum(0))[None].float(), 48, 1, 1, 8)
    assert p.slot_expert.ravel().tolist() == phy2log[0].tolist()


def test_eplb_distinct_avoids_eplb_flaw():
    p = place_eplb_distinct(FLAW_HIST, ranks=2, gpus_per_node=1, extra=2)
    assert gpu_duplicates(p) == 1
    # expert 0 stops at one replica per GPU; the other spares go to experts 1, 2, 3
    assert p.replica_count.tolist() == [2, 2, 2, 2]
    assert (p.slot_expert >= 0).all()


def test_pack_distinct_repair_move():
    # lightest-first: A(10) -> bin 0; B(4), C(3), D(2) -> bin 1 (full); X -> bin 0; the second X
    # is stuck (bin 0 holds X). Repair: bin 1's lightest replica whose expert bin 0 lacks (D)
    # moves to bin 0 and X takes its slot.
    load = np.array([10, 4, 3, 2, 2], dtype=np.float32)
    out = pack_distinct(load, np.array([1, 1, 1, 1, 2]), bins=2, per_bin=3)
    assert out.tolist() == [[0, 4, 3], [1, 2, 4]]
