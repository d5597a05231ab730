"""Small tensor building blocks of the device planner: fixed shapes, integer arithmetic, no host reads
(torch-only helpers; the numpy planner's are numpy calls).

Every function here takes and returns tensors on one device and never reads a value back to
the host, so a sequence of them can be captured in a CUDA graph for fixed input shapes.
"""

from __future__ import annotations

import torch

I64 = torch.int64
I32 = torch.int32


def arange(n: int, device) -> torch.Tensor:
    return torch.arange(n, dtype=I64, device=device)


# From this many keys on, a device counts by sorting (``sorted_counts``) rather than by atomic adds.
SORTED_COUNTS_FROM = 1 << 16


def counts(key: torch.Tensor, num_keys: int) -> torch.Tensor:
    """``[num_keys]`` int64 histogram of ``key [n]`` (int32 or int64 values in ``[0, num_keys]``;
    the value ``num_keys`` is a drop bin). Fixed output size. On the CPU ``torch.bincount``, the
    fastest there (on CUDA it sizes its output from the data's maximum, a host read). On a device
    below ``SORTED_COUNTS_FROM`` keys a ``scatter_add_`` (fewest kernels); from there on
    ``sorted_counts``: an H200 spent 5 of Zepp's 8 ms of routing at 598k entries in the atomic
    adds, which serialise on the hot bins (few experts, many entries)."""
    if key.device.type == "cpu":
        return torch.bincount(key, minlength=num_keys + 1)[:num_keys]
    if key.numel() >= SORTED_COUNTS_FROM:
        return sorted_counts(key, num_keys)
    key = key.to(I64)
    out = torch.zeros(num_keys + 1, dtype=I64, device=key.device)
    out.scatter_add_(0, key, torch.ones_like(key))
    return out[:num_keys]


def sorted_counts(key: torch.Tensor, num_keys: int) -> torch.Tensor:
    """``counts`` without atomics: the keys sorted (radix sort, in the narrowest type that holds
    ``num_keys``), then each key's first position found by binary search; the counts are the
    differences. ``[num_keys]`` int64; the same values as ``counts`` on any device."""
    dtype = torch.int16 if num_keys < (1 << 15) - 1 else torch.int32 if num_keys < (1 << 31) - 1 else I64
    values = torch.sort(key.reshape(-1).to(dtype)).values
    edges = torch.searchsorted(values, torch.arange(num_keys + 1, dtype=dtype, device=key.device))
    return edges[1:] - edges[:-1]


def row_cummax(x: torch.Tensor) -> torch.Tensor:
    """Running maximum along each row of ``x [n, k]`` (same shape and dtype). The CPU's
    ``torch.cummax``; on a device ``ceil(log2 k)`` shifted maxima, since CUDA's scan kernel is slow
    on short rows (0.8 of the hop tables' 2.2 ms on an H200 at 598k entries, k = 8)."""
    if x.device.type == "cpu":
        return torch.cummax(x, dim=1).values
    return shifted_cummax(x)


def shifted_cummax(x: torch.Tensor) -> torch.Tensor:
    """``row_cummax`` by doubling shifts: after the step of shift ``s`` each cell holds the maximum
    of the ``2s`` cells ending at it. Integer or floating ``x [n, k]``, any device."""
    lowest = torch.iinfo(x.dtype).min if not x.is_floating_point() else float("-inf")
    shift = 1
    while shift < x.shape[1]:
        x = torch.maximum(x, torch.nn.functional.pad(x[:, :-shift], (shift, 0), value=lowest))
        shift *= 2
    return x


