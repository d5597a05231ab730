"""zepp-table: the routing table built once per placement from expected demand, and the lookup
every rank does alone (numpy and torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

import zepp.planner.torch.routing.table_routing as torch_table
from planner_cases import SETTINGS, batch_demand, random_placement, routing_case, routing_cases, skewed_batch
from zepp.errors import ZeppInputError
from zepp.planner.routing import ROUTINGS, build_routing_table, rank_slots, route, route_by_table
from zepp.planner.routing.table_routing import SHARE_ONE, expected_slot_loads
from zepp.planner.types import Placement


def _case(case):
    pl, batch = routing_case(case)
    return pl, batch, batch_demand(batch, pl.num_experts)


def test_zepp_table_is_a_routing_name_and_needs_its_table():
    assert "zepp-table" in ROUTINGS and "table lookup" in ROUTINGS["zepp-table"].meaning and ROUTINGS["zepp-table"].needs_table
    pl = Placement(np.arange(8).reshape(4, 2), 8, 2)
    ids = np.array([[[0, 5]], [[2, 7]], [[4, 1]], [[6, 3]]], np.int32)
    with pytest.raises(ZeppInputError, match="needs a routing table"):
        route("zepp-table", ids, pl)
    t = build_routing_table(pl, batch_demand(ids, 8), 0.25, 2)
    r = route("zepp-table", ids, pl, table=t)
    r.validate()
    assert (r.slot == pl.replicas[ids, 0]).all()  # one replica each: the only choice


@SETTINGS
@given(routing_cases)
def test_expected_loads_respect_the_relaxed_bounds(case):
    pl, batch, demand = _case(case)
    C = case["relaxation"]
    t = build_routing_table(pl, demand, C, pl.gpus_per_node)
    load = expected_slot_loads(t, demand)
    total = demand.sum(0)
    se = pl.slot_expert.ravel()
    used = se >= 0
    q = total[se[used]] / pl.replica_count[se[used]]
    # rounding: demand in units of total / 2**24, shares in 1/65536 of a source's demand (per source)
    tol = demand.sum() * 2.0 ** -23 + demand.max(initial=0) * pl.ranks * 2.0 / SHARE_ONE + 1e-9
    assert (load[used] >= (1 - C) * q - tol).all()
    assert (load[used] <= (1 + C) * q + tol).all()
    assert np.isclose(load.sum(), demand.sum())  # every expected entry goes somewhere


@SETTINGS
@given(routing_cases)
def test_lookup_serves_each_entry_by_its_expert_and_every_rank_agrees(case):
    pl, batch, demand = _case(case)
    t = build_routing_table(pl, demand, case["relaxation"], pl.gpus_per_node)
    batch = batch.copy()
    if batch.size:
        batch.reshape(-1)[:: 3] = -1  # missing entries get slot -1
    r = route_by_table(batch, t)
    r.validate()
    assert ((r.slot < 0) == (batch < 0)).all()
    for rank in range(pl.ranks):
        assert (rank_slots(batch[rank], rank, t) == r.slot[rank]).all()
    again = build_routing_table(pl, demand, case["relaxation"], pl.gpus_per_node)
    assert (again.choices == t.choices).all() and (again.shares == t.shares).all()
    assert (route_by_table(batch, again).slot == r.slot).all()


@SETTINGS
@given(routing_cases)
def test_choices_are_in_locality_order_and_shares_cumulative(case):
    pl, batch, demand = _case(case)
    t = build_routing_table(pl, demand, case["relaxation"], pl.gpus_per_node)
    S, L = pl.slots_per_rank, pl.gpus_per_node
    valid = t.choices >= 0
    assert valid[:, :, 0].all()
    assert (valid[:, :, 1:] <= valid[:, :, :-1]).all()  # padding at the end
    src = np.arange(pl.ranks)[:, None, None]
    rank = t.choices // S
    level = np.where(rank == src, 0, np.where(rank // L == src // L, 1, 2))
    level = np.where(valid, level, 3)
    assert (np.diff(level, axis=2) >= 0).all()  # own GPU, then node, then remote
    assert (np.diff(t.shares.astype(np.int64), axis=2) >= 0).all()
    last = valid.sum(2) - 1
    assert (np.take_along_axis(t.shares, last[:, :, None], 2) == SHARE_ONE).all()
    e_of = pl.slot_expert.ravel()[np.maximum(t.choices, 0)]
    want = np.arange(pl.num_experts)[None, :, None]
    assert (np.where(valid, e_of, want) == want).all()  # every choice holds its expert


def test_a_gpu_keeps_its_own_entries_when_its_replica_has_room():
    # 2 nodes x 2 GPUs, 4 experts; expert 0 has a replica on every GPU and every GPU sends it the same
    se = np.array([[0, 1], [2, 0], [3, 0], [0, -1]], np.int32)
    pl = Placement(se, 4, 2)
    demand = np.full((4, 4), 10.0)
    t = build_routing_table(pl, demand, 0.25, 2)
    own = np.array([0, 3, 5, 6])  # each GPU's slot of expert 0
    assert (t.choices[:, 0, 0] == own).all() and (t.shares[:, 0, 0] == SHARE_ONE).all()


def test_share_picks_follow_the_shares():
    # one source sends 3 parts to its own replica and 1 to the other: over many entries ~75% / 25%
    se = np.array([[0, 1], [0, 2], [3, -1], [4, 5]], np.int32)
    pl = Placement(se, 6, 4)
    demand = np.zeros((4, 6))
    demand[0, 0] = 30.0
    demand[2, 0] = 10.0  # rank 2's visits reach rank 0 and rank 1 in rotation; bounds force a split
    t = build_routing_table(pl, demand, 0.0, 4)
    ids = np.zeros((4, 4000, 1), np.int32)
    r = route_by_table(ids, t)
    got = np.bincount(r.slot[0].ravel(), minlength=8) / 4000
    width = np.diff(t.shares[0, 0].astype(np.int64), prepend=0) / SHARE_ONE
    for c, w in zip(t.choices[0, 0], width):
        if c >= 0:
            assert abs(got[c] - w) < 0.03
    load = expected_slot_loads(t, demand)
    assert np.allclose(load[[0, 2]], [20.0, 20.0], atol=0.01)  # C = 0: exactly half each


def test_bad_demand_is_named():
    pl = Placement(np.arange(8).reshape(4, 2), 8, 2)
    with pytest.raises(ZeppInputError, match="shape"):
        build_routing_table(pl, np.ones((4, 7)), 0.25, 2)
    with pytest.raises(ZeppInputError, match="non-negative"):
        build_routing_table(pl, -np.ones((4, 8)), 0.25, 2)
    with pytest.raises(ZeppInputError, match="gpus_per_node"):
        build_routing_table(pl, np.ones((4, 8)), 0.25, 4)


@SETTINGS
@given(routing_cases)
def test_torch_lookup_equals_numpy(case):
    pl, batch, demand = _case(case)
    t = build_routing_table(pl, demand, case["relaxation"], pl.gpus_per_node)
    tt = torch_table.table_tensors(t, "cpu")
    for rank in range(pl.ranks):
        got = torch_table.rank_slots(torch.as_tensor(batch[rank]), rank, tt)
        assert got.dtype == torch.int32
        assert (got.numpy() == rank_slots(batch[rank], rank, t)).all()


def test_table_matches_a_skewed_batch_close_to_zepps_balance():
    # a table built from the history routes a new batch of the same skew about as evenly as Zepp's
    # per-batch water-fill (expected bounds; the batch scatters around them)
    rng = np.random.default_rng(3)
    pl = random_placement(rng, 2, 4, 4, 2)
    hist = skewed_batch(rng, pl.ranks, 2000, 4, pl.num_experts, 1.0)
    t = build_routing_table(pl, batch_demand(hist, pl.num_experts), 0.25, 4)
    batch = skewed_batch(np.random.default_rng(4), pl.ranks, 2000, 4, pl.num_experts, 1.0)
    table_max = route_by_table(batch, t).rows_per_rank().max()
    home_max = route("home", batch, pl).rows_per_rank().max()
    zepp_max = route("zepp", batch, pl, 0.25).rows_per_rank().max()
    assert table_max < home_max
    assert table_max <= 1.1 * zepp_max


def test_lean_table_uses_fewer_slots_per_gpu_and_keeps_every_expert():
    from zepp.planner.routing.table_routing import lean_placement

    rng = np.random.default_rng(5)
    pl = random_placement(rng, 2, 4, 4, 2)
    hist = skewed_batch(rng, pl.ranks, 500, 4, pl.num_experts, 1.0)
    demand = batch_demand(hist, pl.num_experts)
    lean = lean_placement(pl, demand.sum(0))
    assert (lean.replica_count >= 1).all()
    kept = lean.slot_expert >= 0
    assert (lean.slot_expert[kept] == pl.slot_expert[kept]).all()  # only drops, same slot ids
    assert (kept.sum(1).max() < (pl.slot_expert >= 0).sum(1).max()) or (lean.replica_count == 1).all()
    t = build_routing_table(pl, demand, 0.25, 4, lean=True)
    used = np.unique(t.choices[t.choices >= 0])
    assert kept.ravel()[used].all()  # routes only to kept replicas
    r = route("zepp-table-lean", hist, pl, table=t)
    r.validate()


def test_demand_per_gpu_spreads_each_node_over_its_gpus():
    from zepp.planner.routing import demand_per_gpu

    hist = np.array([[4, 0, 8], [2, 6, 0]])
    got = demand_per_gpu(hist, 2)
    assert got.shape == (4, 3)
    np.testing.assert_array_equal(got, [[2, 0, 4], [2, 0, 4], [1, 3, 0], [1, 3, 0]])
    np.testing.assert_array_equal(got.reshape(2, 2, 3).sum(axis=1), hist)
