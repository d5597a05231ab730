"""SGLang's ``lp`` dispatch (DeepSeek's LPLB as SGLang 0.5.23 runs it): the LP's max load against
the LP optimum, loads that keep what the LP promises, determinism, no loop over entries."""

import numpy as np
import pytest

from zepp.planner.placement import make_placement
from zepp.planner.routing import route
from zepp.planner.routing.lp_routing import lp_matrices, lp_shares
from zepp.planner.types import Placement


def optimum(ids: np.ndarray, pl: Placement) -> float:
    """The LP's optimum max GPU load (fraction of the entries), exactly, for a few GPUs: a
    fractional split of each expert over its GPUs has its best max load equal to the largest
    ``demand confined to a GPU set / its size`` over every set (max-flow min-cut)."""
    R, S = pl.slot_expert.shape
    E = pl.num_experts
    cnt = np.bincount(ids.ravel(), minlength=E) / ids.size
    on = np.zeros((E, R), bool)
    for j in range(pl.replicas.shape[1]):  # replicas per expert: a handful
        v = pl.replicas[:, j] >= 0
        on[np.flatnonzero(v), pl.replicas[v, j] // S] = True
    sets = ((np.arange(1, 1 << R)[:, None] >> np.arange(R)) & 1).astype(bool)
    confined = ~(on[None] & ~sets[:, None, :]).any(2)
    return float((confined @ cnt / sets.sum(1)).max())


def skewed_case(seed: int, R: int, L: int, E: int, extra: int, a: float, tokens: int = 512):
    rng = np.random.default_rng(seed)
    w = (1 / np.arange(1, E + 1) ** a)[rng.permutation(E)]
    w /= w.sum()
    pl = make_placement("eplb", rng.multinomial(10000, w, size=R // L).astype(float), E, R, L, extra=extra)
    return rng.choice(E, size=(R, tokens, 4), p=w).astype(np.int32), pl


CASES = [(0, 4, 2, 16, 1, 0.8), (1, 8, 4, 32, 1, 1.0), (2, 8, 8, 64, 2, 0.8), (3, 8, 4, 64, 1, 1.2),
         (4, 8, 8, 32, 2, 1.5), (5, 8, 2, 48, 1, 1.0)]


@pytest.mark.parametrize("case", CASES)
def test_five_barrier_iterations_reach_the_lp_optimum_within_half_a_percent(case):
    ids, pl = skewed_case(*case)
    share, accepted = lp_shares(ids, pl)
    assert accepted
    got = share.reshape(pl.ranks, -1).sum(1).max()
    best = optimum(ids, pl)
    assert best <= got + 1e-9 and got <= best * 1.005, (got, best)
    # the shares keep each expert's count and only move it between its own copies
    flat = pl.slot_expert.ravel()
    per_expert = np.bincount(flat[flat >= 0], weights=share[flat >= 0], minlength=pl.num_experts)
    assert per_expert == pytest.approx(np.bincount(ids.ravel(), minlength=pl.num_experts) / ids.size)


def test_the_lp_is_sglangs_standard_form():
    se = np.array([[0, 1], [2, 0]])  # expert 0 on both GPUs (slots 0 and 3)
    counts = np.array([0.5, 0.3, 0.2])
    A, b, c, rep = lp_matrices(Placement(se, 3, 2), counts)
    assert rep.tolist() == [0, 3] and A.shape == (1 + 2, 2 + 2 + 2)
    # expert 0's copies sum to its count; each GPU: its copies + slack - M = -(its single load)
    assert A[:, :-1].tolist() == [[1, 1, 0, 0, 0], [1, 0, 1, 0, -1], [0, 1, 0, 1, -1]]
    assert b.tolist() == [0.5, -0.3, -0.2] and c.tolist() == [0, 0, 0, 0, 1, 1000]
    assert np.allclose(A @ np.ones(A.shape[1]), b)  # z = 1 is feasible: the artificial column


@pytest.mark.parametrize("case", CASES[:3])
def test_entries_keep_what_the_lp_promises_and_routing_is_deterministic(case):
    ids, pl = skewed_case(*case, tokens=4096)
    r = route("lp", ids, pl)
    r.validate()
    share, _ = lp_shares(ids, pl)
    n = (ids >= 0).sum()
    want = share * n  # expected entries per slot
    got = r.slot_loads()
    # each entry draws its copy independently: per slot within 5 binomial standard deviations
    sd = np.sqrt(want * (1 - share))
    assert (np.abs(got - want) <= 5 * sd + 1).all()
    assert r.rows_per_rank().max() <= share.reshape(pl.ranks, -1).sum(1).max() * n * 1.05
    assert np.array_equal(route("lp", ids.copy(), pl).slot, r.slot)  # every rank draws the same


def test_a_placement_without_redundant_experts_routes_home_and_misses_stay_missing():
    pl = Placement(np.arange(8).reshape(4, 2), 8, 2)
    ids = np.array([[[0, -1]], [[2, 7]], [[4, 1]], [[-1, 3]]], np.int32)
    r = route("lp", ids, pl)
    assert r.slot.tolist() == route("home", ids, pl).slot.tolist()
    assert (r.slot[ids < 0] == -1).all()
