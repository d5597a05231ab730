"""Shared cases of the planner tests: small random placements and skewed batches, and the
hypothesis strategies that draw them (clusters of 1-4 nodes x 1-4 GPUs)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from zepp.planner.types import HOP_COLUMNS, FlowPlan, Placement

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_placement(rng, nodes, L, per_rank, extra):
    """Home layout plus ``extra`` random replicas per rank (any expert, duplicates allowed)."""
    R = nodes * L
    E = R * per_rank
    se = np.full((R, per_rank + extra), -1, np.int32)
    se[:, :per_rank] = np.arange(E).reshape(R, per_rank)
    if extra:
        se[:, per_rank:] = rng.integers(-1, E, size=(R, extra))
    return Placement(se, E, L)


def skewed_batch(rng, R, T, k, E, alpha):
    """``[R, T, k]`` int32: ``k`` distinct experts per token, drawn with weights ``rank ** -alpha``."""
    weights = np.arange(1, E + 1, dtype=float) ** -alpha
    weights = rng.permutation(weights / weights.sum())
    keys = rng.random((R * T, E)) ** (1.0 / weights)  # weighted sampling without replacement
    return np.argsort(-keys, axis=1)[:, :k].reshape(R, T, k).astype(np.int32)


# A routing case: a random placement of ``nodes x L`` GPUs and a batch of ``T`` tokens per GPU.
ROUTING_CASE = {
    "nodes": st.integers(1, 4),
    "L": st.integers(1, 4),
    "per_rank": st.integers(1, 3),
    "extra": st.integers(0, 3),
    "T": st.integers(0, 12),
    "k": st.integers(1, 4),
    "alpha": st.sampled_from([0.0, 1.0, 3.0]),
    "relaxation": st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    "seed": st.integers(0, 2**16),
}
routing_cases = st.fixed_dictionaries(ROUTING_CASE)


def routing_case(case: dict, rng=None) -> tuple[Placement, np.ndarray]:
    """The placement and batch ``[R, T, k]`` of a drawn ``routing_cases`` case (``rng``: the
    generator to draw with, default one seeded by the case)."""
    rng = np.random.default_rng(case["seed"]) if rng is None else rng
    pl = random_placement(rng, case["nodes"], case["L"], case["per_rank"], case["extra"])
    k = min(case["k"], pl.num_experts)
    return pl, skewed_batch(rng, pl.ranks, case["T"], k, pl.num_experts, case["alpha"])


def assert_same_flows(got: FlowPlan, want: FlowPlan) -> None:
    """Two FlowPlans equal element for element: the routing's slots and every column of both hop
    tables, values and dtypes."""
    np.testing.assert_array_equal(got.routing.slot, want.routing.slot)
    assert got.transport == want.transport
    for phase in ("dispatch", "combine"):
        for c in HOP_COLUMNS:
            g, w = getattr(getattr(got, phase), c), getattr(getattr(want, phase), c)
            np.testing.assert_array_equal(g, w, err_msg=f"{got.transport} {phase}.{c}")
            assert g.dtype == w.dtype


@st.composite
def histories(draw, max_nodes=4, max_gpus=4):
    """(hist [N, E], gpus_per_node, extra) with a skew drawn from several shapes."""
    n = draw(st.integers(1, max_nodes))
    L = draw(st.integers(1, max_gpus))
    per = draw(st.integers(1, 3))
    extra = draw(st.integers(0, 3))
    E = n * L * per
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["pareto", "uniform", "zero", "one-hot", "node-local"]))
    if kind == "pareto":
        hist = (rng.pareto(draw(st.sampled_from([0.5, 1.0, 2.0])), size=(n, E)) * 20).astype(np.int64)
    elif kind == "uniform":
        hist = rng.integers(0, 50, size=(n, E))
    elif kind == "zero":
        hist = np.zeros((n, E), dtype=np.int64)
    elif kind == "one-hot":
        hist = np.zeros((n, E), dtype=np.int64)
        hist[:, rng.integers(E)] = rng.integers(1, 1000, size=n)
    else:  # each node asks mostly for its own slice
        hist = rng.integers(0, 5, size=(n, E))
        for i in range(n):
            hist[i, i * (E // n):(i + 1) * (E // n)] += 100
    return hist, L, extra


def gpu_duplicates(p: Placement) -> int:
    """The most replicas of one expert on one GPU."""
    return max(int(np.bincount(row[row >= 0], minlength=p.num_experts).max(initial=0)) for row in p.slot_expert)


def batch_demand(batch: np.ndarray, E: int) -> np.ndarray:
    """``[R, E]`` entries per (source rank, expert) of a batch ``[R, T, k]`` (``-1``: none), as the
    expected demand a history would hold."""
    return np.stack([np.bincount(b[b >= 0], minlength=E) for b in batch.reshape(batch.shape[0], -1)]).astype(float)


def route_any(name: str, ids: np.ndarray, pl: Placement, relaxation: float):
    """``route(name, ids, pl, relaxation)`` for every routing name; the table routings
    (``needs_table``) get a table built from the batch's own demand."""
    from zepp.planner.routing import ROUTINGS, route

    if not ROUTINGS[name].needs_table:
        return route(name, ids, pl, relaxation)
    table = ROUTINGS[name].build_table(pl, batch_demand(ids, pl.num_experts), relaxation, pl.gpus_per_node)
    return route(name, ids, pl, relaxation, table=table)
