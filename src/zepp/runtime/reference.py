"""Single-process reference MoE and an in-process executor of the per-rank programs.

``reference_moe`` is the ground truth: ``y[t] = sum_{j=0..k-1} w[t, j] * expert_{ids[t, j]}(x[t])``,
summed in fp32 in increasing ``j``; it creates each needed expert's weights once, on the fly,
so it needs no more memory than one expert at a time.

``execute_local`` runs every rank's compiled program (``zepp.runtime.program``) in one process,
moving rows between ranks' buffers in place of the network: the same index arrays and the same
summation order as the distributed ``Dispatcher``, so it checks the hop semantics fast (and on
one GPU, where NCCL cannot run two ranks).
"""

from __future__ import annotations

import numpy as np
import torch

from zepp.planner.types import FlowPlan
from zepp.runtime.experts import cached_weights, grouped_down, grouped_up, slot_weights
from zepp.runtime.program import RankProgram, compile_rank


def reference_moe(x: torch.Tensor, topk_ids: np.ndarray, topk_weights: torch.Tensor, seed: int, ffn: int,
                  dtype: torch.dtype | None = None, cache: dict | None = None) -> torch.Tensor:
    """``x [T, H]``, ``topk_ids [T, k]``, ``topk_weights [T, k]`` -> ``y [T, H]`` (dtype of ``x``).

    Expert compute in ``dtype`` (default ``x.dtype``), weighted sum in fp32."""
    dtype = dtype or x.dtype
    T, H = x.shape
    ids = np.asarray(topk_ids)
    k = ids.shape[1]
    out = torch.zeros(T, k, H, dtype=torch.float32, device=x.device)
    for e in np.unique(ids).tolist():
        t, j = np.nonzero(ids == e)
        w1, w2 = cached_weights(seed, e, H, ffn, dtype, x.device, cache)
        ti, tj = torch.as_tensor(t, device=x.device), torch.as_tensor(j, device=x.device)
        out[ti, tj] = (torch.nn.functional.gelu(x[ti].to(dtype) @ w1) @ w2).to(torch.float32)
    w = topk_weights.to(torch.float32)
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for j in range(k):
        y += out[:, j] * w[:, j, None]
    return y.to(x.dtype)


def execute_local(plan: FlowPlan, x: torch.Tensor, topk_weights: torch.Tensor, seed: int, ffn: int,
                  waves: bool = False, cache: dict | None = None,
                  granularity=None) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Run all ranks' programs in this process.

    ``granularity`` (a ``zepp.planner.overlap.granularity.Granularity``, with ``waves``): the programs are
    compiled with it and GEMM 1 runs per coarse dispatch group, GEMM 2 per coarse wave (as the
    Dispatcher runs them), so its numerics can be compared with one GEMM per phase.

    ``x [R, T, H]``, ``topk_weights [R, T, k]`` -> ``(y [R, T, H], sent_dispatch [R, R],
    sent_combine [R, R])`` where ``sent_*[i, j]`` are bytes rank i sent to rank j. ``cache``: a
    dict memoising expert weights across calls.
    """
    R, T, H = x.shape
    progs: list[RankProgram] = [compile_rank(plan, r, waves=waves, granularity=granularity) for r in range(R)]
    row = H * x.element_size()
    sent_d = np.zeros((R, R), np.int64)
    sent_c = np.zeros((R, R), np.int64)
    held = _dispatch_local(progs, x, sent_d, row)
    outs = [_experts_local(p, held[r], plan.routing.placement.slot_expert[r], seed, ffn, cache)
            for r, p in enumerate(progs)]
    stores = [_entries_into_units(p, outs[r], topk_weights) for r, p in enumerate(progs)]
    _combine_local(progs, stores, x.dtype, H, sent_c, row)
    y = torch.zeros(R, T, H, dtype=torch.float32, device=x.device)
    for r, p in enumerate(progs):
        for tok, sidx in p.final_rounds:
            y[r].index_add_(0, _t(tok, x.device), stores[r][_t(sidx, x.device)])
    return y.to(x.dtype), sent_d, sent_c


def _t(a: np.ndarray, device) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.int64, device=device)


def _dispatch_local(progs: list[RankProgram], x: torch.Tensor, sent: np.ndarray, row: int) -> list[torch.Tensor]:
    """Every rank's held buffer ``[held_size, H]`` after the dispatch stages (own rows first)."""
    R, T, H = x.shape
    held = [torch.empty(p.held_size, H, dtype=x.dtype, device=x.device) for p in progs]
    for r in range(R):
        held[r][:T] = x[r]
    for s in range(len(progs[0].dispatch)):
        sends = [held[r][_t(p.dispatch[s].send_idx, x.device)] for r, p in enumerate(progs)]
        _exchange(progs, s, "dispatch", sends, lambda r, p: held[r][p.dispatch[s].recv_off:], sent, row)
    return held


