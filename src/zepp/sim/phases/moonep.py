"""MoonEP's phase (``moonep-pulls``): every prefetched expert's weights (w1 + w2) are pulled from
its home rank on the puller's copy stream before any of the puller's GEMMs (cross-node pulls
share the home NIC)."""

from __future__ import annotations

import numpy as np

from zepp.planner.types import FlowPlan
from zepp.sim.phases.inputs import BatchInputs


def use_pulls(ctx: BatchInputs) -> None:
    """``moonep-pulls``: the pulls as weight copies that every GEMM of the puller waits for; their
    cross-node bytes go to the floor."""
    pulls = moonep_pulls(ctx.plan)
    L = ctx.cluster.gpus_per_node
    R = ctx.cluster.ranks
    ctx.weight_copies = pulls
    ctx.copies_block_gemm = "all"
    cross = (pulls[:, 0] // L) != (pulls[:, 1] // L)
    wb = float(ctx.spec.expert_weight_bytes)
    ctx.add_nic(np.bincount(pulls[cross, 0], minlength=R) * wb, np.bincount(pulls[cross, 1], minlength=R) * wb)


def moonep_pulls(plan: FlowPlan) -> np.ndarray:
    """``[M, 2]`` (home rank, puller rank) of every prefetch slot a ``moonep`` routing filled
    (MoonEP's placement: ``E/R`` home slots, then ``E/R`` prefetch slots per rank)."""
    p = plan.routing.placement
    R = p.ranks
    epr = p.num_experts // R
    pre = p.slot_expert[:, epr:]
    r, s = np.nonzero(pre >= 0)
    return np.stack([pre[r, s] // epr, r], axis=1).astype(np.int64).reshape(-1, 2)
