"""Placements by name (``make_placement`` and its table), ``home``, and what every replicating
placement promises. The rules of each placement: ``test_planner_placement_<name>.py``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner_cases import SETTINGS, gpu_duplicates, histories
from zepp.errors import ZeppInputError
from zepp.planner.placement import PLACEMENTS, make_placement, place_home, rebalance_experts

# --------------------------------------------------------------------------- the table


@pytest.mark.parametrize("name", PLACEMENTS)
def test_make_placement_all_names(name):
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 100, size=(2, 16))
    p = make_placement(name, hist, 16, 4, 2)
    assert p.slot_expert.shape == (4, 4 if name == "home" else 6)
    assert (p.replica_count >= 1).all()
    assert np.array_equal(p.slot_expert, make_placement(name, hist.astype(np.int32), 16, 4, 2).slot_expert)


def test_every_name_has_a_one_line_meaning():
    assert list(PLACEMENTS) == ["home", "zepp", "eplb", "eplb-distinct", "epic"]
    assert all(isinstance(m, str) and m and "\n" not in m for m in PLACEMENTS.meanings().values())


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
        (("home", np.ones((3, 8), int), 8, 4, 2), ["one history row per node"]),  # checked when given
        (("home", None, 8, 0, 2), ["ranks"]),
    ],
)
def test_make_placement_errors(args, words):
    with pytest.raises(ZeppInputError) as err:
        make_placement(*args)
    for w in words:
        assert w in str(err.value)


# --------------------------------------------------------------------------- home


def test_home_layout_needs_no_history():
    p = place_home(8, 4, 2)
    assert p.slot_expert.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert (p.replica_count == 1).all()
    assert np.array_equal(make_placement("home", None, 8, 4, 2).slot_expert, p.slot_expert)


def test_home_indivisible_names_numbers_and_fix():
    with pytest.raises(ZeppInputError) as err:
        place_home(10, 4, 2)
    msg = str(err.value)
    assert "10" in msg and "4" in msg and "divides" in msg


# --------------------------------------------------------------------------- eplb-distinct and epic


@SETTINGS
@given(histories(), st.sampled_from(["eplb-distinct", "epic"]))
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
