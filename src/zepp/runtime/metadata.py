"""The metadata all-gather: every rank's router output, so that every rank plans the same batch.

Ragged batches are first-class: rank ``r`` passes its own ``T_r`` tokens (zero is fine: a rank
with nothing to send still takes part). The all-gather first exchanges the counts ``T_r``, then
the ids and gate weights padded with ``-1`` / ``0`` to ``Tmax = max T_r``; the planner sees
``topk_ids [R, Tmax, k]`` with ``-1`` for missing entries, which produce no hops, so padding
never reaches the wire. A caller that already knows every rank's count for a step (a serving
engine, once per step for all layers) passes it (``Dispatcher.expect_tokens``) and saves that
collective. The bytes go to the ``metadata`` phase of the Dispatcher's ``LinkCounter``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError


@dataclass
class GatheredBatch:
    """Every rank's router output: ``ids [R, Tmax, k]`` for the planner (a tensor on the device
    when that is not the CPU, so the planner runs there, else numpy; ``-1`` for missing tokens),
    ``weights [R, Tmax, k]`` fp32 tensor (0 for missing tokens), ``device_ids [R, Tmax, k]``
    int64 on the device, ``counts [R]`` the tokens ``T_r``."""

    ids: np.ndarray | torch.Tensor
    weights: torch.Tensor
    device_ids: torch.Tensor
    counts: np.ndarray


def gather_counts(d, T: int) -> np.ndarray:
    """``[R]`` tokens per rank (one small all-gather, unless ``d.expected_counts`` holds them)."""
    if d.expected_counts is not None:
        if int(d.expected_counts[d.rank]) != T:
            raise ZeppInputError(f"rank {d.rank}: expect_tokens said {int(d.expected_counts[d.rank])} tokens, "
                                 f"the batch has {T}")
        return d.expected_counts
    c = torch.tensor([T], dtype=torch.int64, device=d.device)
    return all_gather_rows(d, c).reshape(-1).cpu().numpy()


def all_gather_rows(d, t: torch.Tensor) -> torch.Tensor:
    """``[R, *t.shape]``: every rank's ``t`` (same shape on every rank) over ``d.group``; the bytes
    each peer gets go to the ``metadata`` phase of ``d.counter``. On gloo, where the Dispatcher has
    node and rail groups (``d.node_groups`` / ``d.rail_groups``: the default group, several nodes
    of several ranks), two ``all_to_all_single`` calls: within the node, then each rank sends its
    node's ``L`` rows to the ranks of its rail on the other nodes (``(L-1) + (N-1)`` peers, not
    ``R-1``: the same NIC bytes per rank, ``(R-L)`` rows, in ``N-1`` messages instead of ``R-L``;
    gloo's all-to-all walks its peers in a ring, one step after another, and each step waits for
    a peer to be scheduled and pays the kernel's per-message cost, which on a loaded host cost
    more than the bytes). Else one ``all_to_all_single`` over the group (gloo), or ``all_gather``."""
    if t.numel() == 0:  # every rank knows it (the counts are gathered first): nothing to exchange
        return t.new_empty((d.world, *t.shape))
    nbytes = t.numel() * t.element_size()
    if dist.get_backend(d.group) != "gloo":
        out = [torch.empty_like(t) for _ in range(d.world)]
        dist.all_gather(out, t, group=d.group)
        _count(d, np.arange(d.world), nbytes)
        return torch.stack(out)
    L = d.gpus_per_node
    N = d.world // L
    if L > 1 and N > 1 and d.node_groups and d.rail_groups:
        node = torch.empty((L, *t.shape), dtype=t.dtype, device=t.device)
        dist.all_to_all_single(node, t.unsqueeze(0).expand(L, *t.shape).contiguous(), group=d.node_groups[d.rank // L])
        out = torch.empty((N, L, *t.shape), dtype=t.dtype, device=t.device)
        dist.all_to_all_single(out, node.unsqueeze(0).expand(N, L, *t.shape).contiguous(),
                               group=d.rail_groups[d.rank % L])
        _count(d, np.arange(d.rank // L * L, d.rank // L * L + L), nbytes)
        _count(d, np.arange(d.rank % L, d.world, L), L * nbytes)
        return out.reshape(d.world, *t.shape)
    out = torch.empty((d.world, *t.shape), dtype=t.dtype, device=t.device)
    dist.all_to_all_single(out, t.unsqueeze(0).expand(d.world, *t.shape).contiguous(), group=d.group)
    _count(d, np.arange(d.world), nbytes)
    return out


def _count(d, peers: np.ndarray, nbytes: int) -> None:
    """``nbytes`` of the metadata phase to each of ``peers`` but this rank."""
    for q in peers.tolist():
        if q != d.rank:
            d.counter.add("metadata", q, nbytes)


def gather_metadata(d, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> GatheredBatch:
    """All-gather (``all_gather_rows``) this rank's ``topk_ids [T_r, k]`` and ``topk_weights
    [T_r, k]`` over the Dispatcher ``d``'s group (the ids and the weights' bits packed in one
    int32 tensor)."""
    T, k = topk_ids.shape
    counts = gather_counts(d, T)
    Tmax = int(counts.max()) if counts.size else 0
    packed = torch.full((Tmax, 2 * k), -1, dtype=torch.int32, device=d.device)
    packed[:, k:] = 0
    if T:
        packed[:T, :k] = topk_ids.to(d.device, torch.int32)
        packed[:T, k:] = topk_weights.to(d.device, torch.float32).view(torch.int32)
    allp = all_gather_rows(d, packed)
    device_ids = allp[:, :, :k].to(torch.int64)
    # on a GPU the ids stay there for the device planner; on the CPU numpy plans them
    ids = device_ids if device_ids.device.type != "cpu" else device_ids.numpy()
    w = allp[:, :, k:].contiguous().view(torch.float32)
    return GatheredBatch(ids, w, device_ids, counts)
