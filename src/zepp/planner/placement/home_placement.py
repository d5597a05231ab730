"""``home``: expert ``e`` on rank ``e // (E/R)``, no replicas."""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.planner.placement.base_placement import check_divisible
from zepp.planner.types import Placement


def place_home(num_experts: int, ranks: int, gpus_per_node: int) -> Placement:
    """Static contiguous homing: expert ``e`` on rank ``e // (E/R)``, ``S = E/R``, no replicas."""
    per = check_divisible(num_experts, ranks)
    if gpus_per_node < 1 or ranks % gpus_per_node:
        raise ZeppInputError(f"ranks={ranks} is not a multiple of gpus_per_node={gpus_per_node}")
    return Placement(np.arange(num_experts, dtype=np.int32).reshape(ranks, per), num_experts, gpus_per_node)


def build_home(hist, num_experts: int, ranks: int, gpus_per_node: int, extra: int) -> Placement:
    """``make_placement``'s entry: ``hist`` (checked there when given) and ``extra`` are unused."""
    return place_home(num_experts, ranks, gpus_per_node)
