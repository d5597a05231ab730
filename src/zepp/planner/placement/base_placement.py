"""Checks and exact arithmetic shared by every placement.

A placement is built from a per-node demand histogram ``hist [N, E]`` (entries node ``n`` asked
of expert ``e`` in a past window) over ``R = N * L`` ranks, node-major (node = rank // L).
"""

from __future__ import annotations

import math

import numpy as np

from zepp.errors import ZeppInputError


def check_divisible(num_experts: int, ranks: int) -> int:
    """Experts per rank ``E / R``; raises when ``R`` does not divide ``E``."""
    if ranks <= 0:
        raise ZeppInputError(f"ranks must be >= 1, got {ranks}")
    if num_experts <= 0:
        raise ZeppInputError(f"num_experts must be >= 1, got {num_experts}")
    if num_experts % ranks:
        raise ZeppInputError(
            f"{num_experts} experts cannot be spread evenly over {ranks} GPUs ({num_experts} % {ranks} = "
            f"{num_experts % ranks}); choose a GPU count (nodes x gpus_per_node) that divides {num_experts}, "
            f"or override the expert count (--experts)"
        )
    return num_experts // ranks


def check_hist(hist, gpus_per_node: int, ranks: int | None = None, num_experts: int | None = None) -> np.ndarray:
    """Validate a history histogram; returns it as ``int64 [N, E]``."""
    if not isinstance(gpus_per_node, (int, np.integer)) or gpus_per_node < 1:
        raise ZeppInputError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    h = np.asarray(hist)
    _check_hist_values(h)
    if ranks is not None and h.shape[0] * gpus_per_node != ranks:
        raise ZeppInputError(
            f"hist has {h.shape[0]} node rows but ranks={ranks} with gpus_per_node={gpus_per_node} means "
            f"{ranks / gpus_per_node:g} nodes; give one history row per node"
        )
    if num_experts is not None and h.shape[1] != num_experts:
        raise ZeppInputError(
            f"hist has {h.shape[1]} expert columns but num_experts={num_experts}; the histogram must have "
            f"one column per expert"
        )
    return h.astype(np.int64)


def _check_hist_values(h: np.ndarray) -> None:
    """``h`` is a 2-D array of whole, non-negative entry counts."""
    if h.ndim != 2:
        raise ZeppInputError(
            f"hist must be a 2-D [nodes, experts] demand histogram, got shape {h.shape}; "
            f"build it with zepp.traces.sampling.node_demand"
        )
    if h.shape[0] < 1 or h.shape[1] < 1:
        raise ZeppInputError(f"hist must have at least one node row and one expert column, got shape {h.shape}")
    if h.dtype == bool or not (np.issubdtype(h.dtype, np.integer) or np.issubdtype(h.dtype, np.floating)):
        raise ZeppInputError(f"hist must hold integer entry counts, got dtype {h.dtype}")
    if np.issubdtype(h.dtype, np.floating):
        if not np.all(np.isfinite(h)) or np.any(h != np.round(h)):
            raise ZeppInputError("hist must hold whole entry counts; found a fractional or non-finite value")
    if h.min() < 0:
        n, e = np.argwhere(h < 0)[0]
        raise ZeppInputError(f"hist[{n}, {e}] = {h[n, e]} is negative; entry counts must be >= 0")


def check_extra(extra: int) -> int:
    """Redundant slots per GPU: an integer ``>= 0``."""
    if not isinstance(extra, (int, np.integer)) or isinstance(extra, bool) or extra < 0:
        raise ZeppInputError(f"extra (redundant slots per GPU) must be an integer >= 0, got {extra!r}")
    return int(extra)


def check_layout(num_experts: int, ranks: int, gpus_per_node: int) -> None:
    """``ranks`` a positive integer, ``gpus_per_node`` a divisor of it, ``E`` a multiple of it."""
    if not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ZeppInputError(f"ranks must be a positive integer, got {ranks!r}")
    if not isinstance(gpus_per_node, (int, np.integer)) or gpus_per_node < 1 or ranks % gpus_per_node:
        raise ZeppInputError(f"gpus_per_node={gpus_per_node!r} must be a positive divisor of ranks={ranks}")
    check_divisible(num_experts, ranks)


def summed_load(hist, ranks: int, gpus_per_node: int, extra: int) -> tuple[np.ndarray, int, int]:
    """Checked summed load ``[E]`` int64 of ``hist [N, E]``, slots per rank ``S = E/R + extra`` and ``E``."""
    h = check_hist(hist, gpus_per_node, ranks=ranks)
    extra = check_extra(extra)
    e_num = h.shape[1]
    per = check_divisible(e_num, ranks)
    return h.sum(axis=0), per + extra, e_num


def lcm_scale(cap: int) -> int:
    """``M = lcm(1..cap)``: ``l * (M // c)`` orders loads per replica ``l / c`` exactly for ``c <= cap``."""
    return math.lcm(*range(1, max(cap, 1) + 1))
