"""A plan's volumes in torch: the twin of ``zepp.planner.volumes.Volumes`` as a fixed-shape grid.

``TorchVolumes`` holds one phase's rows per ``(stage, src, dst, msg, owner node)`` as a dense
``[3, R, R, msgs, N]`` int64 tensor (``msgs``: 1, or the GPUs per node where messages are keyed
by the owner's local GPU), filled by scatter-adds of fixed-shape parts (no host read).
``to_numpy()`` lists its non-zero cells, in key order: the numpy planner's ``Volumes``.
"""

from __future__ import annotations

import numpy as np
import torch

from zepp.planner.torch._ops import I64
from zepp.planner.torch.types import IncompletePlan
from zepp.planner.volumes import Volumes

STAGES = 3  # every transport's phases have at most three stages


class TorchVolumes:
    """One phase's rows per cell, ``rows [3, R, R, msgs, N]`` int64 on a device; ``overflow``: 0-d
    bool, True where the short fixed-capacity list the cells were counted from was too short
    (``None`` where none was used); ``to_numpy`` then raises ``IncompletePlan``."""

    def __init__(self, rows: torch.Tensor, overflow: torch.Tensor | None = None):
        self.rows = rows
        self.overflow = overflow

    @staticmethod
    def zeros(ranks: int, nodes: int, msgs: int, device) -> "TorchVolumes":
        return TorchVolumes(torch.zeros(STAGES, ranks, ranks, msgs, nodes, dtype=I64, device=device))

    def add(self, stage, src, dst, msg, owner_node, rows) -> None:
        """Add ``rows`` to the cells ``(stage, src, dst, msg, owner_node)`` (tensors or ints,
        broadcast together; a negative count corrects another part's)."""
        _, R, _, M, N = self.rows.shape
        dev = self.rows.device
        # ints become device fills (a tensor made from host data is a host-to-device copy, which a
        # CUDA graph cannot capture)
        parts = [v.to(I64) if isinstance(v, torch.Tensor) else torch.full((), v, dtype=I64, device=dev)
                 for v in (stage, src, dst, msg, owner_node, rows)]
        parts = torch.broadcast_tensors(*parts)
        stage, src, dst, msg, owner_node, rows = (p.reshape(-1) for p in parts)
        key = (((stage * R + src.clamp(0, R - 1)) * R + dst.clamp(0, R - 1)) * M + msg) * N + owner_node
        self.rows.view(-1).scatter_add_(0, key, rows)

    def to_numpy(self) -> Volumes:
        """The numpy ``Volumes`` of the non-zero cells (one copy to the host)."""
        if self.overflow is not None and bool(self.overflow):
            raise IncompletePlan("the flows' short list of handed rows overflowed; re-plan")
        flat = self.rows.reshape(-1).cpu().numpy()
        _, R, _, M, N = self.rows.shape
        key = np.flatnonzero(flat)
        if (flat[key] < 0).any():
            raise AssertionError("a flow cell ended with a negative row count")
        owner_node, rest = key % N, key // N
        msg, rest = rest % M, rest // M
        return Volumes(stage=(rest // (R * R)).astype(np.int8), src=((rest // R) % R).astype(np.int32),
                       dst=(rest % R).astype(np.int32), msg=msg.astype(np.int32),
                       owner_node=owner_node.astype(np.int32), rows=flat[key].astype(np.int64))
