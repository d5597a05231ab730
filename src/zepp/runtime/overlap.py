"""The overlapped paths of a Dispatcher (``overlap=True``): compute on rows as they arrive.

The expert layer computes on groups as they arrive: its own tokens while stage 0 is on the
wire, each stage's rows while the next stage is on the wire (``arrivals``); the combine's stage 0
goes out in waves, one per destination node in ring order (own node last), each sent as soon as
its second GEMM is done while the next wave computes (``CombineStream``).
``overlap_comm="collective"`` (default) posts each stage / wave as one asynchronous
``all_to_all_single``; ``overlap_comm="p2p"`` posts ``batch_isend_irecv`` chunks instead and also
splits a stage into own-node rows (computed first) and remote rows. Every rank posts the same
sequence of operations (wave ``i`` sends to node ``node+i+1`` and receives from ``node-i-1``), as
NCCL needs. Waits happen in a fixed order, never "whichever comes first".

With ``granularity="auto"`` (a system whose overlap is chosen per batch), per batch
``zepp.planner.overlap.granularity.choose`` picks how many dispatch groups and combine waves to
run from the FlowPlan and the cost figures (the same on every rank, so every rank picks the
same): GEMM 1 then runs per coarse dispatch group (``zepp.planner.overlap.grouping``'s groups
merged), each as soon as the arrival events it needs are in, and the combine's stage 0 in that
many waves. ``"per-node"`` (default) keeps the arrival-event groups and one wave per node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from zepp.runtime.collectives import all_to_all, post_p2p
from zepp.runtime.program import RankProgram, Stage

if TYPE_CHECKING:
    from zepp.runtime.dispatcher import Dispatcher, DispatchHandle


class ArrivalGroups:
    """The expert-input rows of an overlapped dispatch, handed out in groups: the rows of each
    arrival event, or (with a granularity) each coarse group once the last event it needs is in,
    in group order. A group's rows are copied from the held buffer when it is handed out."""

    def __init__(self, d: Dispatcher, h: DispatchHandle):
        self.d, self.prog, self.held, self.rows = d, h.prog, h._held, h.inputs.rows
        self.released = np.zeros(0 if h.prog.group_need is None else h.prog.group_need.size, bool)

    def _copy(self, idx: np.ndarray) -> np.ndarray:
        if idx.size:
            self.rows[self.d._idx(idx)] = self.held[self.d._idx(self.prog.e_pos[idx])]
        return idx

    def _complete(self, ev) -> list[np.ndarray]:
        """The groups that events up to ``ev`` complete (an event number or a tuple of them)."""
        prog = self.prog
        if prog.group_need is None:
            return [self._copy(np.flatnonzero(np.isin(prog.e_event, ev)))]
        now = np.flatnonzero(~self.released & (prog.group_need <= int(np.max(ev))))
        self.released[now] = True
        return [self._copy(np.flatnonzero(prog.e_group == gi)) for gi in now.tolist()]

    def ready(self, events):
        """Yield ``idx [m]`` of every non-empty group the ``events`` complete, in order."""
        for ev in events:
            for idx in self._complete(ev):
                if idx.size:
                    yield idx


def arrivals(d: Dispatcher, h: DispatchHandle):
    """Run the dispatch of a prepared batch ``h``, yielding ``idx [m]`` (ascending positions in
    ``h.inputs.rows``, filled in) for each arrival group, always while later transfers are in
    flight: own tokens (while stage 0 is on the wire), then per stage the rows from the own
    node (while the remote ones arrive) and the rows from remote nodes (while the next stage
    is on the wire). Groups and wait order are fixed by the plan, never by arrival timing."""
    prog, held = h.prog, h._held
    groups = ArrivalGroups(d, h)
    pending = [0]  # events whose groups are complete but not yet handed out
    for s, st in enumerate(prog.dispatch):
        send = d._gather_rows("send", held, st.send_idx)
        recv = held[st.recv_off: st.recv_off + st.n_recv]
        if not d.p2p:  # one asynchronous all-to-all per stage
            work = all_to_all(d, recv, send, st, "dispatch", wave=0, async_op=True, h=h, stage=s)
            yield from groups.ready(pending)
            work.wait()
            pending = [(1 + 2 * s, 2 + 2 * s)]
            continue
        yield from _p2p_stage(d, prog, s, st, send, recv, groups, pending)
        pending = [2 + 2 * s]
    yield from groups.ready(pending)
    if prog.group_need is not None:  # groups whose rows need no event beyond the last (empty plans)
        yield from groups.ready([np.iinfo(np.int64).max])