def _experts_local(p: RankProgram, held: torch.Tensor, slot_expert: np.ndarray, seed: int, ffn: int,
                   cache: dict | None) -> torch.Tensor:
    """One rank's expert outputs ``[n, H]`` in expert-input order: one GEMM per phase, or (with a
    granularity) GEMM 1 per coarse dispatch group and GEMM 2 per coarse combine wave."""
    dev, dt, H = held.device, held.dtype, held.shape[1]
    w1, w2 = slot_weights(slot_expert, seed, H, ffn, dtype=dt, device=dev, cache=cache)
    rows = held[_t(p.e_pos, dev)]
    if p.e_group is None:
        return grouped_down(grouped_up(rows, p.e_slot, w1), p.e_slot, w2)
    mid = None
    for gi in range(p.group_need.size):  # GEMM 1 per coarse dispatch group
        m = np.flatnonzero(p.e_group == gi)
        if m.size:
            part = grouped_up(rows[_t(m, dev)], p.e_slot[m], w1)
            mid = torch.empty(rows.shape[0], part.shape[1], dtype=part.dtype, device=dev) if mid is None else mid
            mid[_t(m, dev)] = part
    out = torch.zeros(rows.shape[0], H, dtype=dt, device=dev)
    for wi in range(p.num_waves):  # GEMM 2 per coarse combine wave
        m = np.flatnonzero(p.e_wave == wi)
        if m.size:
            out[_t(m, dev)] = grouped_down(mid[_t(m, dev)], p.e_slot[m], w2)
    return out


def _entries_into_units(p: RankProgram, out: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """One rank's combine store ``[U, H]`` fp32: gate-weighted outputs summed into their units in
    increasing ``j``."""
    dev = out.device
    st = torch.zeros(p.store_size, out.shape[1], dtype=torch.float32, device=dev)
    w = topk_weights[_t(p.e_owner, dev), _t(p.e_token, dev), _t(p.e_j, dev)].to(torch.float32)
    contrib = out.to(torch.float32) * w[:, None]
    for j in range(p.top_k):
        m = np.flatnonzero(p.e_j == j)
        st.index_add_(0, _t(p.e_unit[m], dev), contrib[_t(m, dev)])
    return st


def _combine_local(progs: list[RankProgram], stores: list[torch.Tensor], dt: torch.dtype, H: int,
                   sent: np.ndarray, row: int) -> None:
    """The combine stages: units move (in the wire dtype ``dt``) and add into the receivers' stores."""
    dev = stores[0].device
    for s in range(len(progs[0].combine)):
        sends = []
        for r, p in enumerate(progs):
            idx = _t(p.combine[s].send_idx, dev)
            sends.append(stores[r][idx].to(dt))
            stores[r][idx] = 0.0
        recvs = [torch.empty(p.combine[s].n_recv, H, dtype=dt, device=dev) for p in progs]
        _exchange(progs, s, "combine", sends, lambda r, p: recvs[r], sent, row)
        for r, p in enumerate(progs):
            r32 = recvs[r].to(torch.float32)
            for pos, sidx in p.combine[s].rounds:
                stores[r].index_add_(0, _t(sidx, dev), r32[_t(pos, dev)])


def _exchange(progs, s, phase, sends, recv_of, sent, row) -> None:
    """Move stage ``s`` rows: sender layout (wave, dst), receiver layout (wave, src)."""
    R = len(progs)
    st = [(p.dispatch if phase == "dispatch" else p.combine)[s] for p in progs]
    W = st[0].send_counts.shape[1]
    so = [np.r_[0, np.cumsum(x.send_counts.T.ravel())] for x in st]
    ro = [np.r_[0, np.cumsum(x.recv_counts.T.ravel())] for x in st]
    for dst in range(R):
        buf = recv_of(dst, progs[dst])
        for w in range(W):
            for src in range(R):
                n = int(st[src].send_counts[dst, w])
                assert n == int(st[dst].recv_counts[src, w]), "send/recv counts disagree"
                if n:
                    a, b = int(so[src][w * R + dst]), int(ro[dst][w * R + src])
                    buf[b: b + n] = sends[src][a: a + n]
                    sent[src, dst] += n * row
