"""The statistics a trace is judged on: what drives the benchmark's results.

Skew of batches per expert and per GPU, distinct home nodes per token, the rows merging saves,
the popularity drift between two windows and how concentrated co-selected pairs are; all under
home placement (expert ``e`` on node ``e // (E / N)``). ``trace_statistics`` gathers them for one
``(pool, eval)`` pair (``benchmarks/fit/fit_synth.py`` compares recorded and synthetic traces).
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.trace import Trace

__all__ = ["home_nodes", "distinct_nodes", "merge_saving", "batch_skew", "gpu_skew", "popularity_tv",
           "pair_concentration", "trace_statistics"]


def home_nodes(ids: np.ndarray, num_experts: int, nodes: int) -> np.ndarray:
    """Node of each id under home placement (expert ``e`` on node ``e // (E / N)``)."""
    if num_experts % nodes:
        raise ZeppInputError(f"{num_experts} experts do not split evenly over {nodes} nodes")
    return ids // (num_experts // nodes)


def distinct_nodes(ids: np.ndarray, num_experts: int, nodes: int) -> float:
    """Mean number of distinct home nodes per token (``ids [..., k]``)."""
    s = np.sort(home_nodes(ids, num_experts, nodes), axis=-1)
    return float((1 + (s[..., 1:] != s[..., :-1]).sum(-1)).mean())


def merge_saving(batch: np.ndarray, num_experts: int, nodes: int, gpus_per_node: int = 4) -> float:
    """Fraction of inter-node rows merging removes, under home placement.

    ``batch [R, T, k]``, token of rank ``r`` on node ``r // L``. Without merging every entry
    whose expert lives on another node is one row on the wire; with merging, one row per
    (token, remote node). Returns ``1 - merged / per_entry``.
    """
    r = batch.shape[0]
    own = (np.arange(r) // gpus_per_node)[:, None, None]
    g = home_nodes(batch, num_experts, nodes)
    remote = g != own
    s = np.sort(np.where(remote, g, -1), axis=-1)
    merged = ((s[..., 1:] != s[..., :-1]) & (s[..., 1:] >= 0)).sum() + (s[..., 0] >= 0).sum()
    return float(1 - merged / max(1, remote.sum()))


def batch_skew(batches: np.ndarray, num_experts: int) -> float:
    """Mean over iterations of max / mean entries per expert: ``batches [iters, R, T, k]``."""
    flat = batches.reshape(batches.shape[0], -1)
    loads = np.stack([np.bincount(b, minlength=num_experts) for b in flat])
    return float((loads.max(axis=1) / (flat.shape[1] / num_experts)).mean())


def gpu_skew(batches: np.ndarray, num_experts: int) -> float:
    """Mean over iterations of max / mean rows per GPU under home placement (expert ``e`` on
    rank ``e // (E / R)``): ``batches [iters, R, T, k]``."""
    r = batches.shape[1]
    if num_experts % r:
        raise ZeppInputError(f"{num_experts} experts do not split evenly over {r} GPUs")
    flat = (batches // (num_experts // r)).reshape(batches.shape[0], -1)
    loads = np.stack([np.bincount(b, minlength=r) for b in flat])
    return float((loads.max(axis=1) / (flat.shape[1] / r)).mean())


def popularity_tv(a: Trace, b: Trace) -> float:
    """Total-variation distance between the expert popularity (entry shares) of two traces."""
    pa = a.expert_load() / a.topk_ids.size
    pb = b.expert_load() / b.topk_ids.size
    return float(0.5 * np.abs(pa - pb).sum())


def pair_concentration(ids: np.ndarray, num_experts: int, top: float = 0.01) -> float:
    """Share of co-selected pairs that fall on the ``top`` fraction of most frequent expert pairs."""
    k = ids.shape[1]
    i, j = np.triu_indices(k, 1)
    a = np.minimum(ids[:, i], ids[:, j]).astype(np.int64)
    b = np.maximum(ids[:, i], ids[:, j]).astype(np.int64)
    counts = np.sort(np.bincount((a * num_experts + b).ravel(), minlength=num_experts**2))[::-1]
    n_pairs = num_experts * (num_experts - 1) // 2
    return float(counts[: max(1, int(top * n_pairs))].sum() / counts.sum())


def trace_statistics(pool: Trace, eval_: Trace, tokens_per_gpu: int, node_counts=(4, 8, 16),
                     gpus_per_node: int = 4, iters: int = 4, seed: int = 0) -> dict:
    """The statistics that drive the benchmark's results, for one ``(pool, eval)`` pair.

    Batches are sampled from ``eval`` as the benchmark does (``tokens_per_gpu`` per rank).
    Keys: ``skew@{N}`` (max/mean expert load per batch at ``N * L`` ranks), ``gpu_skew@{N}``
    (:func:`gpu_skew`, home placement), ``nodes@{N}``
    (distinct home nodes per eval token), ``merge@{N}`` (:func:`merge_saving`), ``drift_tv``
    (:func:`popularity_tv` of pool vs eval), ``pairs_top1pct`` (:func:`pair_concentration`).
    """
    from zepp.traces.sampling import sample_batches

    e = eval_.num_experts
    out: dict[str, float] = {}
    for n in node_counts:
        b = sample_batches(eval_, n * gpus_per_node, tokens_per_gpu, iters, seed)
        out[f"skew@{n}"] = batch_skew(b, e)
        out[f"gpu_skew@{n}"] = gpu_skew(b, e)
        out[f"nodes@{n}"] = distinct_nodes(eval_.topk_ids, e, n)
        out[f"merge@{n}"] = float(np.mean([merge_saving(x, e, n, gpus_per_node) for x in b]))
    out["drift_tv"] = popularity_tv(pool, eval_)
    out["pairs_top1pct"] = pair_concentration(eval_.topk_ids, e)
    return out
