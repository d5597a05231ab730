"""Max-min link sharing (``zepp.sim.link_sharing.maxmin_rates``): a hand-solved case, and freezing
every local-minimum link per pass against the textbook one-link-per-pass filling."""

import numpy as np
import pytest

from zepp.sim.link_sharing import maxmin_rates

BW = 25e9


def test_maxmin_matches_hand_solution():
    # links: send0..3 = 0..3, recv4 = 4, recv5 = 5, dummy = 6
    cap = np.array([BW] * 6 + [np.inf])
    a = np.array([0, 1, 1, 2, 3])  # A: 0->4, B: 1->4, C: 1->5, D: 2->5, E: 3->5
    b = np.array([4, 4, 5, 5, 5])
    rate = maxmin_rates(a, b, cap)
    # recv5 saturates first at BW/3 (C, D, E); then recv4 splits BW between A and B
    assert rate == pytest.approx([BW / 2, BW / 2, BW / 3, BW / 3, BW / 3])


def _maxmin_one_link_per_pass(a, b, cap):
    """Textbook progressive filling: each pass freezes the flows of one link of smallest share."""
    rate = np.full(a.size, np.nan)
    rem = cap.astype(float).copy()
    left = np.ones(a.size, bool)
    while left.any():
        cnt = np.bincount(a[left], minlength=cap.size) + np.bincount(b[left], minlength=cap.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(cnt > 0, rem / cnt, np.inf)
        k = int(np.argmin(share))
        hit = left & ((a == k) | (b == k))
        rate[hit] = share[k]
        rem -= np.bincount(a[hit], minlength=cap.size) * share[k] + np.bincount(b[hit], minlength=cap.size) * share[k]
        left &= ~hit
    return rate


@pytest.mark.parametrize("seed", range(8))
def test_maxmin_freezing_every_local_minimum_gives_the_textbook_rates(seed):
    rng = np.random.default_rng(seed)
    R = 6
    n = int(rng.integers(3, 40))
    src = rng.integers(0, R, n)
    dst = (src + rng.integers(1, R, n)) % R
    a, b = src, R + dst  # send links 0..R-1, receive links R..2R-1, dummy 2R
    cap = np.concatenate([rng.uniform(1.0, 4.0, 2 * R), [np.inf]])
    assert maxmin_rates(a, b, cap, tol=0.0) == pytest.approx(_maxmin_one_link_per_pass(a, b, cap), rel=1e-12)
