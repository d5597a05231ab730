"""The device planner's plan objects: routings and hop tables as tensors.

A hop table's length depends on the data, so on the device it lives in a *fixed-capacity*
buffer: every column ``[capacity]`` with the first ``count`` elements valid (``count`` is a 0-d
int64 tensor on the same device) and the rest zero. The capacity is known from the batch shape
alone (``R*T*k`` per hop group), so building a table never reads a value back to the host.
``to_numpy()`` turns it into the numpy planner's ``zepp.plan.Hops`` with exactly one host read
(the count) plus the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from zepp.plan import FlowPlan, Hops, Placement, Routing

_COLS = ("stage", "src", "dst", "owner", "token", "msg", "entry")
_NP_DTYPES = {"stage": np.int8, "src": np.int32, "dst": np.int32, "owner": np.int32, "token": np.int32,
              "msg": np.int32, "entry": np.int8}
_T_DTYPES = {"stage": torch.int8, "src": torch.int32, "dst": torch.int32, "owner": torch.int32,
             "token": torch.int32, "msg": torch.int32, "entry": torch.int8}


@dataclass(frozen=True)
class TorchRouting:
    """``slot [R, T, k]`` int32 tensor (global slot per entry, ``-1`` for a missing entry) of
    ``topk_ids [R, T, k]`` on ``placement``; ``unplaced``: 0-d int64 tensor, entries the
    water-fill could not place (always 0 for a consistent placement; ``None`` for routings
    without a water-fill). Same meaning as ``zepp.plan.Routing``."""

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

    def to_numpy(self) -> Routing:
        """The numpy ``Routing`` (one device-to-host copy of ``topk_ids`` and ``slot``)."""
        if self.unplaced is not None and int(self.unplaced) != 0:
            raise AssertionError(f"water-fill left {int(self.unplaced)} entries unplaced")
        return Routing(self.topk_ids.cpu().numpy().astype(np.int32), self.slot.cpu().numpy().astype(np.int32),
                       self.placement, relaxation=self.relaxation)


@dataclass(frozen=True)
class TorchHops:
    """One phase's hop table in a fixed-capacity buffer (see module docstring).

    Columns ``[capacity]``: ``stage`` int8, ``src``/``dst``/``owner``/``token``/``msg`` int32,
    ``entry`` int8, meaning exactly what ``zepp.plan.Hops`` says; ``count``: 0-d int64 tensor.
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

    def to_numpy(self) -> Hops:
        """``zepp.plan.Hops`` of the first ``count`` rows (one host read: the count)."""
        n = int(self.count)
        return Hops(**{c: getattr(self, c)[:n].cpu().numpy().astype(_NP_DTYPES[c], copy=False) for c in _COLS})

    def trimmed(self) -> dict:
        """``{column: tensor [count]}`` on the device (one host read: the count)."""
        n = int(self.count)
        return {c: getattr(self, c)[:n] for c in _COLS}


class HopParts:
    """Collects hop groups as masked candidate lists and packs them into one ``TorchHops``.

    ``add(mask [n], stage, src, dst, owner, token, msg=0, entry=-1)``: the candidates of one
    group in table order (all ``[n]`` tensors or Python ints); the kept ones are those where
    ``mask`` is True. ``pack()`` concatenates the groups in the order added and compacts the
    kept rows to the front (prefix sum + scatter; no host read).
    """

    def __init__(self, device):
        self.device = device
        self.masks: list[torch.Tensor] = []
        self.cols: dict[str, list[torch.Tensor]] = {c: [] for c in _COLS}

    def add(self, mask, stage, src, dst, owner, token, msg=0, entry=-1) -> None:
        shape = mask.shape
        mask = mask.reshape(-1)
        n = mask.shape[0]
        self.masks.append(mask)
        for c, v in zip(_COLS, (stage, src, dst, owner, token, msg, entry)):
            if isinstance(v, torch.Tensor):
                v = v.expand(shape).reshape(-1)
            else:
                v = torch.full((n,), int(v), dtype=torch.int64, device=self.device)
            self.cols[c].append(v)

    def pack(self) -> TorchHops:
        if not self.masks:
            z = {c: torch.zeros(0, dtype=_T_DTYPES[c], device=self.device) for c in _COLS}
            return TorchHops(**z, count=torch.zeros((), dtype=torch.int64, device=self.device))
        mask = torch.cat(self.masks)
        cap = mask.shape[0]
        m64 = mask.to(torch.int64)
        dest = torch.where(mask, torch.cumsum(m64, 0) - 1, cap)
        out = {}
        for c in _COLS:
            buf = torch.zeros(cap + 1, dtype=_T_DTYPES[c], device=self.device)
            buf.scatter_(0, dest, torch.cat(self.cols[c]).to(_T_DTYPES[c]))
            out[c] = buf[:cap]
        return TorchHops(**out, count=m64.sum())


@dataclass(frozen=True)
class TorchFlowPlan:
    """A FlowPlan with device hop tables: ``dispatch``/``combine`` ``TorchHops`` of ``routing``.
    ``to_numpy()`` gives the numpy planner's ``zepp.plan.FlowPlan`` (two host reads: the counts)."""

    routing: TorchRouting
    dispatch: TorchHops
    combine: TorchHops
    gpus_per_node: int
    row_bytes: int
    dispatch_transport: str
    combine_transport: str

    @property
    def transport(self) -> str:
        return f"{self.dispatch_transport}/{self.combine_transport}"

    def to_numpy(self) -> FlowPlan:
        return FlowPlan(self.routing.to_numpy(), self.dispatch.to_numpy(), self.combine.to_numpy(),
                        self.gpus_per_node, self.row_bytes, self.dispatch_transport, self.combine_transport)
