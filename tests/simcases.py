"""Small skewed simulator cases shared by the simulator tests (imported as ``simcases``)."""

from __future__ import annotations

import numpy as np

from zepp.sim.calibrate import calibrated
from zepp.model import model_preset
from zepp.sim.run import Config


def skewed_batch(rng, iters, ranks, tokens, experts, k) -> np.ndarray:
    """``[iters, ranks, tokens, k]`` int32 top-k expert ids: Gumbel noise over one Gumbel skew of
    the experts (scale 1.5), shared by every token of the call."""
    logits = rng.gumbel(size=experts) * 1.5
    g = logits[None, None, None, :] + rng.gumbel(size=(iters, ranks, tokens, experts))
    return np.argsort(-g, axis=-1)[..., :k].astype(np.int32)


def skewed_config(seed: int, nodes: int, iters: int, tokens: int, model: str = "qwen", warmup: int = 1,
                  hist_k: int | None = 8, **spec_kw) -> Config:
    """A ``Config`` on ``nodes`` a100 nodes (network calibrated on a2av): ``iters`` skewed batches
    of ``tokens`` tokens per rank and a history of 200 skewed tokens per node (top-``hist_k``;
    ``None``: the model's top-k). ``spec_kw`` overrides fields of the model preset."""
    rng = np.random.default_rng(seed)
    cl, net = calibrated("a100", nodes)
    spec = model_preset(model).with_(**spec_kw) if spec_kw else model_preset(model)
    batches = skewed_batch(rng, iters, cl.ranks, tokens, spec.num_experts, spec.top_k)
    k = spec.top_k if hist_k is None else hist_k
    hist = np.stack([np.bincount(skewed_batch(rng, 1, 4, 200, spec.num_experts, k).ravel(), minlength=spec.num_experts)
                     for _ in range(cl.nodes)])
    return Config(cl, spec, net, hist, batches, warmup=warmup)