def _p2p_stage(d: Dispatcher, prog: RankProgram, s: int, st: Stage, send, recv, groups: ArrivalGroups, pending):
    """Dispatch stage ``s`` point to point: post every chunk, hand out the groups ``pending``
    completed, wait for the own node's sources and hand out their rows while the remote ones
    arrive, then wait for those (in the plan's fixed order) and for the sends."""
    L, N = d.gpus_per_node, d.world // d.gpus_per_node
    works, send_works = post_p2p(d, recv, send, st, "dispatch", tag=s, wave=0)
    yield from groups.ready(pending)
    order = [q for stage, q in prog.events if stage == s]
    for remote in (False, True):
        for q in order:
            if q in works and ((q // L - d.rank // L) % N != 0) == remote:
                works[q].wait()
        if not remote:  # own-node rows are in: compute them while remote rows arrive
            yield from groups.ready([1 + 2 * s])
    for w in send_works:
        w.wait()


class CombineStream:
    """Overlapped combine: ``for grp in cs.waves(): cs.submit(grp, out)`` then ``cs.finish()``.

    ``waves()`` yields ``idx [m]`` (ascending positions in expert-input order) of the entries of
    one wave: tokens owned by node ``node + 1``, then ``node + 2``, ..., own node last. ``submit``
    folds the wave's outputs into its units and posts that wave's stage-0 sends at once, so the
    next wave computes while this one is on the wire.
    """

    def __init__(self, d: Dispatcher, h: DispatchHandle):
        self.d, self.h = d, h
        self.store = None
        self.pending: list = []
        self._stage0 = h.prog.combine[0] if h.prog.combine else None
        self._recv0 = None

    def waves(self):
        prog = self.h.prog
        for w in range(prog.num_waves):
            idx = np.flatnonzero(prog.e_wave == w)
            self._wave = w
            yield idx

    def submit(self, idx: np.ndarray, out: torch.Tensor) -> None:
        d, h = self.d, self.h
        if self.store is None:
            self.store = d._new_store(h, out.shape[1])
            st = self._stage0
            if st is not None:
                self._recv0 = d._buffer("crecv", st.n_recv, out.shape[1], d._wire(h))
        if idx.size:
            d._accumulate_entries(self.store, h, idx, out)
        st = self._stage0
        if st is None:
            return
        w = self._wave
        # this wave's sends: the wave-w segment of the (wave, dst)-ordered send list
        so = np.r_[0, np.cumsum(st.send_counts.sum(axis=0))]
        seg = st.send_idx[so[w]: so[w + 1]]
        part = d._take_units(self.store, seg, h)
        if d.p2p:
            recv_w, send_w = post_p2p(d, self._recv0, part, st, "combine", tag=0, wave=w, send_offset=int(so[w]))
            self.pending.append((list(recv_w.values()) + send_w, part))
        else:
            ro = np.r_[0, np.cumsum(st.recv_counts.sum(axis=0))]
            work = all_to_all(d, self._recv0[ro[w]: ro[w + 1]], part, st, "combine", wave=w, async_op=True, h=h,
                              stage=0)
            self.pending.append(([work], part))

    def finish(self) -> torch.Tensor:
        d, h, prog = self.d, self.h, self.h.prog
        if self.store is None:  # no entries and no waves were iterated
            self.store = d._new_store(h, d.spec.hidden)
        for works, _ in self.pending:
            for w in works:
                w.wait()
        if self._stage0 is not None:
            d._accumulate_received(self.store, self._recv0, self._stage0)
        for s, st in enumerate(prog.combine[1:], start=1):
            send = d._take_units(self.store, st.send_idx, h)
            recv = d._buffer("crecv", st.n_recv, self.store.shape[1], send.dtype)
            if d.p2p:
                recv_w, send_w = post_p2p(d, recv, send, st, "combine", tag=s, wave=0)
                for w in [recv_w[q] for q in sorted(recv_w)] + send_w:
                    w.wait()
            else:
                all_to_all(d, recv, send, st, "combine", h=h, stage=s)
            d._accumulate_received(self.store, recv, st)
        return d._final(self.store, h)
