"""Fitting the synthetic-trace generator (``zepp.traces.synthetic``) to a recorded ``(pool, eval)`` pair.

Used by ``benchmarks/fit/fit_synth.py``, which rewrites the shipped ``zepp/data/synth_<model>.json``.

EM for a mixture of multinomials over both windows' rows (shared ``L``, per-window ``pi``);
then, on a fixed Monte Carlo sample (common random numbers, so the fit is deterministic),
iterative scaling of the tilts ``delta[w]`` until each window's per-expert entry frequency (its
*popularity*) equals the real window's, and of ``J[d]`` until the number of co-selected pairs at
each id distance ``d`` equals the real one. Popularity and the pair rate by id distance are
therefore matched by construction; everything else (distinct nodes per token, merge savings,
per-batch skew, concentration of pairs: ``zepp.traces.trace_stats``) is a consequence the tests
check.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.synthetic import NEG_LOGIT, SynthParams, draw_picks
from zepp.traces.trace import Trace

__all__ = ["fit_synth"]


def _em(ids: list[np.ndarray], num_experts: int, types: int, iters: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Mixture of multinomials over rows of several windows; shared type distributions.

    ``ids[w] [N_w, k]`` -> ``(log_p [C, E], pi [W, C])``.
    """
    e = num_experts
    all_ids = np.concatenate(ids)
    win = np.concatenate([np.full(len(a), w) for w, a in enumerate(ids)])
    n = len(all_ids)
    resp = rng.dirichlet(np.ones(types), size=n)  # random soft start
    flat = all_ids.ravel()
    for _ in range(iters):
        # M-step (loop over types: C is small)
        counts = np.stack([np.bincount(flat, weights=np.repeat(resp[:, z], all_ids.shape[1]), minlength=e)
                           for z in range(types)])
        p = (counts + 1e-3) / (counts + 1e-3).sum(axis=1, keepdims=True)
        pi = np.stack([resp[win == w].mean(axis=0) for w in range(len(ids))])
        # E-step
        log_p = np.log(p)
        ll = log_p[:, all_ids].sum(axis=2).T + np.log(pi[win] + 1e-300)  # [n, C]
        ll -= ll.max(axis=1, keepdims=True)
        resp = np.exp(ll)
        resp /= resp.sum(axis=1, keepdims=True)
    return np.log(p), pi


def _pair_distance_counts(ids: np.ndarray, dmax: int) -> np.ndarray:
    """Co-selected pairs per id distance ``d = 0..dmax`` (``[dmax + 1]``; pairs farther are dropped)."""
    k = ids.shape[1]
    i, j = np.triu_indices(k, 1)
    dist = np.abs(ids[:, i].astype(np.int64) - ids[:, j]).ravel()
    return np.bincount(dist[dist <= dmax], minlength=dmax + 1).astype(np.float64)


def fit_synth(pool: Trace, eval_: Trace, types: int = 8, kernel_range: int | None = None, em_iters: int = 60,
              scale_iters: int = 25, mc_factor: int = 3, seed: int = 0, model: str | None = None) -> SynthParams:
    """Fit the generator to a real ``(pool, eval)`` pair (see the module docstring and ``zepp.traces.synthetic``'s).

    ``types``: latent token types ``C``. ``kernel_range``: largest id distance ``D`` of the
    co-selection kernel (default ``E // 4``, the home block of 4 nodes). ``mc_factor``: the
    Monte Carlo sample is ``mc_factor`` times a window's rows. Deterministic for a ``seed``.
    """
    if pool.num_experts != eval_.num_experts or pool.top_k != eval_.top_k:
        raise ZeppInputError("fit_synth: pool and eval traces must have the same num_experts and top_k")
    e, k = pool.num_experts, pool.top_k
    dmax = max(1, min(e - 1, e // 4 if kernel_range is None else int(kernel_range)))
    rng = np.random.default_rng(seed)
    log_p, pi = _em([pool.topk_ids, eval_.topk_ids], e, types, em_iters, rng)

    windows = (pool, eval_)
    targets = [t.expert_load() / t.topk_ids.size for t in windows]  # popularity per window
    pair_target = sum(_pair_distance_counts(t.topk_ids, dmax) / len(t) for t in windows)
    base = []
    for w, t in enumerate(windows):  # fixed Monte Carlo sample per window
        m = mc_factor * len(t)
        z = np.repeat(np.arange(types), np.round(pi[w] * m).astype(int))  # stratified types
        g = np.random.default_rng([seed, w]).gumbel(size=(len(z), e)).astype(np.float32)
        base.append(g + log_p[z].astype(np.float32))
    tilt = np.stack([np.where(tg == 0, NEG_LOGIT, 0.0) for tg in targets])
    kernel = np.zeros(dmax + 1)
    # Damped (half-step) updates: a full step overshoots, as both fits move each other.
    for _ in range(scale_iters):
        pair_sim = np.zeros(dmax + 1)
        for w in range(2):
            top = draw_picks(base[w] + tilt[w].astype(np.float32), k, kernel)
            sim = np.bincount(top.ravel(), minlength=e) / top.size
            ok = targets[w] > 0
            tilt[w, ok] += 0.5 * np.log(targets[w][ok] / np.maximum(sim[ok], 0.25 / top.size))
            tilt[w, ok] -= tilt[w, ok].mean()
            pair_sim += _pair_distance_counts(top, dmax) / len(top)
        kernel[1:] += 0.5 * np.log(np.maximum(pair_target[1:], 1e-9) / np.maximum(pair_sim[1:], 1e-9))
    return SynthParams(model or "?", e, k, log_p, pi, tilt, kernel, (len(pool), len(eval_)), seed)
