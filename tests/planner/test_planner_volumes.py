"""A plan's volumes come from the routing's counts (``zepp.planner.flows.token_counts`` and the
volume builders), its hop tables from the routing's entries: the two must agree cell for cell
(``volumes_of_hops``) for every routing, transport pair and coalescing, with missing entries and
in several rank blocks; the link accounting read off the volumes equals the hop tables'."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner_cases import SETTINGS, random_placement, route_any, routing_case, routing_cases, skewed_batch
from zepp.planner.flows import build_flows, build_hops, build_volumes, transport_pairs
from zepp.planner.flows import token_counts
from zepp.planner.routing import ROUTINGS, route
from zepp.planner.types import COMBINE, DISPATCH
from zepp.planner.volumes import Volumes, link_stats, volumes_of_hops


def assert_same_volumes(got: Volumes, want: Volumes, what: str) -> None:
    for f in fields(Volumes):
        np.testing.assert_array_equal(getattr(got, f.name), getattr(want, f.name), err_msg=f"{what}: {f.name}")


def check_all_pairs(routing, what: str) -> None:
    R, L = routing.placement.ranks, routing.placement.gpus_per_node
    for dispatch, combine in transport_pairs(with_hops=False):
        for coalesce in (True, False):
            vol = build_volumes(routing, dispatch, combine, coalesce).volumes
            hops = build_hops(routing, dispatch, combine, coalesce)
            for phase in (DISPATCH, COMBINE):
                assert_same_volumes(vol[phase], volumes_of_hops(hops[phase], R, L),
                                    f"{what} {dispatch}/{combine} coalesce={coalesce} phase {phase}")


@SETTINGS
@given(routing_cases, st.sampled_from(sorted(ROUTINGS)), st.floats(0.0, 0.5))
def test_volumes_are_the_hop_tables_counted(case, name, absent):
    if ROUTINGS[name].own_slots:
        return  # MoonEP routes onto slots of its own; its flows are a2av's, checked with the others
    pl, ids = routing_case(case)
    rng = np.random.default_rng(case["seed"])
    ids = np.where(rng.random(ids.shape) < absent, -1, ids).astype(np.int32)
    check_all_pairs(route_any(name, ids, pl, case["relaxation"]), name)


@pytest.mark.parametrize("block_entries", [1, 40, 1 << 23])
def test_volumes_do_not_depend_on_the_rank_blocks(monkeypatch, block_entries):
    # a hot source so the zepp split hands rows to other NICs, read in blocks of one or a few ranks
    rng = np.random.default_rng(7)
    pl = random_placement(rng, 3, 4, 2, 2)
    ids = skewed_batch(rng, pl.ranks, 10, 3, pl.num_experts, 1.0)
    ids[0, :, 0] = pl.num_experts - 1
    monkeypatch.setattr(token_counts, "BLOCK_ENTRIES", block_entries)
    check_all_pairs(route("zepp", ids, pl, 0.25), f"blocks of {block_entries} entries")


def test_link_stats_from_volumes_equal_the_hop_tables():
    rng = np.random.default_rng(3)
    pl = random_placement(rng, 3, 2, 2, 2)
    ids = skewed_batch(rng, pl.ranks, 12, 3, pl.num_experts, 1.0)
    r = route("zepp", ids, pl, 0.25)
    for dispatch, combine in transport_pairs():
        plan = build_flows(r, dispatch, 16, combine)
        for phase, hops in ((DISPATCH, plan.dispatch), (COMBINE, plan.combine)):
            got, want = plan.stats(phase), link_stats(hops, pl.ranks, 2, 16, r.rows_per_rank())
            for f in ("nic_send", "nic_recv", "nvlink", "messages", "rows_computed"):
                np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f"{plan.transport} {f}")


def test_cells_of_a_wide_key_space_are_summed_by_sorting():
    # keys beyond the counting table (a cluster of hundreds of ranks) take the sorting path: the same sums
    rng = np.random.default_rng(0)
    n, ranks, nodes = 5000, 400, 50
    cols = [rng.integers(0, 3, n), rng.integers(0, ranks, n), rng.integers(0, ranks, n), rng.integers(0, 2, n),
            rng.integers(0, nodes, n)]
    cols[1][: n // 2] = cols[1][n // 2:]  # repeated keys
    cols[2][: n // 2] = cols[2][n // 2:]
    rows = rng.integers(1, 5, n)
    v = Volumes.of_cells(*cols, rows, ranks=ranks, nodes=nodes)
    key = (((cols[0] * ranks + cols[1]) * ranks + cols[2]) * 2 + cols[3]) * nodes + cols[4]
    uniq, inv = np.unique(key, return_inverse=True)
    np.testing.assert_array_equal(v.rows, np.bincount(inv, weights=rows).astype(np.int64))
    np.testing.assert_array_equal(v.src, (uniq // nodes // 2 // ranks) % ranks)


def test_cells_of_no_rows_are_left_out_whatever_their_key():
    # a cell of 0 rows (a broadcast part's empty slot) may carry any key, even one out of range
    v = Volumes.of_parts([(0, [1, -1, 2], [0, 5, 3], 0, [0, 0, 1], [2, 0, 0]), (1, 2, 3, 1, 1, [4, -4])], ranks=4, nodes=2)
    assert (v.stage.tolist(), v.src.tolist(), v.dst.tolist(), v.msg.tolist(), v.rows.tolist()) == ([0], [1], [0], [0], [2])
