"""What a ``zepp run`` case runs on: the traces its batches come from, each iteration's
activations and gate weights (seeded, so every rank and the reference can rebuild any rank's),
the dtypes and the cost figures of an overlap chosen per batch (``granularity="auto"``)."""

from __future__ import annotations

import numpy as np
import torch

from zepp.errors import ZeppInputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cost_figures(cfg: dict):
    """``zepp.planner.overlap.granularity.Figures`` of ``cfg["cost_cluster"]`` (a dict of ``zepp.cluster.Cluster``
    fields plus an optional ``overlap``, ``Figures.overlap``; the same in every rank's config), or
    ``None`` (the Dispatcher's default)."""
    if not cfg.get("cost_cluster"):
        return None
    from zepp.cluster import Cluster
    from zepp.planner.overlap.granularity import Figures

    fields = dict(cfg["cost_cluster"])
    overlap = float(fields.pop("overlap", 1.0))
    return Figures.of(Cluster(**fields), overlap=overlap)


def load_traces(cfg: dict, spec):
    """``(history, eval)`` Traces: files when given, else the built-in synthetic traces of the
    model, else (models without them, or overridden expert count / top-k) a seeded Zipf trace."""
    from zepp.traces import read_trace

    if cfg.get("trace"):
        ev = read_trace(cfg["trace"], num_experts=spec.num_experts, top_k=spec.top_k)
        hist = read_trace(cfg["history"], num_experts=spec.num_experts, top_k=spec.top_k) if cfg.get("history") else ev
        return hist, ev
    if cfg.get("history"):
        raise ZeppInputError("--history needs --trace too (the evaluation batches are drawn from --trace)")
    from zepp.model import model_preset

    base = model_preset(cfg["model"])
    if (base.num_experts, base.top_k) == (spec.num_experts, spec.top_k):  # else they would not fit: skip them
        try:
            from zepp.traces.synthetic import synthetic_traces

            pool, ev = synthetic_traces(cfg["model"], seed=cfg["seed"])
            if pool.num_experts == spec.num_experts and pool.top_k == spec.top_k:
                return pool, ev
        except ZeppInputError:
            pass
    return _zipf_traces(spec, cfg["seed"])


def _zipf_traces(spec, seed: int):
    """Two seeded Zipf(0.8) traces of 8192 tokens (``pool``, ``eval``) over a shuffled popularity."""
    from zepp.traces import Trace

    rng = np.random.default_rng([seed, 7])
    pop = 1.0 / np.arange(1, spec.num_experts + 1) ** 0.8
    pop = pop[rng.permutation(spec.num_experts)]
    out = []
    for window in ("pool", "eval"):
        g = np.log(pop)[None, :] + rng.gumbel(size=(8192, spec.num_experts))
        out.append(Trace(np.argsort(-g, axis=1)[:, : spec.top_k].astype(np.int32), spec.num_experts,
                         f"zipf(0.8, seed={seed})/{window}"))
    return out[0], out[1]


def gate_weights(seed: int, it: int, rank: int, T: int, k: int) -> torch.Tensor:
    """``[T, k]`` gate weights of rank ``rank`` at iteration ``it`` (softmax of seeded normals)."""
    g = torch.Generator().manual_seed(seed * 7919 + it * 104729 + rank)
    return torch.softmax(torch.randn(T, k, generator=g), dim=1)


def activations(seed: int, it: int, rank: int, T: int, H: int) -> torch.Tensor:
    """``[T, H]`` activations of rank ``rank`` at iteration ``it`` (seeded normals)."""
    g = torch.Generator().manual_seed(seed * 15485863 + it * 32452843 + rank + 1)
    return torch.randn(T, H, generator=g)
