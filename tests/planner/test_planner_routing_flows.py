"""Routing and flow plans: invariants proved by validate(), on random small clusters and skews,
degenerate batches, and hand-checked small cases."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zepp.errors import ZeppInputError
from zepp.planner.flows import build_flows, nic_split, transport_pairs
from zepp.planner.types import COMBINE, DISPATCH, Hops, PlanInvariantError, Placement, Routing
from zepp.planner.routing import ROUTING_NAMES, route


def random_placement(rng, nodes, L, per_rank, extra):
    """Home layout plus ``extra`` random replicas per rank (any expert, duplicates allowed)."""
    R = nodes * L
    E = R * per_rank
    se = np.full((R, per_rank + extra), -1, np.int32)
    se[:, :per_rank] = np.arange(E).reshape(R, per_rank)
    if extra:
        se[:, per_rank:] = rng.integers(-1, E, size=(R, extra))
    return Placement(se, E, L)


def skewed_batch(rng, R, T, k, E, alpha):
    weights = np.arange(1, E + 1, dtype=float) ** -alpha
    weights = rng.permutation(weights / weights.sum())
    keys = rng.random((R * T, E)) ** (1.0 / weights)  # weighted sampling without replacement
    return np.argsort(-keys, axis=1)[:, :k].reshape(R, T, k).astype(np.int32)


cluster_cases = st.fixed_dictionaries({
    "nodes": st.integers(1, 4),
    "L": st.integers(1, 4),
    "per_rank": st.integers(1, 3),
    "extra": st.integers(0, 3),
    "T": st.integers(0, 12),
    "k": st.integers(1, 4),
    "alpha": st.sampled_from([0.0, 1.0, 3.0]),
    "relaxation": st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    "seed": st.integers(0, 2**16),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_cases)
def test_every_routing_and_transport_is_valid(case):
    rng = np.random.default_rng(case["seed"])
    pl = random_placement(rng, case["nodes"], case["L"], case["per_rank"], case["extra"])
    k = min(case["k"], pl.num_experts)
    ids = skewed_batch(rng, pl.ranks, case["T"], k, pl.num_experts, case["alpha"])
    for name in ROUTING_NAMES:
        routing = route(name, ids, pl, case["relaxation"])
        routing.validate()
        for dispatch, combine in transport_pairs(with_hops=False):
            plan = build_flows(routing, dispatch, row_bytes=16, combine=combine)
            plan.validate()
            stats = plan.stats()
            assert stats.rows_computed.sum() == ids.size
            assert stats.nic_send.sum() == stats.nic_recv.sum()


@settings(max_examples=30, deadline=None)
@given(cluster_cases)
def test_one_hot_expert_stays_within_bounds(case):
    rng = np.random.default_rng(case["seed"])
    pl = random_placement(rng, case["nodes"], case["L"], case["per_rank"], max(case["extra"], 1))
    # every token picks expert 0 (the planner does not need a token's choices to be distinct)
    k = min(case["k"], pl.num_experts)
    ids = skewed_batch(rng, pl.ranks, case["T"] + 1, k, pl.num_experts, 0.0)
    ids[..., 0] = 0
    routing = route("zepp", ids, pl, case["relaxation"])
    routing.validate()
    build_flows(routing, "zepp", 8).validate()


def test_single_node_has_no_nic_traffic():
    rng = np.random.default_rng(0)
    pl = random_placement(rng, 1, 4, 2, 2)
    ids = skewed_batch(rng, 4, 32, 3, pl.num_experts, 1.0)
    for dispatch, combine in transport_pairs():
        plan = build_flows(route("zepp", ids, pl), dispatch, 4, combine)
        plan.validate()
        assert plan.stats().inter_node_bytes == 0


def test_home_a2av_counts_by_hand():
    # 2 nodes x 1 GPU, experts 0 on rank 0, 1 on rank 1; rank 0's tokens pick (0,1) and (1,0).
    pl = Placement(np.array([[0], [1]]), 2, 1)
    ids = np.array([[[0, 1], [1, 0]], [[1, 0], [1, 0]]], np.int32)
    plan = build_flows(route("home", ids, pl), "a2av", row_bytes=10)
    plan.validate()
    d = plan.stats(DISPATCH)
    # each token has exactly one remote entry: 2 tokens per rank -> 2 rows each way
    assert d.nic_send.tolist() == [20, 20] and d.nic_recv.tolist() == [20, 20]
    assert d.messages.tolist() == [[0, 1], [1, 0]]
    assert plan.stats(COMBINE).nic_send.tolist() == [20, 20]
    assert d.rows_computed.tolist() == [4, 4]


def test_relay_merges_one_row_per_token_and_node():
    # 2 nodes x 2 GPUs; all of rank 0's tokens pick experts 2 and 3, both on node 1.
    pl = Placement(np.array([[0], [1], [2], [3]]), 4, 2)
    ids = np.zeros((4, 5, 2), np.int32)
    ids[:, :, 0], ids[:, :, 1] = 2, 3
    a2av = build_flows(route("home", ids, pl), "a2av", 1).stats(DISPATCH)
    relay = build_flows(route("home", ids, pl), "relay", 1)
    relay.validate()
    r = relay.stats(DISPATCH)
    # a2av: node-0 ranks send 2 rows per token across; relay: 1 row per token
    assert a2av.nic_send[:2].tolist() == [10, 10]
    assert r.nic_send[:2].tolist() == [5, 5]
    # ranks 0,1 land on 2,3; each forwards to the other GPU of node 1 over NVLink
    assert r.nvlink[2, 3] == 5 + 5 and r.nvlink[3, 2] == 5 + 5  # incl. node 1's own tokens


def test_nic_split_is_minimal_and_capped():
    volume = np.array([[7, 0, 1, 0], [3, 3, 3, 3], [0, 0, 0, 1], [0, 0, 0, 0]])
    cap, kept = nic_split(volume)
    assert cap.tolist()[0] == [2, 2, 2, 2]
    assert kept.tolist()[0] == [2, 0, 1, 0]  # GPU 0 keeps a prefix of 2, donates 5
    assert cap.tolist()[2] == [1, 0, 0, 0]
    assert (cap.sum(1) == volume.sum(1)).all()
    moved = (volume - kept).sum(1)
    assert moved.tolist() == [5, 0, 1, 0]  # lower bound sum(max(0, V_i - cap_i)) is met


def test_zepp_split_balances_a_hot_source():
    # 2 nodes x 4 GPUs; only rank 0 has tokens for node 1: zepp spreads them over 4 NICs.
    pl = Placement(np.arange(8).reshape(8, 1), 8, 4)
    ids = np.full((8, 40, 1), 1, np.int32)  # everyone on node 0 -> expert 1 (rank 1, local)
    ids[0, :, 0] = 5  # rank 0 -> expert 5 on node 1
    ids[4:, :, 0] = 6  # node 1 -> expert 6 (local to node 1)
    relay = build_flows(route("home", ids, pl), "relay", 1).stats(DISPATCH)
    zepp = build_flows(route("home", ids, pl), "zepp", 1)
    zepp.validate()
    z = zepp.stats(DISPATCH)
    assert relay.nic_send[0] == 40 and relay.busiest_nic_bytes == 40
    assert z.nic_send[:4].tolist() == [10, 10, 10, 10]
    assert z.nvlink[0, 1:4].tolist() == [10, 10, 10]  # hand-off of 30 rows, minimal
    # coalescing: rank 1..3 carry their donated piece as one message each
    assert z.messages[1, 5] == 1
    uncoalesced = build_flows(route("home", ids, pl), "zepp", 1, coalesce=False)
    uncoalesced.validate()


def test_zepp_combine_pre_reduces_on_the_computing_node():
    # 2 nodes x 2 GPUs; rank 0's tokens pick experts 2 and 3 (ranks 2, 3 on node 1).
    pl = Placement(np.arange(4).reshape(4, 1), 4, 2)
    ids = np.zeros((4, 6, 2), np.int32)
    ids[..., 0], ids[..., 1] = 0, 1
    ids[0, :, 0], ids[0, :, 1] = 2, 3
    relay = build_flows(route("home", ids, pl), "relay", 1).stats(COMBINE)
    zepp = build_flows(route("home", ids, pl), "zepp", 1)
    zepp.validate()
    assert relay.nic_send[2:].sum() == 12  # one row per (token, computing GPU)
    assert zepp.stats(COMBINE).nic_send[2:].sum() == 6  # one row per token


def test_validate_catches_broken_plans():
    pl = Placement(np.arange(4).reshape(4, 1), 4, 2)
    ids = np.zeros((4, 3, 2), np.int32)
    ids[..., 0], ids[..., 1] = 2, 3
    good = build_flows(route("home", ids, pl), "zepp", 1)
    good.validate()
    # drop a dispatch hop: some entry never receives its token
    broken = type(good)(good.routing, good.dispatch.select(np.arange(good.dispatch.size) > 0), good.combine,
                        good.gpus_per_node, good.row_bytes, good.dispatch_transport,
                        good.combine_transport)
    with pytest.raises(PlanInvariantError, match="never delivers"):
        broken.validate()
    # duplicate a combine hop: an output would be counted twice
    twice = Hops.concat([good.combine, good.combine.select(np.arange(good.combine.size) == 0)])
    broken = type(good)(good.routing, good.dispatch, twice, good.gpus_per_node, good.row_bytes, good.dispatch_transport,
                        good.combine_transport)
    with pytest.raises(PlanInvariantError):
        broken.validate()
    # route an entry to a slot of the wrong expert
    slot = good.routing.slot.copy()
    slot[0, 0, 0] = 0
    with pytest.raises(PlanInvariantError, match="another expert"):
        Routing(ids, slot, pl).validate()


def test_replica_bounds_are_enforced_by_validate():
    se = np.array([[0, 1], [0, 1]])  # 1 node x 2 GPUs, experts 0 and 1 on both
    pl = Placement(se, 2, 2)
    ids = np.zeros((2, 8, 1), np.int32)
    slot = np.zeros((2, 8, 1), np.int32)  # all 16 entries of expert 0 on slot 0
    with pytest.raises(PlanInvariantError, match="load bounds"):
        Routing(ids, slot, pl, relaxation=0.25).validate()
    routing = route("zepp", ids, pl, 0.25)
    routing.validate()
    assert sorted(routing.slot_loads()[[0, 2]].tolist()) == [8, 8]


def test_locality_prefers_own_gpu():
    se = np.array([[0, 2], [1, 2], [2, 3], [3, 0]])
    pl = Placement(se, 4, 2)
    ids = np.array([[[2]], [[2]], [[0]], [[0]]], np.int32)
    slot = route("locality", ids, pl).slot.ravel()
    assert slot.tolist()[:2] == [1, 3]  # ranks 0 and 1 use their own replica of expert 2


def test_bad_batches_are_named():
    pl = Placement(np.arange(4).reshape(4, 1), 4, 2)
    with pytest.raises(ZeppInputError, match="outside"):
        route("home", np.full((4, 2, 1), 7), pl)
    with pytest.raises(ZeppInputError, match="ranks"):
        route("home", np.zeros((3, 2, 1), int), pl)
    with pytest.raises(ZeppInputError, match="unknown routing"):
        route("nearest", np.zeros((4, 2, 1), int), pl)
    with pytest.raises(ZeppInputError, match="unknown dispatch transport"):
        build_flows(route("home", np.zeros((4, 2, 1), int), pl), "carrier-pigeon", 1)
    with pytest.raises(ZeppInputError, match="needs a relay or zepp dispatch"):
        build_flows(route("home", np.zeros((4, 2, 1), int), pl), "a2av", 1, combine="reduce")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_cases, st.floats(0.0, 1.0))
def test_missing_entries_move_nothing(case, absent):
    """Ragged ranks: tokens whose ids are all -1 are absent, single -1 ids are missing entries;
    every routing and transport leaves them out (no row, no load) and stays valid."""
    rng = np.random.default_rng(case["seed"])
    pl = random_placement(rng, case["nodes"], case["L"], case["per_rank"], case["extra"])
    k = min(case["k"], pl.num_experts)
    ids = skewed_batch(rng, pl.ranks, case["T"], k, pl.num_experts, case["alpha"]).astype(np.int64)
    gone = rng.random(ids.shape[:2]) < absent
    ids[gone] = -1
    ids[rng.random(ids.shape) < 0.1] = -1
    present = int((ids >= 0).sum())
    for name in [n for n in ROUTING_NAMES if n != "moonep"]:
        routing = route(name, ids, pl, case["relaxation"])
        routing.validate()
        assert ((routing.slot < 0) == (ids < 0)).all()
        assert routing.slot_loads().sum() == present
        for dispatch, combine in transport_pairs(with_hops=False):
            plan = build_flows(routing, dispatch, row_bytes=16, combine=combine)
            plan.validate()
            assert plan.stats().rows_computed.sum() == present
            for hops in (plan.dispatch, plan.combine):
                assert not gone[hops.owner, hops.token].any(), "an absent token moved"


def test_dynamic_and_random_choices_are_replicas_and_deterministic():
    se = np.array([[0, 1], [0, 2], [0, 3], [1, 2]])  # 2 nodes x 2 GPUs; expert 0 on ranks 0-2
    pl = Placement(se, 4, 2)
    ids = np.zeros((4, 50, 1), np.int32)
    dyn = route("dynamic", ids, pl).slot
    # rank 0 and 1 hold expert 0 themselves; rank 2 too; rank 3 (node 1) uses rank 2's (its node)
    assert (dyn[0] == 0).all() and (dyn[1] == 2).all() and (dyn[2] == 4).all() and (dyn[3] == 4).all()
    rnd = route("random", ids, pl)
    rnd.validate()
    assert set(np.unique(rnd.slot).tolist()) == {0, 2, 4}  # spread over all three replicas
    assert np.array_equal(rnd.slot, route("random", ids, pl).slot)