def sort_order(key: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Stable ascending order of ``key [n]`` (values in ``[0, num_keys]``), sorted in the
    narrowest integer type that holds ``num_keys`` (int16 keys sort several times faster)."""
    return sorted_keys(key, num_keys)[1]


def sorted_keys(key: torch.Tensor, num_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted key [n] int64, order [n])``: ``sort_order`` and the keys in that order."""
    dtype = torch.int16 if num_keys < 1 << 15 else torch.int32 if num_keys < 1 << 31 else I64
    values, order = torch.sort(key.to(dtype), stable=True)
    return values.to(I64), order


def first_in_row(sorted_rows: torch.Tensor) -> torch.Tensor:
    """``[G, k]`` bool: True where an element differs from its left neighbour (and in column 0)."""
    first = torch.ones_like(sorted_rows, dtype=torch.bool)
    first[:, 1:] = sorted_rows[:, 1:] != sorted_rows[:, :-1]
    return first


def take(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table.reshape(-1)[index]`` (``index`` int32 or int64 of any shape) through
    ``index_select``, several times faster on the CPU than advanced indexing."""
    return table.reshape(-1).index_select(0, index.reshape(-1)).reshape(index.shape)


def select(mask: torch.Tensor, a, b) -> torch.Tensor:
    """``torch.where(mask, a, b)`` for integer operands, as ``b + (a - b) * mask`` (the CPU
    kernel of ``where`` is several times slower than these three elementwise ops)."""
    if isinstance(b, int) and b == 0:
        return a * mask
    return b + (a - b) * mask


def any_of(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``mask.any(dim)``, along an axis as the maximum of its bytes (the CPU kernel of ``any``
    along an axis is tens of times slower than ``amax`` over the same bytes)."""
    if dim is None or mask.numel() == 0:
        return mask.any() if dim is None else mask.any(dim)
    return mask.view(torch.uint8).amax(dim).view(torch.bool)


def list_token_major(mask: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed-size list of the true cells of ``mask [k, g]`` in token-major order (token ``j``'s
    cells before token ``j+1``'s; within a token, by row): ``(code [capacity] int64, total 0-d
    int64)``. ``code = row * g + j`` for the first ``min(total, capacity)`` cells, ``k * g`` (a
    spare index) after them; ``total > capacity`` means cells were left out (the caller's
    overflow flag). No host read: each cell's place is its token's offset (a prefix sum of the
    per-token counts) plus the cells above it in its column, and one scatter lists them."""
    k, g = mask.shape
    m = mask.to(I32)
    per_token = m.sum(0, dtype=I32)
    ends = torch.cumsum(per_token, 0, dtype=I32)
    total = ends[-1:].sum(dtype=I64) if g else torch.zeros((), dtype=I64, device=mask.device)
    place = torch.empty((k, g), dtype=I32, device=mask.device)  # 1-based place of each true cell
    torch.sub(ends, per_token - 1, out=place[0])
    for row in range(1, k):
        torch.add(place[row - 1], m[row - 1], out=place[row])
    return _scatter_places(place.reshape(-1), mask.reshape(-1), capacity, k * g), total


def list_true(mask: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(at [capacity] int64, total 0-d int64)``: the first ``capacity`` true positions of
    ``mask [n]`` in order, ``n`` (a spare index) after them (fixed size, no host read)."""
    n = mask.shape[0]
    place = torch.cumsum(mask, 0, dtype=I32)  # 1-based place of each true element
    total = place[-1:].sum(dtype=I64) if n else torch.zeros((), dtype=I64, device=mask.device)
    return _scatter_places(place, mask, capacity, n), total


def _scatter_places(place: torch.Tensor, mask: torch.Tensor, capacity: int, n: int) -> torch.Tensor:
    """``[capacity]`` int64: element ``i`` of ``arange(n)`` put at ``place[i] - 1`` where ``mask``
    and ``place[i] <= capacity``, ``n`` elsewhere (``place`` is overwritten). One scatter into
    ``capacity + 2`` cells whose first and last take the elements left out (arithmetic and a
    multiply by the mask only: the CPU kernels of comparisons with a scalar and of ``where`` are
    several times slower)."""
    at = place.clamp_max_(capacity + 1).mul_(mask).to(I64)  # 0: not listed; capacity + 1: past the end
    values = torch.arange(n, dtype=I32 if n < 1 << 31 else I64, device=mask.device)
    out = torch.full((capacity + 2,), n, dtype=values.dtype, device=mask.device)
    return out.scatter_(0, at, values)[1:capacity + 1].to(I64)
