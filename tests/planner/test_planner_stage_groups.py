"""Call scopes (zepp.planner.flows.call_scopes) and the path cost model (zepp.planner.routing.decode_path)."""

from __future__ import annotations

import numpy as np

from zepp.planner.routing.decode_path import PathFigures, choose_path, default_figures, path_costs
from zepp.planner.flows.call_scopes import NODE, NONE, RAIL, WORLD, call_scopes, group_members


def test_scopes_of_node_rail_world_and_empty_calls():
    # 3 nodes x 2 ranks; call 0 inside node 1 only, call 1 rank 0 -> 2 -> 4 (rail 0), call 2
    # rank 1 -> 2 (another node, another local index), call 3 nothing (a rank's rows to itself)
    call = np.array([0, 1, 1, 2, 3])
    src = np.array([2, 0, 2, 1, 5])
    dst = np.array([3, 2, 4, 2, 5])
    sc = call_scopes(call, src, dst, 4, 6, 2)
    assert sc.kind.tolist() == [NODE, RAIL, WORLD, NONE]
    assert sc.active[0].tolist() == [False, False, True, True, False, False]  # only node 1 runs it
    assert sc.active[1].tolist() == [True, False, True, False, True, False]  # rail 0's ranks
    assert sc.active[2].all() and not sc.active[3].any()
    assert group_members(NODE, 3, 2, 6).tolist() == [2, 3]
    assert group_members(RAIL, 3, 2, 6).tolist() == [1, 3, 5]
    assert group_members(WORLD, 3, 2, 6).tolist() == list(range(6))


def test_path_choice_small_batches_table_large_planned():
    fig = default_figures()
    small = choose_path([4] * 8, 8, 2, 128, 8, 4096, 6, fig)
    large = choose_path([256] * 8, 8, 2, 128, 8, 4096, 6, fig)
    assert (small, large) == ("table", "planned")
    # the choice reads only data every rank holds: same counts, same answer, in any rank order
    c = np.array([3, 9, 1, 4, 4, 0, 2, 7])
    assert choose_path(c, 8, 2, 128, 8, 4096, 6, fig) == choose_path(c[::-1], 8, 2, 128, 8, 4096, 6, fig)


def test_path_costs_follow_their_terms():
    base = PathFigures(call_s=1e-3, nic_bw=1e8, nvlink_bw=1e9, plan_s_per_entry=1e-6)
    c0 = path_costs([16] * 4, 4, 2, 32, 8, 4096, 6, base)
    slow_calls = path_costs([16] * 4, 4, 2, 32, 8, 4096, 6, PathFigures(5e-3, 1e8, 1e9, 1e-6))
    # the planned path runs 7 calls and the table path 2: dearer calls hurt the planned path more
    assert slow_calls["planned"] - c0["planned"] > slow_calls["table"] - c0["table"] > 0
    assert np.isclose(slow_calls["table"] - c0["table"], 2 * 4e-3)
