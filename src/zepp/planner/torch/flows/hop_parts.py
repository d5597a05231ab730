"""Filling a torch hop table: hop groups as masked candidate lists, packed into one ``TorchHops``.

The torch planner's stand-in for ``zepp.planner.types.Hops.make`` / ``Hops.concat`` (a torch-only
helper: the numpy planner's tables are built at their exact size, a device table may be a
fixed-capacity buffer, see ``zepp.planner.torch.types``).
"""

from __future__ import annotations

import torch

from zepp.planner.torch._ops import arange
from zepp.planner.torch.types import HOP_TENSOR_DTYPES, TorchHops

_DTYPES = HOP_TENSOR_DTYPES
_COLS = tuple(_DTYPES)
_SPILL = 1024  # spill columns past a fixed-capacity table (a power of two)


class _Kept:
    """The kept rows of a 2-D mask ``[A, B]`` (row-major): gathers a column broadcastable to
    the mask (``[A, B]``, ``[A, 1]``, ``[1, B]`` or ``[B]``) at them without materialising the
    broadcast (row and column indices computed once per mask)."""

    def __init__(self, mask: torch.Tensor):
        self.shape = mask.shape
        self.flat = torch.nonzero(mask.reshape(-1))[:, 0]
        self._rc = None

    def take(self, v: torch.Tensor) -> torch.Tensor:
        A, B = self.shape
        if v.dim() == 1:
            v = v.reshape(1, -1)
        if tuple(v.shape) == (A, B):
            return v.reshape(-1)[self.flat]
        if self._rc is None:
            self._rc = (self.flat // B, self.flat % B)
        rows, cols = self._rc
        if v.shape[0] == 1 and v.shape[1] == 1:
            return v.reshape(1).expand(self.flat.shape[0])
        return v.reshape(-1)[rows] if v.shape[1] == 1 else v.reshape(-1)[cols]


class HopParts:
    """Collects hop groups as masked candidate lists and packs them into one ``TorchHops``.

    ``add(mask, stage, src, dst, owner, token, msg=0, entry=-1)``: the candidates of one group
    in table order (tensors broadcastable to ``mask``'s shape, or Python ints); the kept ones are
    those where ``mask`` is True. ``pack(exact)`` concatenates the groups in the order added:

    - ``exact=False``: into a fixed-capacity buffer (capacity = all candidates), kept rows
      compacted to the front by a prefix sum and a scatter; no host read (capturable).
    - ``exact=True``: only the kept rows (``nonzero``, whose output size is read on the
      host), so ``capacity == count``; for CPU tensors, where that read is free and the smaller
      tables are faster.
    """

    def __init__(self, device):
        self.device = device
        self.groups: list[tuple[torch.Tensor, tuple]] = []

    def add(self, mask, stage, src, dst, owner, token, msg=0, entry=-1) -> None:
        self.groups.append((mask, (stage, src, dst, owner, token, msg, entry)))

    def pack(self, exact: bool = False) -> TorchHops:
        dev = self.device
        if exact:
            out = {c: [] for c in _COLS}
            for mask, vals in self.groups:
                kept = _Kept(mask)
                for c, v in zip(_COLS, vals):
                    if isinstance(v, torch.Tensor):
                        out[c].append(kept.take(v).to(_DTYPES[c]))
                    else:
                        out[c].append(torch.full(kept.flat.shape, int(v), dtype=_DTYPES[c], device=dev))
            cols = {c: (torch.cat(v) if v else torch.zeros(0, dtype=_DTYPES[c], device=dev)) for c, v in out.items()}
            n = cols["src"].shape[0]
            return TorchHops(**cols, count=torch.tensor(n, dtype=torch.int64, device=dev))
        cap = sum(m.numel() for m, _ in self.groups)
        # all columns, one scatter per group; the rows a mask leaves out land past ``cap`` in
        # ``_SPILL`` columns by position (on a GPU, stores to a single spill cell serialise)
        buf = torch.zeros(len(_COLS), cap + _SPILL, dtype=torch.int32, device=dev)
        offset = torch.zeros((), dtype=torch.int64, device=dev)
        for mask, vals in self.groups:
            m = mask.reshape(-1)
            n = m.shape[0]
            within = torch.cumsum(m, 0, dtype=torch.int64)
            dest = torch.where(m, offset + within - 1, cap + (arange(n, dev) & (_SPILL - 1)))
            if n:
                offset = offset + within[-1]
            cols = torch.stack([self._i32(v, mask.shape) for v in vals]).reshape(len(_COLS), n)  # [7, n]
            buf.scatter_(1, dest.expand(len(_COLS), n), cols)
        out = {c: (buf[i, :cap] if _DTYPES[c] == torch.int32 else buf[i, :cap].to(_DTYPES[c]))
               for i, c in enumerate(_COLS)}
        return TorchHops(**out, count=offset)

    def _i32(self, v, shape) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return (v if v.dtype == torch.int32 else v.to(torch.int32)).expand(shape)
        return torch.full((1,) * len(shape), int(v), dtype=torch.int32, device=self.device).expand(shape)
