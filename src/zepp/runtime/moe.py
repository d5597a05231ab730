"""The expert-parallel MoE layer: this rank's expert weights, dispatch, grouped compute, combine.

Experts are GELU MLPs ``H -> FFN -> H`` without biases (the layer benchmark's expert).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from zepp.runtime.dispatcher import Dispatcher
from zepp.runtime.experts import expert_weights, grouped_down, grouped_up, slot_weights
from zepp.runtime.swap_copies import SwapChannel, SwapError, check_swap_copies, post_copies

__all__ = ["MoELayer", "SwapError", "check_swap_copies", "swap_slot_weights"]


class MoELayer(torch.nn.Module):
    """One MoE layer on one rank.

    Holds ``w1 [S, H, F]`` and ``w2 [S, F, H]`` for this rank's ``S`` slots (replicas included;
    empty slots are zeros), created from ``seed`` per logical expert so that replicas are
    identical (``zepp.runtime.experts.expert_weights``). ``forward(x [T, H], topk_ids [T, k],
    topk_weights [T, k]) -> y [T, H]``.

    With ``dispatcher.overlap`` the first GEMM runs on each group of rows as it arrives and the
    second GEMM runs in combine waves whose sends go out while the next wave computes.

    Swaps: ``apply_swaps`` copies the weights between steps (blocking); ``begin_swaps`` posts the
    copies and switches the placement at once, the next ``forward`` computes the rows of slots
    still in flight last, each after its weights land (``zepp.runtime.swap_copies``), and
    ``finish_swaps`` waits for the rest.
    """

    def __init__(self, dispatcher: Dispatcher, seed: int = 0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.dispatcher = dispatcher
        self.seed = seed
        spec = dispatcher.spec
        self.hidden, self.ffn = spec.hidden, spec.ffn
        w1, w2 = slot_weights(dispatcher.placement.slot_expert[dispatcher.rank], seed, spec.hidden, spec.ffn,
                              dtype=dtype, device=dispatcher.device)
        self.register_buffer("w1", w1)
        self.register_buffer("w2", w2)
        self.last_handle = None
        self.on_dispatched = None  # test hook: called between dispatch and combine (fault injection)
        self.timing: dict[str, float] = {}
        self.swap_bytes = np.zeros(dispatcher.world, np.int64)  # weight bytes sent per destination
        self.pending = None  # zepp.runtime.swap_copies.PendingCopies of a swap in flight
        self._channel = None  # the SwapChannel of begin_swaps (made at the first swap, on every rank)

    def _up(self, rows: torch.Tensor, slot: np.ndarray, ti: torch.Tensor, inter: torch.Tensor) -> None:
        """GEMM 1 of one arrival group (``rows[ti]``, ``slot [n]``) into ``inter[ti]``; while a swap is
        in flight, rows of slots whose weights have not landed wait in its queue (``PendingCopies.run``)."""
        if self.pending is None:
            inter[ti] = grouped_up(rows[ti], slot, self.w1)
            return
        self.pending.run(grouped_up, rows[ti], slot, self.w1,
                         lambda sel, y: inter.index_copy_(0, ti[torch.as_tensor(sel, device=ti.device)], y))

    def _gemm(self, gemm, x: torch.Tensor, slot: np.ndarray, w: torch.Tensor) -> torch.Tensor:
        """``gemm(x, slot, w)``; while a swap is in flight, its slots' rows last (``PendingCopies.grouped``)."""
        return gemm(x, slot, w) if self.pending is None else self.pending.grouped(gemm, x, slot, w)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        d = self.dispatcher
        t0 = time.perf_counter()
        if not d.overlap:
            inputs, h = d.dispatch(x.to(self.w1.dtype), topk_ids, topk_weights)
            self.last_handle = h
            t1 = time.perf_counter()
            out = self._gemm(grouped_down, self._gemm(grouped_up, inputs.rows, inputs.slot, self.w1), inputs.slot,
                             self.w2)
            t2 = time.perf_counter()
            if self.on_dispatched is not None:
                self.on_dispatched()
            y = d.combine(out, h)
            self.timing = {"dispatch": t1 - t0, "compute": t2 - t1, "combine": time.perf_counter() - t2}
            return y.to(x.dtype)
        h = d.dispatch_begin(x.to(self.w1.dtype), topk_ids, topk_weights)
        self.last_handle = h
        if h.prog.single_gemm:  # the batch's granularity: one GEMM per phase, run blocking
            d.dispatch_blocking(h)
            t1 = time.perf_counter()
            out = self._gemm(grouped_down, self._gemm(grouped_up, h.inputs.rows, h.inputs.slot, self.w1),
                             h.inputs.slot, self.w2)
            if self.on_dispatched is not None:
                self.on_dispatched()
            y = d.combine_blocking(out, h)
            self.timing = {"dispatch+up": t1 - t0, "down+combine": time.perf_counter() - t1}
            return y.to(x.dtype)
        rows, slot = h.inputs.rows, h.prog.e_slot
        inter = rows.new_empty(rows.shape[0], self.ffn)
        for grp in d.arrivals(h):
            self._up(rows, slot[grp], d._idx(grp), inter)
        if self.pending is not None:
            self.pending.drain()  # swapped slots not landed during the dispatch: their GEMM 1 last
        t1 = time.perf_counter()
        if self.on_dispatched is not None:
            self.on_dispatched()
        cs = d.combine_begin(h)
        for grp in cs.waves():
            cs.submit(grp, self._gemm(grouped_down, inter[d._idx(grp)], slot[grp], self.w2))
        y = cs.finish()
        self.timing = {"dispatch+up": t1 - t0, "down+combine": time.perf_counter() - t1}
        return y.to(x.dtype)

    @torch.no_grad()
    def begin_swaps(self, swap_plan):
        """Post ``zepp.planner.adaptation.swaps.plan_swaps``'s weight copies (``swap_plan.copies [M, 3]``) on
        the layer's own swap channel and switch to its placement now; returns the
        ``PendingCopies`` (also ``self.pending``) that the next ``forward`` waits on slot by slot.
        Every rank calls this with the same plan; copies never cross nodes (``SwapError``)."""
        if self._channel is None:
            self._channel = SwapChannel(self.dispatcher.group, self.dispatcher.device)
        d = self.dispatcher
        if self.pending is not None:
            self.finish_swaps()
        self.pending = post_copies([self.w1, self.w2], swap_plan.copies, d.placement.slot_expert,
                                   swap_plan.placement.slot_expert, self._channel, d.gpus_per_node)
        self.swap_bytes += self.pending.stats.sent_to
        d.set_placement(swap_plan.placement)
        return self.pending

    @torch.no_grad()
    def finish_swaps(self):
        """Wait for the swap in flight (if any) and return its ``CopyStats`` (None without one)."""
        if self.pending is None:
            return None
        stats, self.pending = self.pending.finish(), None
        return stats

    @torch.no_grad()
    def apply_swaps(self, swap_plan) -> int:
        """Apply ``zepp.planner.adaptation.swaps.plan_swaps``'s weight copies at once (blocking) and switch to
        its placement. Copies read the *old* weights, go point-to-point over the dispatcher's
        group inside one node (``SwapError`` otherwise). Every rank calls this with the same
        plan. Returns the weight bytes this rank sent."""
        d = self.dispatcher
        self.finish_swaps()
        ch = SwapChannel(d.group, d.device, own=False)
        stats = post_copies([self.w1, self.w2], swap_plan.copies, d.placement.slot_expert,
                            swap_plan.placement.slot_expert, ch, d.gpus_per_node, tag_base=1 << 13).finish()
        self.swap_bytes += stats.sent_to
        d.set_placement(swap_plan.placement)
        return stats.sent

    def check_weights(self) -> bool:
        """True when every slot holds exactly its expert's weights (after swaps, say)."""
        se = self.dispatcher.placement.slot_expert[self.dispatcher.rank]
        for s, e in enumerate(se.tolist()):
            if e < 0:
                continue
            w1, w2 = expert_weights(self.seed, e, self.hidden, self.ffn)
            if not (torch.equal(self.w1[s].cpu(), w1.to(self.w1.dtype)) and torch.equal(self.w2[s].cpu(),
                                                                                        w2.to(self.w2.dtype))):
                return False
        return True


