"""Zepp's tables in the engines' forms (``zepp.planner.routing.engine_tables``): SGLang's static map
holds one copy of each expert per source under Zepp's bound, vLLM's rows hold each copy in
proportion to its share and every run of token rows follows the shares, and a batch routed by a
table is what each rank's own rows give (tests/engines holds the rows against the engines' code)."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from planner_cases import SETTINGS, batch_demand, routing_case, routing_cases
from zepp.planner.routing import ROUTINGS, route
from zepp.planner.routing.engine_tables import (build_hash_table, build_static_table, hash_rows, zepp_assignment)
from zepp.planner.routing.table_routing import _demand_units
from zepp.planner.routing.vllm_routing import hash_slots, local_rows
from zepp.planner.types import expert_load_bounds


@SETTINGS
@given(routing_cases)
def test_assignment_places_all_demand_and_keeps_the_bound_where_a_source_fits(case):
    pl, batch = routing_case(case)
    demand = batch_demand(batch, pl.num_experts)
    units = _demand_units(demand)
    for split, objective in ((False, "nic"), (True, "nic"), (False, "rows"), (True, "rows")):
        amount = zepp_assignment(pl, demand, case["relaxation"], pl.gpus_per_node, split, objective)  # [G, E, C]
        assert np.array_equal(amount.sum(2), units)
        assert not amount[np.broadcast_to(pl.replicas[None] < 0, amount.shape)].any()
        if not split:
            assert ((amount > 0).sum(2) <= 1).all(), "a source goes whole to one copy"
        load = amount.sum(0)  # [E, C]
        _, upper = expert_load_bounds(units.sum(0), pl.replica_count.astype(np.int64), case["relaxation"])
        multi = pl.replica_count > 1
        over = (load - upper[:, None])[multi]
        biggest = units.max(0)[multi, None]  # a whole source that fits no copy goes to the least loaded one
        assert (over <= (0 if split else biggest)).all()


@SETTINGS
@given(routing_cases)
def test_static_table_routes_each_source_to_one_copy_of_the_expert(case):
    pl, batch = routing_case(case)
    table = build_static_table(pl, batch_demand(batch, pl.num_experts), case["relaxation"], pl.gpus_per_node)
    assert (pl.slot_expert.ravel()[table.slot] == np.arange(pl.num_experts)[None]).all()
    r = route("sglang-table", batch, pl, table=table)
    r.validate()
    src = np.repeat(np.arange(pl.ranks), batch.shape[1] * batch.shape[2]).reshape(batch.shape)
    assert np.array_equal(r.slot, np.where(batch < 0, -1, table.slot[src, np.maximum(batch, 0)]))


@SETTINGS
@given(routing_cases)
def test_vllm_rows_hold_the_shares_and_the_lookup_is_each_ranks_rows(case):
    pl, batch = routing_case(case)
    width = 16
    table = build_hash_table(pl, batch_demand(batch, pl.num_experts) + 0.5, case["relaxation"], pl.gpus_per_node,
                             width)
    total = table.counts.sum(2)
    assert np.isin(total, (1, width)).all()
    r = route("vllm-table", batch, pl, table=table)
    r.validate()
    rows = local_rows(batch)
    for g in range(pl.ranks):
        l2p, count = hash_rows(table, g)
        assert np.array_equal(count, total[g])
        assert np.array_equal(r.slot[g], hash_slots(batch[g], rows[g], l2p, count))
        many = np.flatnonzero(count == width)
        for e in many[:3]:  # width consecutive token rows meet each copy exactly its count of times
            got = hash_slots(np.full((width, 1), e), np.arange(5, 5 + width), l2p, count).ravel()
            want = dict(zip(table.choices[g, e].tolist(), table.counts[g, e].tolist()))
            assert {c: int((got == c).sum()) for c in want if c >= 0} == {c: n for c, n in want.items() if c >= 0}


def test_table_routings_are_records_with_their_builder():
    for name in ("sglang-table", "vllm-table", "sglang-table-prefill", "vllm-table-prefill"):
        assert ROUTINGS[name].needs_table and ROUTINGS[name].build_table is not None
    assert all(c.needs_table == (c.build_table is not None) for c in ROUTINGS.values())
