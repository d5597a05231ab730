"""The device planner's plan objects: routings and hop tables as tensors.

A hop table's length depends on the data, so on the device it lives in a *fixed-capacity*
buffer: every column ``[capacity]`` with the first ``count`` elements valid (``count`` is a 0-d
int64 tensor on the same device) and the rest zero. The capacity is known from the batch shape
alone (``R*T*k`` per hop group), so building a table never reads a value back to the host.
``to_numpy()`` turns it into the numpy planner's ``zepp.planner.types.Hops`` with exactly one host read
(the count) plus the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from zepp.planner.types import HOP_COLUMNS, FlowPlan, FlowPlanFields, Hops, PlanInvariantError, Placement, Routing


class IncompletePlan(PlanInvariantError):
    """A water-fill run with fewer sweeps than its bound left entries unplaced: re-plan with
    the default ``sweeps=None``."""


_COLS = tuple(HOP_COLUMNS)
_NP_DTYPES = HOP_COLUMNS
_T_DTYPES = {c: {np.int8: torch.int8, np.int32: torch.int32}[dtype] for c, dtype in HOP_COLUMNS.items()}


@dataclass(frozen=True)
class TorchRouting:
    """``slot [R, T, k]`` int32 tensor (global slot per entry, ``-1`` for a missing entry) of
    ``topk_ids [R, T, k]`` on ``placement``; ``unplaced``: 0-d int64 tensor, entries the
    water-fill could not place (always 0 for a consistent placement; ``None`` for routings
    without a water-fill). Same meaning as ``zepp.planner.types.Routing``."""

    topk_ids: torch.Tensor
    slot: torch.Tensor
    placement: Placement
    relaxation: float | None = None
    unplaced: torch.Tensor | None = None

    @property
    def compute_rank(self) -> torch.Tensor:
        """``[R, T, k]`` int64 rank computing each entry (``-1`` for a missing entry)."""
        s = self.slot.to(torch.int64)
        return torch.where(s >= 0, s // self.placement.slots_per_rank, -1)

    def to_numpy(self, unplaced: int | None = None) -> Routing:
        """The numpy ``Routing`` (one device-to-host copy of ``topk_ids`` and ``slot``).
        Raises ``IncompletePlan`` when the water-fill left entries unplaced."""
        if unplaced is None and self.unplaced is not None:
            unplaced = int(self.unplaced)
        if unplaced:
            raise IncompletePlan(f"water-fill left {unplaced} entries unplaced (too few sweeps); re-plan")
        return Routing(self.topk_ids.cpu().numpy().astype(np.int32), self.slot.cpu().numpy().astype(np.int32),
                       self.placement, relaxation=self.relaxation)


@dataclass(frozen=True)
class TorchHops:
    """One phase's hop table in a fixed-capacity buffer (see module docstring).

    Columns ``[capacity]``: ``stage`` int8, ``src``/``dst``/``owner``/``token``/``msg`` int32,
    ``entry`` int8, meaning exactly what ``zepp.planner.types.Hops`` says; ``count``: 0-d int64 tensor.
    """

    stage: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    owner: torch.Tensor
    token: torch.Tensor
    msg: torch.Tensor
    entry: torch.Tensor
    count: torch.Tensor

    @property
    def capacity(self) -> int:
        return int(self.src.shape[0])

    def to_numpy(self, count: int | None = None) -> Hops:
        """``zepp.planner.types.Hops`` of the first ``count`` rows (one host read: the count, unless given)."""
        n = int(self.count) if count is None else int(count)
        if self.src.device.type == "cpu":
            return Hops(**{c: getattr(self, c)[:n].numpy().astype(_NP_DTYPES[c], copy=False) for c in _COLS})
        # one device-to-host copy of all seven columns
        host = torch.stack([getattr(self, c)[:n].to(torch.int32) for c in _COLS]).cpu().numpy()
        return Hops(**{c: host[i].astype(_NP_DTYPES[c]) for i, c in enumerate(_COLS)})

    def trimmed(self) -> dict:
        """``{column: tensor [count]}`` on the device (one host read: the count)."""
        n = int(self.count)
        return {c: getattr(self, c)[:n] for c in _COLS}


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

    def _col(self, v, shape, c) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v.to(_T_DTYPES[c]).expand(shape)
        return torch.full((1,) * len(shape), int(v), dtype=_T_DTYPES[c], device=self.device).expand(shape)

    def pack(self, exact: bool = False) -> TorchHops:
        dev = self.device
        if exact:
            out = {c: [] for c in _COLS}
            for mask, vals in self.groups:
                kept = _Kept(mask)
                for c, v in zip(_COLS, vals):
                    if isinstance(v, torch.Tensor):
                        out[c].append(kept.take(v).to(_T_DTYPES[c]))
                    else:
                        out[c].append(torch.full(kept.flat.shape, int(v), dtype=_T_DTYPES[c], device=dev))
            cols = {c: (torch.cat(v) if v else torch.zeros(0, dtype=_T_DTYPES[c], device=dev)) for c, v in out.items()}
            n = cols["src"].shape[0]
            return TorchHops(**cols, count=torch.tensor(n, dtype=torch.int64, device=dev))
        cap = sum(m.numel() for m, _ in self.groups)
        buf = torch.zeros(len(_COLS), cap + 1, dtype=torch.int32, device=dev)  # all columns, one scatter per group
        offset = torch.zeros((), dtype=torch.int64, device=dev)
        for mask, vals in self.groups:
            m = mask.reshape(-1)
            n = m.shape[0]
            within = torch.cumsum(m, 0, dtype=torch.int64)
            dest = torch.where(m, offset + within - 1, cap)
            if n:
                offset = offset + within[-1]
            cols = torch.stack([self._i32(v, mask.shape) for v in vals]).reshape(len(_COLS), n)  # [7, n]
            buf.scatter_(1, dest.expand(len(_COLS), n), cols)
        out = {c: (buf[i, :cap] if _T_DTYPES[c] == torch.int32 else buf[i, :cap].to(_T_DTYPES[c]))
               for i, c in enumerate(_COLS)}
        return TorchHops(**out, count=offset)

    def _i32(self, v, shape) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return (v if v.dtype == torch.int32 else v.to(torch.int32)).expand(shape)
        return torch.full((1,) * len(shape), int(v), dtype=torch.int32, device=self.device).expand(shape)


@dataclass(frozen=True)
class TorchFlowPlan(FlowPlanFields[TorchRouting, TorchHops]):
    """A FlowPlan with device hop tables: ``dispatch``/``combine`` ``TorchHops`` of ``routing``
    (fields: ``zepp.planner.types.FlowPlanFields``). ``to_numpy()`` gives the numpy planner's
    ``zepp.planner.types.FlowPlan`` (two host reads: the counts)."""

    def sizes(self) -> tuple[int, int, int]:
        """``(dispatch hops, combine hops, unplaced entries)`` in one device-to-host read."""
        u = self.routing.unplaced if self.routing.unplaced is not None else torch.zeros_like(self.dispatch.count)
        d, c, n = torch.stack([self.dispatch.count, self.combine.count, u.to(torch.int64)]).tolist()
        return d, c, n

    def to_numpy(self) -> FlowPlan:
        """The numpy ``zepp.planner.types.FlowPlan`` (one host read of the sizes, then the copies); raises
        ``IncompletePlan`` when the water-fill left entries unplaced."""
        d, c, unplaced = self.sizes()
        return FlowPlan(self.routing.to_numpy(unplaced), self.dispatch.to_numpy(d), self.combine.to_numpy(c),
                        self.gpus_per_node, self.row_bytes, self.dispatch_transport, self.combine_transport)
