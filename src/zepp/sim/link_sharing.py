"""The links of a GPU cluster and how concurrent transfers share them.

- Links (``Links``): per NIC a send side and a receive side, per ordered GPU pair inside a node
  an NVLink direction. A transfer across nodes holds ``nic_send[src]`` and ``nic_recv[dst]`` at
  once; a transfer inside a node holds ``nvlink[src -> dst]``.
- Concurrent transfers share links max-min fairly at flow level (progressive filling,
  ``maxmin_rates``); ``zepp.sim.engine`` recomputes the rates whenever the set of flowing
  transfers changes. The filling is vectorised: its loop runs once per distinct bottleneck
  level, not once per flow, and with ``tol`` nearly equal levels merge.
"""

from __future__ import annotations

import numpy as np

from zepp.cluster import Cluster


def maxmin_rates(res_a: np.ndarray, res_b: np.ndarray, cap: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Max-min fair rates of flows over shared links (progressive filling).

    ``res_a``/``res_b [F]``: the (at most two) links each flow holds (``res_b`` may point at a
    dummy link of infinite capacity, the last one); no link appears in both arrays. ``cap [K]``
    link capacities. Returns ``rate [F]``.

    Each pass freezes, at once, every link whose fair share (remaining capacity / unfrozen flows)
    is no larger than the share of any link it shares a flow with (a local minimum): such a link
    saturates exactly at its share whatever happens elsewhere, because its neighbours' shares can
    only grow as their other flows freeze. This gives the same rates as freezing one global
    minimum per pass, in far fewer passes. ``tol``: links whose shares differ by less than this
    fraction count as equal (a flow's rate is then at most ``tol`` below its exact max-min rate).
    A link is a local minimum when no flow through it has its other link's share more than
    ``tol`` below its own.
    """
    n = res_a.size
    if n == 0:
        return np.zeros(0)
    k = cap.size
    cnt = np.bincount(res_a, minlength=k) + np.bincount(res_b, minlength=k)
    if cnt[:-1].max(initial=0) <= 1 and np.isinf(cap[-1]):
        # no link shared (the last link is the infinite dummy): every flow runs at its slower link
        return np.minimum(cap[res_a], cap[res_b]).astype(np.float64)
    rate = np.zeros(n)
    rem = cap.astype(np.float64).copy()
    idx = np.arange(n)
    a, b = res_a, res_b
    share = np.empty(k)
    grow = 1.0 + tol
    while idx.size:
        share.fill(np.inf)
        np.divide(rem, cnt, out=share, where=cnt > 0)
        hit, m = _frozen(share, a, b, grow)
        if hit is None:
            rate[idx] = np.inf
            break
        lvl = m[hit]
        rate[idx[hit]] = lvl
        ah, bh = a[hit], b[hit]
        rem -= np.bincount(ah, weights=lvl, minlength=k) + np.bincount(bh, weights=lvl, minlength=k)
        np.maximum(rem, 0.0, out=rem)
        cnt -= np.bincount(ah, minlength=k) + np.bincount(bh, minlength=k)
        keep = ~hit
        idx, a, b = idx[keep], a[keep], b[keep]
    return rate


def _frozen(share: np.ndarray, a: np.ndarray, b: np.ndarray, grow: float) -> tuple[np.ndarray | None, np.ndarray]:
    """One pass of ``maxmin_rates``: ``(hit [F], m [F])``, the flows that hold a local-minimum
    link (frozen at ``m``, the smaller share of their two links); ``hit`` is ``None`` when no
    share is finite."""
    k = share.size
    sa, sb = share[a], share[b]
    m = np.minimum(sa, sb)
    if not np.isfinite(m).any():
        return None, m
    a_bad = sa > sb * grow  # this flow's other link is lower: its a-link is not a local minimum
    b_bad = sb > sa * grow
    nonlocal_ = (np.bincount(a[a_bad], minlength=k) + np.bincount(b[b_bad], minlength=k)) > 0
    return (~nonlocal_[a] & ~a_bad) | (~nonlocal_[b] & ~b_bad), m


class Links:
    """Link indexing: ``nic_send[r] = r``, ``nic_recv[r] = R + r``,
    ``nvlink[i -> j] = 2R + i * L + j % L`` (same node), dummy (infinite) = last."""

    def __init__(self, cluster: Cluster, nic_bw: float, nvlink_bw: float):
        R, L = cluster.ranks, cluster.gpus_per_node
        self.R, self.L = R, L
        self.cap = np.concatenate([np.full(2 * R, nic_bw), np.full(R * L, nvlink_bw), [np.inf]])
        self.dummy = self.cap.size - 1

    def of(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        R, L = self.R, self.L
        cross = (src // L) != (dst // L)
        a = np.where(cross, src, 2 * R + src * L + dst % L)
        b = np.where(cross, R + dst, self.dummy)
        return a.astype(np.int64), b.astype(np.int64)
