"""Cluster shapes and the hardware figures a cost model needs.

A cluster is ``nodes`` nodes of ``gpus_per_node`` GPUs. Ranks are numbered node-major:
rank ``r`` lives on node ``r // gpus_per_node`` at local index ``r % gpus_per_node``.
Every GPU has its own NIC; NVLink connects every pair of GPUs inside a node.

The presets take their figures from PAPER.md sections 3, 5 and 7. The GEMM efficiency curve
defaults (``gemm_eff_max`` 0.5, ``gemm_rows_half`` 64) are the simulator's hardware choice from
PAPER.md section 5 (``zepp.calibrate.HARDWARE``); a measured H200 curve is in
``benchmarks/results/gpu_gemm_h200.md``. The network costs the paper-testbed simulation fits
(per-put cost growing with the rank count, achieved NIC efficiency) live in
``zepp.calibrate.FITTED``, not here: ``nvlink_msg_cost`` and ``nic_msg_cost`` are the flat
per-message costs used where no such fit applies (the emulated cluster's model, which measures
them with ``zepp.emulate.linkcal``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class Cluster:
    """A GPU cluster shape plus link, compute and fixed-cost figures.

    Rates are in bytes per second, times in seconds.
    """

    name: str
    nodes: int
    gpus_per_node: int = 4
    nvlink_bw: float = 72e9  # achieved bytes/s per direction per GPU pair
    nic_bw: float = 25e9  # bytes/s per direction per NIC (one NIC per GPU)
    nvlink_msg_cost: float = 10e-6  # fixed seconds per NVLink message
    nic_msg_cost: float = 20e-6  # fixed seconds per NIC message
    peak_flops: float = 312e12  # dense BF16 FLOP/s per GPU
    hbm_bw: float = 1.555e12  # bytes/s per GPU
    gemm_eff_max: float = 0.5  # asymptotic fraction of peak a grouped GEMM reaches
    gemm_rows_half: float = 64.0  # rows per expert at which efficiency is half its max
    kernel_launch: float = 10e-6  # fixed seconds per kernel (GEMM, reduce)
    weight_copy_bw: float | None = None  # bytes/s for NVLink weight copies (None: nvlink_bw)

    def __post_init__(self) -> None:
        if int(self.nodes) != self.nodes or self.nodes < 1:
            raise ZeppInputError(f"cluster {self.name!r}: nodes must be a positive integer, got {self.nodes!r}")
        if int(self.gpus_per_node) != self.gpus_per_node or self.gpus_per_node < 1:
            raise ZeppInputError(
                f"cluster {self.name!r}: gpus_per_node must be a positive integer, got {self.gpus_per_node!r}"
            )
        for field in ("nvlink_bw", "nic_bw", "peak_flops", "hbm_bw", "gemm_eff_max"):
            if not getattr(self, field) > 0:
                raise ZeppInputError(f"cluster {self.name!r}: {field} must be positive, got {getattr(self, field)!r}")

    @property
    def ranks(self) -> int:
        """Total GPU count ``R = nodes * gpus_per_node``."""
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: np.ndarray | int) -> np.ndarray | int:
        """Node index of each rank (same shape as ``rank``)."""
        return rank // self.gpus_per_node

    def local_of(self, rank: np.ndarray | int) -> np.ndarray | int:
        """Local GPU index inside its node of each rank (same shape as ``rank``)."""
        return rank % self.gpus_per_node

    def gemm_efficiency(self, rows_per_expert: np.ndarray | float) -> np.ndarray | float:
        """Fraction of peak FLOP/s a grouped GEMM reaches at this many rows per expert."""
        rows = np.asarray(rows_per_expert, dtype=np.float64)
        return self.gemm_eff_max * rows / (rows + self.gemm_rows_half)

    def with_(self, **changes) -> "Cluster":
        """A copy with some fields replaced (``cluster.with_(nodes=8)``)."""
        return dataclasses.replace(self, **changes)


_PRESETS: dict[str, dict] = {
    # 4x A100-SXM4-40GB per node, NVLink3 (NCCL send/recv ~72 GB/s per pair),
    # one Slingshot-11 NIC per GPU at 25 GB/s per direction.
    "a100": dict(nvlink_bw=72e9, nic_bw=25e9, peak_flops=312e12, hbm_bw=1.555e12),
    # 4x H100-96GB (GH200) per node, NVLink4; the same Slingshot-11 NICs.
    # 370 GB/s per GPU in NCCL on NVSwitch boards; on a 4-GPU board a GPU talks to 3 peers.
    "h100": dict(nvlink_bw=370e9 / 3, nic_bw=25e9, peak_flops=989e12, hbm_bw=4.0e12),
}

PRESET_NAMES = tuple(_PRESETS)


def cluster_preset(name: str, nodes: int, gpus_per_node: int = 4, **overrides) -> Cluster:
    """The named hardware preset (``a100`` or ``h100``) at ``nodes`` nodes."""
    if name not in _PRESETS:
        raise ZeppInputError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    fields = dict(_PRESETS[name])
    fields.update(overrides)
    return Cluster(name=name, nodes=nodes, gpus_per_node=gpus_per_node, **fields)
