"""Which expert-parallel path a batch takes: the global plan or the table exchange.

``PATHS`` (one name, one meaning):

- ``planned``: every rank all-gathers every rank's ids and gate weights, plans the whole batch
  (routing, flows, its program) and runs the plan's stages (``zepp.runtime.dispatcher``);
- ``table``: every rank routes its own entries by the layer's routing table
  (``zepp.planner.routing.table_routing.rank_slots``), and one fixed-capacity all-to-all sends
  each of its ``T_r`` token rows to every rank with the per-row metadata (the receiver knows
  ``T_r`` from the step's counts: no id or count exchange), one more brings the partials back
  (``zepp.runtime.table_exchange``).

``choose_path`` is the planner's cost model for the choice, from data every rank holds (the
step's token counts ``counts [R]`` and the layer shape), so every rank picks the same path.
Costs per layer, slowest rank:

- ``table``: 2 calls, and the fixed-capacity rows: ``2 * Tmax * (R - L) * row`` bytes over the
  rank's NIC and ``2 * Tmax * (L - 1) * row`` over NVLink (every row goes to every rank);
- ``planned``: 1 + ``stages`` calls, the host work of planning the whole batch
  (``plan_s_per_entry`` per entry of all ranks), and the planned rows, estimated as one NIC
  crossing per (token, remote node) the token has an entry on and one NVLink row per (token,
  local rank) it has an entry on (the relay's rule, what Zepp's flows do at most), both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PATHS = {"planned": "all-gather the ids, plan the whole batch, run its stages",
         "table": "route own entries by table, fixed-capacity exchange, no global plan"}


@dataclass(frozen=True)
class PathFigures:
    """``call_s``: seconds per collective call beyond its bytes; ``nic_bw`` / ``nvlink_bw``: bytes
    per second per rank; ``plan_s_per_entry``: host seconds of the global plan per entry."""

    call_s: float
    nic_bw: float
    nvlink_bw: float
    plan_s_per_entry: float


def touched(ranks_per_group: int, slots_per_group: int, experts: int, top_k: int) -> float:
    """Probability that a token's ``top_k`` distinct experts include one of a group's
    ``slots_per_group`` experts (uniform choice; a group of ``ranks_per_group`` ranks)."""
    e = min(slots_per_group, experts)
    miss = np.prod([(experts - e - i) / (experts - i) for i in range(top_k)]) if experts - e >= top_k else 0.0
    return float(1.0 - miss)


def path_costs(counts, ranks: int, gpus_per_node: int, experts: int, top_k: int, row_bytes: int, stages: int,
               fig: PathFigures) -> dict:
    """``{path: seconds}`` per layer for a step with ``counts [R]`` tokens per rank."""
    c = np.asarray(counts, np.int64)
    R, L = ranks, gpus_per_node
    N = R // L
    tmax, total = int(c.max()) if c.size else 0, int(c.sum())
    table = 2 * fig.call_s + 2 * tmax * row_bytes * ((R - L) / fig.nic_bw + (L - 1) / fig.nvlink_bw)
    per_node = experts / N
    p_node = touched(L, int(round(per_node)), experts, top_k)
    p_rank = touched(1, int(round(experts / R)), experts, top_k)
    nic_rows = tmax * (N - 1) * p_node
    nvl_rows = tmax * (L - 1) * p_rank * N  # fan-out inside each node of what arrived there
    planned = ((1 + stages) * fig.call_s + fig.plan_s_per_entry * total * top_k
               + 2 * row_bytes * (nic_rows / fig.nic_bw + nvl_rows / fig.nvlink_bw))
    return {"planned": float(planned), "table": float(table)}


def choose_path(counts, ranks: int, gpus_per_node: int, experts: int, top_k: int, row_bytes: int, stages: int,
                fig: PathFigures) -> str:
    """The cheaper path of ``path_costs`` (ties: ``planned``); the same on every rank."""
    cost = path_costs(counts, ranks, gpus_per_node, experts, top_k, row_bytes, stages, fig)
    return "table" if cost["table"] < cost["planned"] else "planned"


def default_figures() -> PathFigures:
    """The emulated cluster's figures at 500 Mbit/s NICs (``benchmarks/results/emulate_bench_quiet.md``:
    linkcal NIC 62 MB/s, veth about 1.8 GB/s; a collective call costs about 10 ms beyond its
    bytes with 4-8 ranks on 2 cores, the notes' estimate, and an empty all-to-all 1.3-8 ms: 5 ms
    here; the global plan about 2 us of host time per entry, from the measured plan times)."""
    return PathFigures(call_s=5e-3, nic_bw=62e6, nvlink_bw=1.8e9, plan_s_per_entry=2e-6)
