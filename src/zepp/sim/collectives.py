"""Stage collectives: a layer whose every stage is one all-to-all call per rank.

This is how ``zepp.runtime`` executes a FlowPlan on a host process group (gloo), and what
``Mechanics.stage_collectives`` selects in ``zepp.sim.layer.build_layer``; the emulated
cluster's record is ``zepp.emulate.glooexec``. A *call* is one dispatch stage, one combine stage
or, with combine waves (``gemm2 == "waves"``), one wave of combine stage 0.

Rules per call:

- a call runs on the group that carries it (``zepp.planner.flows.call_scopes``: a node's ranks, a
  rail's ranks, or all), only where that group moves something; every ordered pair of its
  members exchanges one message, an empty one where the plan moves nothing (``all_to_all_single``
  sends to every peer); a rank outside every busy group of the call does not post it;
- each rank sends its messages one after another in ring order (step ``i``: to ``rank + i``);
- a message starts once both its ends have posted the call; posting costs the rank
  ``net.call_cpu + net.cpu_per_byte * (bytes it sends and receives in the call)`` seconds on its
  compute stream (the rank's one host thread also runs its GEMMs);
- a rank leaves a call when its own sends and receives are done.

Program order per rank (``zepp.runtime.moe.MoELayer.forward``): prologue; dispatch calls, each
posted after the rank left the previous one; GEMM 1 after the last dispatch call, or with
``gemm1 == "stage"`` (``zepp.planner.overlap.grouping.arrival_stage``) group ``g`` during call ``g`` (after
posting it) and after leaving call ``g - 1``; GEMM 2; combine calls (with waves: wave ``w``'s
GEMM 2, then its call posted asynchronously, then the next wave; every wave's call is left
before the next combine stage is posted); the weighted reduce after the last call.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.overlap.grouping import Messages, combine_wave
from zepp.planner.flows.call_scopes import NODE, RAIL, WORLD, call_scopes
from zepp.planner.types import Hops


def add_stage_collectives(b, d: Messages, cm: Messages, combine: Hops, tab1: np.ndarray, tab2: np.ndarray, G: int,
                          pro: np.ndarray, red: np.ndarray, row_bytes: float, n_dispatch: int, n_combine: int) -> None:
    """Add the calls of one layer to ``b.g`` (``b``: the ``zepp.sim.layer_builder.LayerBuilder``).

    ``d`` / ``cm``: the dispatch / combine messages (transfers already created, not chained);
    ``combine``: the combine hops ``cm`` was built from; ``tab1 [classes, R]`` / ``tab2``: GEMM
    task ids (-1: none), GEMM 1 class ``c`` in group ``c % G``, GEMM 2 class ``c`` in wave
    ``c % N``; ``pro [R]`` / ``red [R]``: prologue and reduce tasks; ``n_dispatch`` /
    ``n_combine``: stages per phase.
    """
    calls = _Calls(b, d, cm, combine, row_bytes, n_dispatch, n_combine)
    if calls.K == 0:
        return
    calls.add_empty_messages(b)
    calls.chain_in_ring_order(b.g)
    post, done = calls.post_and_leave(b)
    _dispatch_program_order(b, tab1, G, pro, post, done, n_dispatch)
    if calls.n_cc:
        _combine_program_order(b, tab1, tab2, pro, red, post, done, n_dispatch, calls.K, calls.waves)


class _Calls:
    """Every message of a layer's calls, one element each: ``call``, ``src``, ``dst``, ``nbytes``,
    ``entry`` / ``exit_`` tasks (dispatch stages are calls ``0 .. n_dispatch-1``, then the
    combine's ``n_cc`` calls; ``K`` in all)."""

    def __init__(self, b, d: Messages, cm: Messages, combine: Hops, row_bytes: float, n_dispatch: int,
                 n_combine: int):
        L, N = b.L, b.N
        self.R, self.n_dispatch = b.R, n_dispatch
        self.waves = b.mech.gemm2 == "waves" and n_combine > 0
        if self.waves:  # a stage-0 combine message carries one owner node's partials: its wave
            wave = np.zeros(cm.rows.size, np.int64)
            wave[cm.hop_msg] = combine_wave(combine.owner, combine.src, L, N)
            c_call = np.where(cm.stage == 0, wave, N - 1 + cm.stage.astype(np.int64))
            self.n_cc = N + n_combine - 1
        else:
            c_call = cm.stage.astype(np.int64)
            self.n_cc = n_combine
        self.K = n_dispatch + self.n_cc
        self.call = np.concatenate([d.stage.astype(np.int64), n_dispatch + c_call])
        self.src = np.concatenate([d.src, cm.src]).astype(np.int64)
        self.dst = np.concatenate([d.dst, cm.dst]).astype(np.int64)
        self.nbytes = np.concatenate([d.rows, cm.rows]).astype(float) * row_bytes
        self.entry = np.concatenate([d.entry_task, cm.entry_task])
        self.exit_ = np.concatenate([d.exit_task, cm.exit_task])
        # the group each call runs on, and which ranks take part (the runtime's rule)
        self.scopes = call_scopes(self.call, self.src, self.dst, self.K, self.R, L)

    def add_empty_messages(self, b) -> None:
        """Empty messages for the pairs a call moves nothing between."""
        K, R = self.K, self.R
        k_all, s_all, t_all = (a.ravel() for a in np.meshgrid(np.arange(K), np.arange(R), np.arange(R), indexing="ij"))
        kind, act, L = self.scopes.kind[k_all], self.scopes.active, b.L
        same_group = np.where(kind == NODE, s_all // L == t_all // L, np.where(kind == RAIL, s_all % L == t_all % L,
                                                                              kind == WORLD))
        pair = (s_all != t_all) & same_group & act[k_all, s_all] & act[k_all, t_all]
        k_all, s_all, t_all = k_all[pair], s_all[pair], t_all[pair]
        has = np.zeros(K * R * R, bool)
        has[(self.call * R + self.src) * R + self.dst] = True
        miss = ~has[(k_all * R + s_all) * R + t_all]
        is_dispatch = k_all < self.n_dispatch
        for phase, sel in (("dispatch", miss & is_dispatch), ("combine", miss & ~is_dispatch)):
            if sel.any():
                e, x = b.transfers(s_all[sel], t_all[sel], np.zeros(int(sel.sum())), "serial", phase, phase + " empty")
                self.call = np.concatenate([self.call, k_all[sel]])
                self.src, self.dst = np.concatenate([self.src, s_all[sel]]), np.concatenate([self.dst, t_all[sel]])
                self.nbytes = np.concatenate([self.nbytes, np.zeros(int(sel.sum()))])
                self.entry, self.exit_ = np.concatenate([self.entry, e]), np.concatenate([self.exit_, x])

    def chain_in_ring_order(self, g) -> None:
        """Each rank's messages of a call one after another, ring order (then table order)."""
        call, src = self.call, self.src
        ring = (self.dst - src) % self.R
        o = np.lexsort((np.arange(src.size), ring, src, call))
        same = (call[o[1:]] == call[o[:-1]]) & (src[o[1:]] == src[o[:-1]])
        g.after(self.exit_[o[:-1][same]], self.entry[o[1:][same]])

    def post_and_leave(self, b) -> tuple[np.ndarray, np.ndarray]:
        """Posting (CPU before the call) and leaving (own sends and receives done) per call and
        rank: ``(post [K, R], done [K, R])`` task ids."""
        g, net, K, R = b.g, b.net, self.K, self.R
        call, src, dst = self.call, self.src, self.dst
        moved = (np.bincount(call * R + src, weights=self.nbytes, minlength=K * R)
                 + np.bincount(call * R + dst, weights=self.nbytes, minlength=K * R))
        ranks = np.tile(np.arange(R), K)
        joins = self.scopes.active.ravel()  # a rank whose group moves nothing does not call
        post = g.add_fixed(ranks, (net.call_cpu + net.cpu_per_byte * moved) * joins, kind="other", stream="compute",
                           label="post call").reshape(K, R)
        done = g.add_fixed(ranks, np.zeros(K * R), kind="barrier", stream=None, label="call done").reshape(K, R)
        g.after(post[call, src], self.entry)
        g.after(post[call, dst], self.entry)
        g.after(self.exit_, done[call, src])
        g.after(self.exit_, done[call, dst])
        g.after(post.ravel(), done.ravel())
        return post, done


