"""The expert-parallel MoE layer: this rank's expert weights, dispatch, grouped compute, combine.

Experts are GELU MLPs ``H -> FFN -> H`` without biases (the layer benchmark's expert).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from zepp.runtime.dispatcher import Dispatcher
from zepp.runtime.experts import expert_weights, grouped_down, grouped_up, slot_weights


class SwapError(AssertionError):
    """A weight copy would cross nodes: swaps must stay inside one node."""


def check_swap_copies(copies, slots: int, gpus_per_node: int) -> np.ndarray:
    """``copies [M, 3]`` (src global slot, dst global slot, expert) as int64; ``SwapError`` if any
    copy would cross nodes."""
    copies = np.asarray(copies, np.int64).reshape(-1, 3)
    src_rank, dst_rank = copies[:, 0] // slots, copies[:, 1] // slots
    cross = src_rank // gpus_per_node != dst_rank // gpus_per_node
    if np.any(cross):
        i = int(np.flatnonzero(cross)[0])
        raise SwapError(f"swap copy {i} moves expert {copies[i, 2]} from rank {src_rank[i]} to rank "
                        f"{dst_rank[i]} on another node; swaps stay inside a node")
    return copies


class MoELayer(torch.nn.Module):
    """One MoE layer on one rank.

    Holds ``w1 [S, H, F]`` and ``w2 [S, F, H]`` for this rank's ``S`` slots (replicas included;
    empty slots are zeros), created from ``seed`` per logical expert so that replicas are
    identical (``zepp.runtime.experts.expert_weights``). ``forward(x [T, H], topk_ids [T, k],
    topk_weights [T, k]) -> y [T, H]``.

    With ``dispatcher.overlap`` the first GEMM runs on each group of rows as it arrives and the
    second GEMM runs in combine waves whose sends go out while the next wave computes.
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

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        d = self.dispatcher
        t0 = time.perf_counter()
        if not d.overlap:
            inputs, h = d.dispatch(x.to(self.w1.dtype), topk_ids, topk_weights)
            self.last_handle = h
            t1 = time.perf_counter()
            out = grouped_down(grouped_up(inputs.rows, inputs.slot, self.w1), inputs.slot, self.w2)
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
            out = grouped_down(grouped_up(h.inputs.rows, h.inputs.slot, self.w1), h.inputs.slot, self.w2)
            if self.on_dispatched is not None:
                self.on_dispatched()
            y = d.combine_blocking(out, h)
            self.timing = {"dispatch+up": t1 - t0, "down+combine": time.perf_counter() - t1}
            return y.to(x.dtype)
        rows, slot = h.inputs.rows, h.prog.e_slot
        inter = rows.new_empty(rows.shape[0], self.ffn)
        for grp in d.arrivals(h):
            ti = d._idx(grp)
            inter[ti] = grouped_up(rows[ti], slot[grp], self.w1)
        t1 = time.perf_counter()
        if self.on_dispatched is not None:
            self.on_dispatched()
        cs = d.combine_begin(h)
        for grp in cs.waves():
            cs.submit(grp, grouped_down(inter[d._idx(grp)], slot[grp], self.w2))
        y = cs.finish()
        self.timing = {"dispatch+up": t1 - t0, "down+combine": time.perf_counter() - t1}
        return y.to(x.dtype)

    @torch.no_grad()
    def apply_swaps(self, swap_plan) -> int:
        """Apply ``zepp.planner.swaps.plan_swaps``'s weight copies and switch to its placement.

        ``swap_plan.copies [M, 3]``: ``(src_global_slot, dst_global_slot, expert)``. Copies read
        the *old* weights (staged before any slot is overwritten). Same-rank copies are local;
        others are point-to-point inside one node, never across nodes (``SwapError``). Every
        rank must call this with the same plan. Returns the weight bytes this rank sent.
        """
        d = self.dispatcher
        S, L, r = d.placement.slots_per_rank, d.gpus_per_node, d.rank
        copies = check_swap_copies(swap_plan.copies, S, L)
        old = self.dispatcher.placement.slot_expert
        if np.any(old.ravel()[copies[:, 0]] != copies[:, 2]):
            raise SwapError("a swap copy reads a slot that does not hold its expert")
        ops, staged = [], []
        sent = 0
        for i, (a, b, e) in enumerate(copies.tolist()):
            ra, rb = a // S, b // S
            if rb == r:
                if ra == r:
                    buf = torch.cat([self.w1[a - r * S].reshape(-1), self.w2[a - r * S].reshape(-1)])
                else:
                    buf = self.w1.new_empty(2 * self.hidden * self.ffn, device="cpu" if d.host_p2p else None)
                    ops.append(dist.P2POp(dist.irecv, buf, ra, d.group, (1 << 13) + i))
                staged.append((b - r * S, buf))
            elif ra == r:
                buf = torch.cat([self.w1[a - r * S].reshape(-1), self.w2[a - r * S].reshape(-1)])
                buf = buf.cpu() if d.host_p2p else buf
                ops.append(dist.P2POp(dist.isend, buf, rb, d.group, (1 << 13) + i))
                self.swap_bytes[rb] += buf.numel() * buf.element_size()
                sent += buf.numel() * buf.element_size()
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
        n = self.hidden * self.ffn
        for s, buf in staged:
            buf = buf.to(self.w1.device)
            self.w1[s].copy_(buf[:n].view(self.hidden, self.ffn))
            self.w2[s].copy_(buf[n:].view(self.ffn, self.hidden))
        new = swap_plan.placement.slot_expert[r]
        emptied = np.flatnonzero((new < 0) & (old[r] >= 0))
        for s in emptied.tolist():
            self.w1[s].zero_()
            self.w2[s].zero_()
        d.set_placement(swap_plan.placement)
        return sent

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
    """Apply swap weight copies to any per-slot weight tensors of this rank.

    ``weights``: tensors ``[S, ...]`` (slot-major: e.g. ``gate_up [S, 2F, H]`` and ``down [S, H, F]``);
    ``copies [M, 3]``: ``(src_global_slot, dst_global_slot, expert)`` from ``zepp.planner.swaps.plan_swaps``;
    ``old_slot_expert`` / ``new_slot_expert [R, S]``: the placements before and after. Copies read the
    old weights (staged first), stay inside a node (``SwapError`` otherwise), and go point-to-point
    over the dispatcher's group; slots emptied by the swap become zero. Every rank calls this with
    the same arguments. Returns the weight bytes this rank sent (``sent_to [R]``, if given, adds
    them per destination rank).
    """
    d = dispatcher
    S, L, r = old_slot_expert.shape[1], d.gpus_per_node, d.rank
    copies = check_swap_copies(copies, S, L)
    if np.any(np.asarray(old_slot_expert).ravel()[copies[:, 0]] != copies[:, 2]):
        raise SwapError("a swap copy reads a slot that does not hold its expert")
    sizes = [w[0].numel() for w in weights]
    ops, staged, sent = [], [], 0
    for i, (a, b, e) in enumerate(copies.tolist()):
        ra, rb = a // S, b // S
        if ra == r:
            buf = torch.cat([w[a - r * S].reshape(-1) for w in weights])
        if rb == r:
            if ra != r:
                buf = weights[0].new_empty(sum(sizes), device="cpu" if d.host_p2p else None)
                ops.append(dist.P2POp(dist.irecv, buf, ra, d.group, tag_base + i))
            staged.append((b - r * S, buf))
        elif ra == r:
            buf = buf.cpu() if d.host_p2p else buf
            ops.append(dist.P2POp(dist.isend, buf, rb, d.group, tag_base + i))
            sent += buf.numel() * buf.element_size()
            if sent_to is not None:
                sent_to[rb] += buf.numel() * buf.element_size()
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    for s, buf in staged:
        buf, off = buf.to(weights[0].device), 0
        for w, n in zip(weights, sizes):
            w[s].copy_(buf[off: off + n].view(w[s].shape))
            off += n
    emptied = np.flatnonzero((np.asarray(new_slot_expert)[r] < 0) & (np.asarray(old_slot_expert)[r] >= 0))
    for s in emptied.tolist():
        for w in weights:
            w[s].zero_()
    return sent
