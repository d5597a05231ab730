"""Routing: each choice of ``zepp.planner.routing`` on hand-worked cases, Zepp's water-fill bounds
and vacate pass on random clusters, MoonEP's per-batch balance, and bad batches named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from planner_cases import SETTINGS, random_placement, routing_case, routing_cases, skewed_batch
from zepp.errors import ZeppInputError
from zepp.planner.routing import ROUTINGS, moonep_plan, position_in_group, route, zepp_tables
from zepp.planner.types import Placement, PlanInvariantError, Routing


def test_every_name_routes_and_has_a_one_line_meaning():
    assert tuple(ROUTINGS) == ("home", "replica-rr", "locality", "fixed", "dynamic", "random", "sglang-static",
                               "sglang-dynamic", "sglang-lp", "vllm-hash", "zepp", "moonep", "lp", "zepp-table",
                               "zepp-table-lean", "sglang-table", "sglang-table-prefill", "vllm-table",
                               "vllm-table-prefill")
    pl = Placement(np.arange(8).reshape(4, 2), 8, 2)
    ids = np.array([[[0, 5]], [[2, 7]], [[4, 1]], [[6, 3]]], np.int32)
    for name, choice in ROUTINGS.items():
        if choice.needs_table:  # route by a table built from history: test_planner_table_routing.py
            continue
        r = route(name, ids, pl)
        r.validate()
        assert (r.placement.slot_expert.ravel()[r.slot.ravel()] == ids.ravel()).all(), name


def test_position_in_group_counts_earlier_equal_keys():
    key = np.array([2, 0, 2, 1, 0, 2])
    assert position_in_group(key, 3).tolist() == [0, 0, 1, 0, 1, 2]


@pytest.mark.parametrize("n, keys", [(0, 4), (40000, 1), (40000, 385), (40000, 1 << 16), (5000, (1 << 16) + 3)])
def test_position_in_group_over_several_blocks_and_wide_keys(n, keys):
    # ranked block by block (and in one sort past 2**16 keys): the same places as counting in order
    key = np.random.default_rng(n + keys).integers(0, keys, n)
    order = np.argsort(key, kind="stable")
    want = np.empty(n, np.int64)
    want[order] = np.arange(n) - np.searchsorted(key[order], key[order])
    np.testing.assert_array_equal(position_in_group(key, keys), want)


def test_replica_rr_deals_an_experts_entries_in_turn():
    se = np.array([[0, 1], [0, 2]])  # expert 0 on slots 0 and 2
    pl = Placement(se, 3, 2)
    ids = np.zeros((2, 3, 1), np.int32)
    assert route("replica-rr", ids, pl).slot.ravel().tolist() == [0, 2, 0, 2, 0, 2]


def test_fixed_sends_a_source_to_replica_rank_mod_count():
    se = np.array([[0, 1], [2, 0], [3, 0]])  # expert 0 on slots 0, 3, 5
    pl = Placement(se, 4, 3)
    ids = np.zeros((3, 2, 1), np.int32)
    assert route("fixed", ids, pl).slot.reshape(3, 2).tolist() == [[0, 0], [3, 3], [5, 5]]


def test_locality_prefers_own_gpu():
    se = np.array([[0, 2], [1, 2], [2, 3], [3, 0]])
    pl = Placement(se, 4, 2)
    ids = np.array([[[2]], [[2]], [[0]], [[0]]], np.int32)
    slot = route("locality", ids, pl).slot.ravel()
    assert slot.tolist()[:2] == [1, 3]  # ranks 0 and 1 use their own replica of expert 2


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


# --------------------------------------------------------------------------- zepp


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


@settings(max_examples=30, deadline=None)
@given(routing_cases)
def test_one_hot_expert_stays_within_bounds(case):
    rng = np.random.default_rng(case["seed"])
    pl = random_placement(rng, case["nodes"], case["L"], case["per_rank"], max(case["extra"], 1))
    # every token picks expert 0 (the planner does not need a token's choices to be distinct)
    k = min(case["k"], pl.num_experts)
    ids = skewed_batch(rng, pl.ranks, case["T"] + 1, k, pl.num_experts, 0.0)
    ids[..., 0] = 0
    route("zepp", ids, pl, case["relaxation"]).validate()


def _token_nodes(routing: Routing, remote_only: bool = False) -> np.ndarray:
    """``[R*T, N]`` bool: the nodes each token's entries are computed on (``remote_only``: other
    than the token's home node)."""
    R, T, k = routing.slot.shape
    L, S = routing.placement.gpus_per_node, routing.placement.slots_per_rank
    node = np.where(routing.slot >= 0, routing.slot // (S * L), -1).reshape(R * T, k)
    out = np.zeros((R * T, R // L), bool)
    tok, col = np.nonzero(node >= 0)
    out[tok, node[tok, col]] = True
    if remote_only:
        out[np.arange(R * T), np.arange(R * T) // T // L] = False
    return out


@SETTINGS
@given(routing_cases)
def test_vacate_only_drops_remote_nodes_and_keeps_the_bounds(case):
    """The vacate pass moves a token's entries onto its home node or nodes it already touches: per
    token the remote nodes after it are a subset of the water-fill's, and the bounds still hold."""
    pl, ids = routing_case(case)
    filled = route("zepp", ids, pl, case["relaxation"], vacate_rounds=0)
    vacated = route("zepp", ids, pl, case["relaxation"])
    vacated.validate()
    before, after = _token_nodes(filled, remote_only=True), _token_nodes(vacated, remote_only=True)
    assert not (after & ~before).any()


def test_vacate_moves_a_token_off_its_least_touched_node():
    # 3 nodes x 1 GPU: expert 2 on node 0, expert 0 on nodes 1 and 2, expert 1 on node 2. Node 0's
    # 4 tokens pick (2, 1, 0); the other ranks hold none. Expert 0's bounds (D = 4, c = 2, C = 0.5)
    # are [1, 3]: the water-fill gives node 1 (first in rotation) 3 entries, node 2 one. Each token
    # on node 1 touches nodes 0, 1, 2; node 1 is its least-touched remote node (a tie with node 2,
    # lower id), so the vacate pass moves expert 0 to node 2 while the bounds allow: 2 tokens.
    pl = Placement(np.array([[2, -1], [0, -1], [0, 1]]), 3, 1)
    ids = np.full((3, 4, 3), -1, np.int32)
    ids[0] = [2, 1, 0]
    filled = route("zepp", ids, pl, 0.5, vacate_rounds=0)
    assert filled.slot_loads()[[2, 4]].tolist() == [3, 1]
    vacated = route("zepp", ids, pl, 0.5)
    vacated.validate()
    assert vacated.slot_loads()[[2, 4]].tolist() == [1, 3]
    assert _token_nodes(filled)[:4].sum() == 11 and _token_nodes(vacated)[:4].sum() == 9


def test_token_major_lists_a_mask_by_token_then_entry():
    # mostly one cell per token (read off the columns), some tokens with several (listed one by one)
    from zepp.planner.routing.zepp_vacate import _token_major

    rng = np.random.default_rng(3)
    for density in (0.0, 0.05, 0.3):
        mask = rng.random((6, 500)) < density
        mask[:, 7] = False
        mask[[1, 4], 9] = True
        gi, ki = _token_major(mask)
        want_g, want_k = np.nonzero(mask.T)
        assert gi.tolist() == want_g.tolist() and ki.tolist() == want_k.tolist()


@SETTINGS
@given(routing_cases)
def test_vacate_reads_the_same_nodes_from_codes_and_from_slots(case):
    """The vacate pass gets each entry's node and single-replica flag from the assignment's node
    codes, or computes them from the slots; both give the same routing."""
    from zepp.planner.routing.zepp_routing import _Filled
    from zepp.planner.routing.zepp_vacate import vacate

    pl, ids = routing_case(case)
    filled = _Filled(ids, pl, case["relaxation"])
    slot = filled.slot.reshape(ids.shape)
    by_codes = vacate(ids, slot, pl, case["relaxation"], 3, filled.slot_counts, filled.node)
    by_slots = vacate(ids, slot, pl, case["relaxation"], 3)
    np.testing.assert_array_equal(by_codes, by_slots)
    np.testing.assert_array_equal(by_codes, route("zepp", ids, pl, case["relaxation"]).slot)


# --------------------------------------------------------------------------- moonep


def _check_moonep(ids, E, L):
    routing, pulls = moonep_plan(ids, E, L)
    routing.validate()
    R = ids.shape[0]
    epr = E // R
    se = routing.placement.slot_expert
    assert np.array_equal(se[:, :epr], np.arange(E).reshape(R, epr))  # the home placement, then prefetch slots
    fetched = se[:, epr:]
    assert len(pulls) == (fetched >= 0).sum()  # one pull per filled prefetch slot
    for home, puller in pulls.tolist():
        assert home != puller and (fetched[puller] // epr == home).any()
    assert np.array_equal(route("moonep", ids, Placement(np.arange(E).reshape(R, epr), E, L)).slot, routing.slot)
    return routing.rows_per_rank(), fetched


def test_moonep_gives_every_gpu_its_share():
    rng = np.random.default_rng(5)
    ids = skewed_batch(rng, 4, 16, 2, 8, 2.0)
    rows, _ = _check_moonep(ids, 8, 2)
    assert rows.tolist() == [32, 32, 32, 32]  # T * k rows on every GPU


def test_moonep_stops_when_the_prefetch_slots_run_out():
    # loads per rank 35, 35, 25, 33 (target 32): ranks 0 and 1 fill both prefetch slots of rank 2;
    # rank 3's excess finds no rank with a deficit and a free slot.
    rng = np.random.default_rng(5)
    ids = skewed_batch(rng, 4, 16, 2, 8, 0.5)
    rows, fetched = _check_moonep(ids, 8, 2)
    assert rows.tolist() == [32, 32, 31, 33]
    assert (fetched[2] >= 0).all()


# --------------------------------------------------------------------------- bad input


def test_bad_batches_are_named():
    pl = Placement(np.arange(4).reshape(4, 1), 4, 2)
    with pytest.raises(ZeppInputError, match="outside"):
        route("home", np.full((4, 2, 1), 7), pl)
    with pytest.raises(ZeppInputError, match="ranks"):
        route("home", np.zeros((3, 2, 1), int), pl)
    with pytest.raises(ZeppInputError, match="integers"):
        route("home", np.zeros((4, 2, 1)), pl)
    with pytest.raises(ZeppInputError, match="unknown routing"):
        route("nearest", np.zeros((4, 2, 1), int), pl)
    with pytest.raises(ZeppInputError, match="missing entries"):
        route("moonep", np.full((4, 2, 1), -1), pl)


@SETTINGS
@given(routing_cases)
def test_vacate_targets_by_node_masks_and_by_candidate_nodes_agree(case):
    """The vacate pass reads a move's target off node bit masks up to ``MASK_NODES`` nodes and off
    the token's candidate nodes in turn beyond; both give the same routing."""
    pl, ids = routing_case(case)
    by_masks = route("zepp", ids, pl, case["relaxation"]).slot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zepp_tables, "MASK_NODES", 0)
        fresh = Placement(pl.slot_expert, pl.num_experts, pl.gpus_per_node)  # its tables built anew
        assert zepp_tables.zepp_tables(fresh).node_mask is None
        np.testing.assert_array_equal(route("zepp", ids, fresh, case["relaxation"]).slot, by_masks)