@torch.no_grad()
def swap_slot_weights(weights: list[torch.Tensor], copies, old_slot_expert: np.ndarray, new_slot_expert: np.ndarray,
                      dispatcher: Dispatcher, tag_base: int = 1 << 14, sent_to: np.ndarray | None = None) -> int:
    """Apply swap weight copies to any per-slot weight tensors of this rank, blocking.

    ``weights``: tensors ``[S, ...]`` (slot-major: e.g. ``gate_up [S, 2F, H]`` and ``down [S, H, F]``);
    ``copies [M, 3]``: ``(src_global_slot, dst_global_slot, expert)`` from ``zepp.planner.adaptation.swaps.plan_swaps``;
    ``old_slot_expert`` / ``new_slot_expert [R, S]``: the placements before and after. Copies read the
    old weights (staged first), stay inside a node (``SwapError`` otherwise), and go point-to-point
    over the dispatcher's group; slots emptied by the swap become zero. Every rank calls this with
    the same arguments. Returns the weight bytes this rank sent (``sent_to [R]``, if given, adds
    them per destination rank). The hidden form is ``zepp.runtime.swap_copies.post_copies``.
    """
    d = dispatcher
    ch = SwapChannel(d.group, d.device, own=False)
    stats = post_copies(weights, copies, old_slot_expert, new_slot_expert, ch, d.gpus_per_node,
                        tag_base=tag_base).finish()
    if sent_to is not None:
        sent_to += stats.sent_to
    return stats.sent
