"""Flows: the hop tables of every transport pair, proved by ``validate()`` on every routing of random
small clusters and skews (missing entries included), hand-checked small cases per transport, the
validation catching broken plans, and ``plan_batch``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner_cases import SETTINGS, assert_same_flows, random_placement, route_any, routing_case, routing_cases, skewed_batch
from zepp import registry
from zepp.errors import ZeppInputError
from zepp.planner import plan_batch
from zepp.planner.flows import COMBINES, DISPATCHES, build_flows, nic_split, transport_pairs
from zepp.planner.routing import ROUTINGS, route
from zepp.planner.types import COMBINE, DISPATCH, FlowPlan, Hops, PlanInvariantError, Placement, Routing

def test_transport_tables():
    assert list(DISPATCHES) == ["a2av", "dedup", "relay", "zepp", "allgather"]
    assert list(COMBINES) == ["a2av", "dedup", "reduce", "reduce-direct"]
    natural = {d: c.natural_combine for d, c in DISPATCHES.items()}
    assert natural == {"a2av": "a2av", "dedup": "dedup", "relay": "dedup", "zepp": "reduce", "allgather": "dedup"}
    pairs = transport_pairs(with_hops=False)
    assert set(transport_pairs()) == {p for p in pairs if p[0] != "allgather"}
    # the reducing combines need a gatewayed dispatch
    assert {d for d, c in pairs if c in ("reduce", "reduce-direct")} == {"relay", "zepp"}
    assert all((d, natural[d]) in pairs for d in DISPATCHES)


def test_bad_transports_are_named():
    routing = route("home", np.zeros((4, 2, 1), int), Placement(np.arange(4).reshape(4, 1), 4, 2))
    with pytest.raises(ZeppInputError, match="unknown dispatch transport"):
        build_flows(routing, "carrier-pigeon", 1)
    with pytest.raises(ZeppInputError, match="unknown combine transport"):
        build_flows(routing, "a2av", 1, combine="smoke-signals")
    with pytest.raises(ZeppInputError, match="needs a relay or zepp dispatch"):
        build_flows(routing, "a2av", 1, combine="reduce")


@SETTINGS
@given(routing_cases)
def test_every_routing_and_transport_is_valid(case):
    pl, ids = routing_case(case)
    for name in ROUTINGS:
        routing = route_any(name, ids, pl, case["relaxation"])
        routing.validate()
        for dispatch, combine in transport_pairs(with_hops=False):
            plan = build_flows(routing, dispatch, row_bytes=16, combine=combine)
            plan.validate()
            stats = plan.stats()
            assert stats.rows_computed.sum() == ids.size
            assert stats.nic_send.sum() == stats.nic_recv.sum()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routing_cases, st.floats(0.0, 1.0))
def test_missing_entries_move_nothing(case, absent):
    """Ragged ranks: tokens whose ids are all -1 are absent, single -1 ids are missing entries;
    every routing and transport leaves them out (no row, no load) and stays valid."""
    pl, ids = routing_case(case)
    ids = ids.astype(np.int64)
    rng = np.random.default_rng(case["seed"] + 1)
    gone = rng.random(ids.shape[:2]) < absent
    ids[gone] = -1
    ids[rng.random(ids.shape) < 0.1] = -1
    present = int((ids >= 0).sum())
    for name in [n for n, c in ROUTINGS.items() if not c.own_slots]:
        routing = route_any(name, ids, pl, case["relaxation"])
        routing.validate()
        assert ((routing.slot < 0) == (ids < 0)).all()
        assert routing.slot_loads().sum() == present
        for dispatch, combine in transport_pairs(with_hops=False):
            plan = build_flows(routing, dispatch, row_bytes=16, combine=combine)
            plan.validate()
            assert plan.stats().rows_computed.sum() == present
            for hops in (plan.dispatch, plan.combine):
                assert not gone[hops.owner, hops.token].any(), "an absent token moved"


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


def test_single_node_has_no_nic_traffic():
    rng = np.random.default_rng(0)
    pl = random_placement(rng, 1, 4, 2, 2)
    ids = skewed_batch(rng, 4, 32, 3, pl.num_experts, 1.0)
    for dispatch, combine in transport_pairs():
        plan = build_flows(route("zepp", ids, pl), dispatch, 4, combine)
        plan.validate()
        assert plan.stats().inter_node_bytes == 0


def test_validate_catches_broken_plans():
    pl = Placement(np.arange(4).reshape(4, 1), 4, 2)
    ids = np.zeros((4, 3, 2), np.int32)
    ids[..., 0], ids[..., 1] = 2, 3
    good = build_flows(route("home", ids, pl), "zepp", 1)
    good.validate()
    # drop a dispatch hop: some entry never receives its token
    broken = replace(good, hops=(good.dispatch.select(np.arange(good.dispatch.size) > 0), good.combine))
    with pytest.raises(PlanInvariantError, match="never delivers"):
        broken.validate()
    # duplicate a combine hop: an output would be counted twice
    twice = Hops.concat([good.combine, good.combine.select(np.arange(good.combine.size) == 0)])
    broken = replace(good, hops=(good.dispatch, twice))
    with pytest.raises(PlanInvariantError):
        broken.validate()
    # route an entry to a slot of the wrong expert
    slot = good.routing.slot.copy()
    slot[0, 0, 0] = 0
    with pytest.raises(PlanInvariantError, match="another expert"):
        Routing(ids, slot, pl).validate()


def test_validate_checks_the_nic_caps_of_a_balanced_dispatch():
    # a relay plan where only rank 0 sends to node 1 is valid as relay, but a zepp dispatch must
    # spread that stream over the node's NICs
    pl = Placement(np.arange(8).reshape(8, 1), 8, 4)
    ids = np.full((8, 40, 1), 1, np.int32)
    ids[0, :, 0] = 5
    relay = build_flows(route("home", ids, pl), "relay", 1)
    relay.validate()
    as_zepp = FlowPlan(relay.routing, 4, 1, "zepp", "dedup", hops=(relay.dispatch, relay.combine))
    with pytest.raises(PlanInvariantError, match="above its cap"):
        as_zepp.validate()


@pytest.mark.parametrize("name", ["zepp", "eplb", "sglang", "epic", "zepp-a2av", "relay"])
def test_plan_batch_is_route_then_flows(name):
    s = registry.SYSTEMS[name]
    rng = np.random.default_rng(7)
    pl = random_placement(rng, 2, 2, 2, 2)
    ids = skewed_batch(rng, 4, 9, 3, pl.num_experts, 1.0)
    got = plan_batch(ids, pl, s, 32, relaxation=0.1)
    want = build_flows(route(s.routing, ids, pl, 0.1), s.dispatch, 32, s.combine)
    got.validate()
    assert got.transport == f"{s.dispatch}/{s.combine}"
    assert_same_flows(got, want)
