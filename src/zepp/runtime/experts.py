"""Expert weights and the grouped expert computation: the layer benchmark's GELU MLP ``H -> FFN -> H``
and, for served checkpoints (``zepp.serve``), gated experts (``grouped_gated_up`` / ``grouped_linear_down``).

Weights are a deterministic function of ``(seed, expert)``, so every rank can create any
expert's weights and replicas are identical without a broadcast (in production they come from
a checkpoint). Generated in fp32 on the CPU, then cast and moved, so CPU and CUDA agree.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def expert_weights(seed: int, expert: int, hidden: int, ffn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w1 [H, F], w2 [F, H])`` fp32 CPU weights of logical expert ``expert``."""
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(expert)) % (2**63 - 1))
    w1 = torch.randn(hidden, ffn, generator=g) / hidden**0.5
    w2 = torch.randn(ffn, hidden, generator=g) / ffn**0.5
    return w1, w2


def cached_weights(seed: int, expert: int, hidden: int, ffn: int, dtype, device, cache: dict | None):
    """``expert_weights`` cast to ``dtype`` on ``device``, memoised in ``cache`` (a dict) if given."""
    key = (seed, expert, hidden, ffn, dtype, str(device))
    if cache is not None and key in cache:
        return cache[key]
    w1, w2 = expert_weights(seed, expert, hidden, ffn)
    out = (w1.to(device, dtype), w2.to(device, dtype))
    if cache is not None:
        cache[key] = out
    return out


def slot_weights(slot_expert: np.ndarray, seed: int, hidden: int, ffn: int, dtype=torch.float32,
                 device=None, cache: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w1 [S, H, F], w2 [S, F, H])`` for one rank's slots ``slot_expert [S]`` (``-1`` -> zeros)."""
    S = len(slot_expert)
    w1 = torch.zeros(S, hidden, ffn, dtype=dtype, device=device)
    w2 = torch.zeros(S, ffn, hidden, dtype=dtype, device=device)
    for s, e in enumerate(np.asarray(slot_expert).tolist()):
        if e >= 0:
            a, b = cached_weights(seed, e, hidden, ffn, dtype, device, cache)
            w1[s].copy_(a)
            w2[s].copy_(b)
    return w1, w2


def grouped_up(rows: torch.Tensor, slot: np.ndarray, w1: torch.Tensor) -> torch.Tensor:
    """First GEMM + GELU: ``rows [n, H]`` sorted by ``slot [n]`` -> ``[n, F]``."""
    out = rows.new_empty(rows.shape[0], w1.shape[2])
    for s, a, b in _segments(slot):
        out[a:b] = F.gelu(rows[a:b] @ w1[s])
    return out


def grouped_down(inter: torch.Tensor, slot: np.ndarray, w2: torch.Tensor) -> torch.Tensor:
    """Second GEMM: ``inter [n, F]`` sorted by ``slot [n]`` -> ``[n, H]``."""
    out = inter.new_empty(inter.shape[0], w2.shape[2])
    for s, a, b in _segments(slot):
        out[a:b] = inter[a:b] @ w2[s]
    return out


def _segments(slot: np.ndarray):
    """``(slot, start, end)`` of each run of equal values in sorted ``slot [n]``."""
    slot = np.asarray(slot)
    if slot.size == 0:
        return []
    cut = np.flatnonzero(slot[1:] != slot[:-1]) + 1
    starts = np.r_[0, cut]
    ends = np.r_[cut, slot.size]
    return zip(slot[starts].tolist(), starts.tolist(), ends.tolist())


def grouped_gated_up(rows: torch.Tensor, slot: np.ndarray, gate_up: torch.Tensor, act) -> torch.Tensor:
    """Gated first GEMM (SwiGLU and kin): ``rows [n, H]`` sorted by ``slot [n]``, ``gate_up [S, 2F, H]``
    (a Hugging Face expert's ``gate_proj`` rows, then ``up_proj`` rows) -> ``act(x W_g^T) * (x W_u^T)``
    ``[n, F]``, the same ops per expert as the model's own expert module."""
    out = rows.new_empty(rows.shape[0], gate_up.shape[1] // 2)
    for s, a, b in _segments(slot):
        g, u = F.linear(rows[a:b], gate_up[s]).chunk(2, dim=-1)
        out[a:b] = act(g) * u
    return out


def grouped_linear_down(inter: torch.Tensor, slot: np.ndarray, down: torch.Tensor) -> torch.Tensor:
    """Second GEMM: ``inter [n, F]`` sorted by ``slot [n]``, ``down [S, H, F]`` -> ``[n, H]``."""
    out = inter.new_empty(inter.shape[0], down.shape[1])
    for s, a, b in _segments(slot):
        out[a:b] = F.linear(inter[a:b], down[s])
    return out
