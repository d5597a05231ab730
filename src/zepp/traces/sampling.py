"""Batches sampled from a trace window, and demand histograms per rank and per node.

A trace is ``topk_ids [N, k]`` (:class:`zepp.traces.trace.Trace`): one row per token, its ``k``
chosen expert ids (logical ids in ``[0, E)``). The files they come from are read by
:mod:`zepp.traces.formats`.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.trace import Trace

__all__ = ["sample_batches", "sample_rows", "node_demand", "rank_demand"]


# ---------------------------------------------------------------- sampling and demand


def sample_batches(trace: Trace, ranks: int, tokens_per_rank: int, iters: int, seed: int) -> np.ndarray:
    """``[iters, R, T, k]`` int32 batches: rows drawn uniformly with replacement from ``trace``.

    Seeded with ``np.random.default_rng(seed)``; the same arguments give the same batches.
    """
    for name, v in (("ranks", ranks), ("tokens_per_rank", tokens_per_rank), ("iters", iters)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ZeppInputError(f"sample_batches: {name} must be a positive integer, got {v!r}")
    if len(trace) == 0:
        raise ZeppInputError(f"{trace.source}: cannot sample batches from an empty trace")
    return trace.topk_ids[sample_rows(len(trace), ranks, tokens_per_rank, iters, seed)]


def sample_rows(n: int, ranks: int, tokens_per_rank: int, iters: int, seed: int) -> np.ndarray:
    """``[iters, R, T]`` row indices in ``[0, n)`` that ``sample_batches`` draws (same seed, same rows)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, size=(int(iters), int(ranks), int(tokens_per_rank)))


def rank_demand(topk_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Entries per (rank, expert): ``topk_ids [R, T, k]`` -> ``[R, E]`` int64."""
    ids = np.asarray(topk_ids)
    if ids.ndim != 3:
        raise ZeppInputError(f"rank_demand: topk_ids must be [ranks, tokens, k], got shape {ids.shape}")
    r = ids.shape[0]
    key = np.arange(r, dtype=np.int64)[:, None, None] * num_experts + ids
    return np.bincount(key.ravel(), minlength=r * num_experts).astype(np.int64).reshape(r, num_experts)


def _deal_shuffle(n: int, ranks: int) -> np.ndarray:
    rank_of_row = np.empty(n, dtype=np.int64)
    rank_of_row[np.random.default_rng(0).permutation(n)] = np.arange(n) % ranks
    return rank_of_row


def _deal_round_robin(n: int, ranks: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % ranks


def _deal_blocks(n: int, ranks: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) * ranks // max(1, n)


# how history rows are dealt to ranks: name -> (rows, ranks) -> rank of each row [rows]
DEALS = {"shuffle": _deal_shuffle, "round-robin": _deal_round_robin, "blocks": _deal_blocks}


def node_demand(trace: Trace, nodes: int, gpus_per_node: int, deal: str = "shuffle") -> np.ndarray:
    """Per-node demand histogram ``[N, E]`` int64 from a history window.

    Each row of the trace is held by one rank (``R = nodes * gpus_per_node``; node of rank
    ``r`` is ``r // gpus_per_node``); ``deal`` says which:

    - ``"shuffle"`` (default): row ``perm[i]`` goes to rank ``i mod R``, ``perm`` a fixed
      permutation (``default_rng(0)``). Every node sees a random, representative sample of
      the window, as every rank does in the evaluation batches (rows drawn uniformly), and
      the result does not depend on the order of the rows.
    - ``"round-robin"``: row ``i`` to rank ``i mod R``. On traces stored in prompt order this
      slices by position: with prompts of ``P`` rows, node ``n`` sees only certain decode
      steps of every prompt (on ``../shared/traces``, ``P = 32``). That slicing changes
      results: on the real Qwen3 traces at 16 nodes, 16 MB, zepp's inter-node bytes are about
      11% lower with round-robin than with a shuffled history (8.47 vs 9.48 GB).
    - ``"blocks"``: contiguous blocks of rows per rank (whole prompts per rank, as when a
      request stays on one data-parallel rank).
    """
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ZeppInputError(f"node_demand: {name} must be a positive integer, got {v!r}")
    if deal not in DEALS:
        raise ZeppInputError(f"node_demand: deal must be one of {', '.join(map(repr, DEALS))}, got {deal!r}")
    rank_of_row = DEALS[deal](len(trace), nodes * gpus_per_node)
    node_of_row = rank_of_row // gpus_per_node
    e = trace.num_experts
    key = node_of_row[:, None] * e + trace.topk_ids
    return np.bincount(key.ravel(), minlength=nodes * e).astype(np.int64).reshape(nodes, e)