def _dispatch_program_order(b, tab1: np.ndarray, G: int, pro: np.ndarray, post: np.ndarray, done: np.ndarray,
                            n_dispatch: int) -> None:
    """Prologue, then each dispatch call posted after the rank left the previous one; GEMM 1
    after the last call, or with ``gemm1 == "stage"`` group ``g`` during call ``g`` (after
    posting it) and after leaving call ``g - 1``."""
    g = b.g
    g.after(pro, post[0])
    for k in range(1, n_dispatch):
        g.after(done[k - 1], post[k])
    stage_groups = b.mech.gemm1 == "stage"
    for r in range(b.R):
        for c in np.flatnonzero(tab1[:, r] >= 0).tolist():
            t, grp = int(tab1[c, r]), c % G
            if not stage_groups:
                if n_dispatch:
                    g.after(done[n_dispatch - 1, r], t)
                continue
            if grp >= 1:
                g.after(done[grp - 1, r], t)
            if grp < n_dispatch:
                g.after(post[grp, r], t)
            if grp + 1 < n_dispatch:
                g.after(t, post[grp + 1, r])


def _combine_program_order(b, tab1: np.ndarray, tab2: np.ndarray, pro: np.ndarray, red: np.ndarray, post: np.ndarray,
                           done: np.ndarray, n_dispatch: int, K: int, waves: bool) -> None:
    """GEMM 2, then the combine calls (with waves: wave ``w``'s GEMM 2, then its call posted
    asynchronously, then the next wave; every wave's call is left before the next combine stage
    is posted); the weighted reduce after the last call."""
    g, N = b.g, b.N
    first = n_dispatch  # the first combine call
    for r in range(b.R):
        gemm1 = tab1[:, r][tab1[:, r] >= 0]
        before = [pro[r]] + ([done[n_dispatch - 1, r]] if n_dispatch else [])
        if not waves:
            gemm2 = tab2[:, r][tab2[:, r] >= 0]
            g.after(np.concatenate([before, gemm1, gemm2]).astype(np.int64), post[first, r])
            for k in range(first + 1, K):
                g.after(done[k - 1, r], post[k, r])
        else:
            prev = np.concatenate([before, gemm1]).astype(np.int64)
            for w in range(N):
                cls = np.arange(tab2.shape[0])
                t2 = tab2[cls[cls % N == w], r]
                t2 = t2[t2 >= 0]
                if t2.size:
                    g.after_all(prev, t2)
                g.after(np.concatenate([prev, t2]).astype(np.int64), post[first + w, r])
                prev = np.array([post[first + w, r]])
            for k in range(first + N, K):
                g.after(done[first:k, r] if k == first + N else done[k - 1, r], post[k, r])
        g.after(done[first:, r], red[r])
