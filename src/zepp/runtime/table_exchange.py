"""The ``table`` path (``zepp.planner.routing.decode_path``): a layer without a global plan.

Rank ``r`` holds ``x [T_r, H]``, the router's ``ids`` / ``w [T_r, k]`` and ``slot [T_r, k]``, the
global slots its own entries route to (``zepp.planner.routing.table_routing.rank_slots``: a
lookup, no exchange). Every rank knows every ``T_q`` (the step's counts), so:

1. dispatch, one ``all_to_all_single`` with fixed capacity: rank ``r`` sends all its ``T_r`` rows
   to every rank ``q`` (``T_r`` rows per pair, the receiver expects exactly that), each row
   followed by its metadata for ``q``: per choice ``j`` the local slot on ``q`` (``-1``: not on
   ``q``) and the gate weight (int32 / fp32 bits, carried in the row's dtype);
2. rank ``q`` computes the entries it holds (grouped by local slot) and sums each row's
   gate-weighted outputs in increasing ``j`` into one fp32 partial per received row;
3. combine, the same layout backwards; the owner sums its ``R`` partials in rank order.

Summation order is fixed (``j`` within a rank, then rank order), so results are repeatable.
Rows of a (token, rank) pair with no entry travel too: that is the price of no count
exchange, and the cost model picks this path only where it pays.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist


def _meta_cols(k: int, dtype: torch.dtype) -> int:
    return 2 * k * 4 // torch.empty(0, dtype=dtype).element_size()


def table_layer(d, x: torch.Tensor, slot: torch.Tensor, w: torch.Tensor, counts: np.ndarray, expert_fn,
                timing: dict) -> torch.Tensor:
    """One layer on the table path. ``d``: the ``Dispatcher`` (group, placement, counters);
    ``x [T, H]``; ``slot [T, k]`` int64 global slots (``-1``: none); ``w [T, k]``; ``counts [R]``
    every rank's ``T``; ``expert_fn(rows [n, H], local_slot [n] numpy, sorted) -> [n, H]``.
    Returns ``y [T, H]`` fp32; ``timing`` gets ``pack``, ``d0``, ``compute``, ``c0``."""
    t0 = time.perf_counter()
    R, rank, S = d.world, d.rank, d.placement.slots_per_rank
    T, H = x.shape
    k = slot.shape[1]
    dev, dt = x.device, x.dtype
    counts = np.asarray(counts, np.int64)
    owner = torch.where(slot >= 0, slot // S, torch.full_like(slot, -1))
    loc = (slot % S).to(torch.int32)
    q = torch.arange(R, device=dev)[:, None, None]
    meta = torch.empty(R, T, 2 * k, dtype=torch.int32, device=dev)
    meta[:, :, :k] = torch.where(owner[None] == q, loc[None], torch.full_like(loc[None], -1))
    meta[:, :, k:] = w.to(torch.float32).view(torch.int32)[None]
    m = _meta_cols(k, dt)  # explicit: a rank with no rows (T = 0) still sends a [0, H + m] buffer
    send = torch.cat([x[None].expand(R, T, H), meta.view(dt).reshape(R, T, m)], dim=2).reshape(R * T, H + m)
    recv = send.new_empty(int(counts.sum()), send.shape[1])
    row = send.shape[1] * send.element_size()
    for p in range(R):
        if p != rank:
            d.counter.add("dispatch", p, T * row)
    t1 = time.perf_counter()
    dist.all_to_all_single(recv, send, counts.tolist(), [T] * R, group=d.group)
    t2 = time.perf_counter()
    partial = _compute(recv, H, k, expert_fn)
    t3 = time.perf_counter()
    back = partial.new_empty(R * T, H) if T else partial.new_empty(0, H)
    wire = d.combine_dtype or dt
    part_w = partial.to(wire)
    back = back.to(wire)
    for p in range(R):
        n = int(counts[p])
        if p != rank and n:
            d.counter.add("combine", p, n * H * part_w.element_size())
    dist.all_to_all_single(back, part_w, [T] * R, counts.tolist(), group=d.group)
    y = torch.zeros(T, H, dtype=torch.float32, device=dev)
    parts = back.view(R, T, H)
    for p in range(R):  # fixed order: rank 0, 1, ...
        y += parts[p].to(torch.float32)
    timing.update(pack=t1 - t0, d0=t2 - t1, compute=t3 - t2, c0=time.perf_counter() - t3)
    return y


def _compute(recv: torch.Tensor, H: int, k: int, expert_fn) -> torch.Tensor:
    """Received rows with metadata ``recv [n, H + m]`` -> fp32 partials ``[n, H]``."""
    n = recv.shape[0]
    partial = torch.zeros(n, H, dtype=torch.float32, device=recv.device)
    if not n:
        return partial
    meta = recv[:, H:].contiguous().view(torch.int32)  # [n, 2k]
    lslot, wts = meta[:, :k], meta[:, k:].view(torch.float32)
    i, j = torch.nonzero(lslot >= 0, as_tuple=True)
    if not i.numel():
        return partial
    s = lslot[i, j].to(torch.int64)
    order = torch.argsort(s * (n * k) + i * k + j)  # by slot, then row, then j: one stable grouping
    i, j, s = i[order], j[order], s[order]
    out = expert_fn(recv[i, :H], s.cpu().numpy()).to(torch.float32) * wts[i, j][:, None]
    for jj in range(k):  # increasing j: each row gets at most one entry per j, so no two adds collide
        m = j == jj
        if bool(m.any()):
            partial.index_add_(0, i[m], out[m])
    return partial
