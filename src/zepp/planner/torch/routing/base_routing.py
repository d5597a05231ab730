"""Shared by every torch routing: the capture rule, the batch check, the routing record, grouping
and hashing of entries (the torch twin of ``zepp.planner.routing.base_routing``).

A torch router takes a checked batch ``ids [R, T, k]`` int64 on any device (``-1``: a missing
entry), the placement's device tables (``DevicePlacement``), the relaxation ``C``, the vacate
rounds, ``sync`` and ``sweeps`` (``zepp.planner.torch.routing``), and returns a ``TorchRouting``
whose ``slot`` equals the numpy router's. Nothing here reads a value back to the host, except the
batch check's value test when asked to.
"""

from __future__ import annotations

import numpy as np
import torch

from zepp.errors import ZeppInputError
from zepp.planner.routing.base_routing import HASH_ADD, HASH_MOD, HASH_MUL
from zepp.planner.routing.base_routing import check_batch as numpy_check_batch
from zepp.planner.torch._ops import I64, counts, sorted_keys
from zepp.planner.torch.routing.device_placement import DevicePlacement
from zepp.planner.torch.types import TorchRouting
from zepp.planner.types import Placement


def default_sync(t: torch.Tensor) -> bool:
    """Host reads are allowed unless a CUDA graph is being captured on the current stream."""
    return not (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def as_device_ids(topk_ids, device=None) -> torch.Tensor:
    """``topk_ids [R, T, k]`` as an int64 tensor on ``device`` (a tensor stays on its device unless
    ``device`` is given); a numpy batch must hold integers."""
    if isinstance(topk_ids, torch.Tensor):
        return topk_ids if device is None else topk_ids.to(device)
    arr = np.asarray(topk_ids)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {arr.dtype}")
    return torch.as_tensor(arr.astype(np.int64), device=device)


def check_batch(topk_ids: torch.Tensor, placement: Placement, read_values: bool) -> torch.Tensor:
    """Check ``topk_ids [R, T, k]`` (shape and dtype always; values in ``[-1, E)`` only when
    ``read_values``, which reads the data on the host: one flag, and on a bad id the batch, which
    the numpy planner's ``check_batch`` then names). Returns it as int64."""
    if not isinstance(topk_ids, torch.Tensor):
        raise ZeppInputError(f"the torch planner takes a torch tensor, got {type(topk_ids).__name__}")
    if topk_ids.dim() != 3:
        raise ZeppInputError(f"batch topk_ids must be [ranks, tokens, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[0] != placement.ranks:
        raise ZeppInputError(f"batch has {topk_ids.shape[0]} ranks but the placement has {placement.ranks}")
    if topk_ids.dtype == torch.bool or topk_ids.is_floating_point() or topk_ids.is_complex():
        raise ZeppInputError(f"batch topk_ids must be integers, got dtype {topk_ids.dtype}")
    ids = topk_ids.to(I64)
    if read_values and ids.numel() and _out_of_range(ids, placement.num_experts):
        numpy_check_batch(ids.cpu().numpy(), placement)  # raises, naming the first bad entry
    return ids


def _out_of_range(ids: torch.Tensor, num_experts: int) -> bool:
    """Whether an id lies outside ``[-1, num_experts)`` (one pass, one host read)."""
    lo, hi = torch.aminmax(ids)
    return not (-1 <= int(lo) and int(hi) < num_experts)


def slot_routing(ids: torch.Tensor, slot: torch.Tensor, dp: DevicePlacement, relaxation: float | None = None,
                 unplaced: torch.Tensor | None = None, overflow: torch.Tensor | None = None,
                 masked: bool = False, columns: torch.Tensor | None = None) -> TorchRouting:
    """The ``TorchRouting`` of ``slot [R, T, k]`` (any value where an entry is missing: it becomes
    ``-1``; ``masked``: it is ``-1`` there already); ``relaxation``: the C whose bounds the routing
    promises; ``unplaced`` and ``overflow``: the water-fill's and the vacate pass's flags;
    ``columns``: the same slots column by column ``[k, G]`` int32 where the router has them
    (``zepp.planner.torch.types.TorchRouting``)."""
    if not masked:
        slot = torch.where(ids < 0, -1, slot)
    return TorchRouting(ids.to(torch.int32), slot.to(torch.int32), dp.placement, relaxation, unplaced, overflow,
                        columns=columns)


def position_in_group(key: torch.Tensor, num_keys: int) -> torch.Tensor:
    """For each element of ``key [n]`` (int32 or int64 in ``[0, num_keys]``), how many earlier
    elements share its key. ``[n]`` int32 (int64 from 2**31 elements). Key ``num_keys`` means
    "in no group" (its positions are meaningless). A stable sort, as in numpy; no host read."""
    n = key.shape[0]
    dtype = torch.int32 if n < 1 << 31 else I64
    sorted_key, order = sorted_keys(key, num_keys)
    c = counts(sorted_key, num_keys + 1)
    starts = (torch.cumsum(c, 0) - c).to(dtype)
    place = torch.arange(n, dtype=dtype, device=key.device) - starts.gather(0, sorted_key)
    return torch.empty(n, dtype=dtype, device=key.device).scatter_(0, order, place)


def entry_hash(index: torch.Tensor) -> torch.Tensor:
    """The numpy planner's ``entry_hash`` in torch: ``[n]`` int64 -> ``[n]`` int64 in ``[0, 2**31)``."""
    x = index.to(I64) % HASH_MOD
    for _ in range(2):
        x = (x * HASH_MUL + HASH_ADD) % HASH_MOD
        x = x ^ (x >> 16)
    return x
