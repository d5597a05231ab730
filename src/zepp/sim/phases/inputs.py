"""What the baselines' special phases see and change of one batch (``BatchInputs``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zepp.planner.types import FlowPlan


@dataclass
class BatchInputs:
    """One batch's simulation inputs, as the phases (``zepp.sim.phases.PHASES``) see and change them.

    ``cfg``: the ``zepp.sim.run.Config``; ``plan``: its FlowPlan; ``custom_dispatch`` /
    ``custom_combine``: phase replacements (see ``zepp.sim.layer.build_layer``);
    ``weight_copies [M, 2]`` (src rank, dst rank) expert-weight transfers; ``copies_block_gemm``;
    ``extra_nic``: ``(send [R], recv [R])`` bytes outside the hop tables (for the floor).
    """

    cfg: object
    plan: FlowPlan
    custom_dispatch: object = None
    custom_combine: object = None
    weight_copies: np.ndarray | None = None
    copies_block_gemm: str = "swapped"
    extra_nic: tuple | None = None
    tokens_per_rank: int = field(init=False)

    def __post_init__(self):
        self.tokens_per_rank = int(self.plan.routing.topk_ids.shape[1])

    @property
    def cluster(self):
        return self.cfg.cluster

    @property
    def spec(self):
        return self.cfg.spec

    def add_nic(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Add ``send [R]`` / ``recv [R]`` NIC bytes outside the hop tables."""
        a = self.extra_nic
        self.extra_nic = (send, recv) if a is None else (a[0] + send, a[1] + recv)
