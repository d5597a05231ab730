"""``epic``: a model of EPIC's greedy placement (PAPER.md section 7): redundancy, GPU packing,
then NIC-balancing node positions."""

from __future__ import annotations

import numpy as np

from zepp.planner.placement.base_placement import check_hist, lcm_scale, summed_load
from zepp.planner.placement.eplb_placement import capped_counts, pack_distinct
from zepp.planner.types import Placement


def place_epic(hist, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """A model of the ``epic`` baseline's greedy placement (PAPER.md section 7).

    Its exact rules are unpublished; what is modelled, in its three greedy steps:

    1. Redundancy: replica counts as EPLB's replication rule on the summed history (float32),
       capped at one replica per GPU (as ``eplb-distinct``).
    2. GPUs: replicas packed onto ``ranks`` GPU bins by load per replica, never two of one
       expert in a bin (``pack_distinct``), which balances compute.
    3. Node positions: bins in descending total load (ties: lower bin id) each go to the node,
       with a free GPU position, whose NIC inbound load grows least, i.e. minimising
       ``nic[n] + sum_{e in bin} (l_e - hist[n, e]) / c_e`` (a replica's remote demand is the
       load every other node sends it; ties: lower node id). Bins fill a node's GPUs in the
       order they are assigned. Exact integers: ``/ c_e`` scaled by ``lcm(1..c_max)``.

    A node may hold several replicas of one expert (on different GPUs); epic does not forbid it.
    """
    h = check_hist(hist, gpus_per_node, ranks=ranks)
    load, S, e_num = summed_load(h, ranks, gpus_per_node, extra)
    L = int(gpus_per_node)
    # 1. Redundancy and 2. GPU bins.
    load32 = load.astype(np.float32)
    count = capped_counts(load32, ranks * S, ranks)
    bins = pack_distinct(load32, count, ranks, S)
    # 3. Node positions.
    bin_total, remote = _bin_loads(bins, h, load, count)
    n_nodes = ranks // L
    nic = [0] * n_nodes
    used = [0] * n_nodes
    out = np.full((ranks, S), -1, dtype=np.int32)
    for b in sorted(range(ranks), key=lambda b: (-bin_total[b], b)):
        n = min((n for n in range(n_nodes) if used[n] < L), key=lambda n: (nic[n] + remote[b][n], n))
        out[n * L + used[n]] = bins[b]
        used[n] += 1
        nic[n] += remote[b][n]
    return Placement(out, e_num, L)


def build_epic(hist: np.ndarray, num_experts: int, ranks: int, gpus_per_node: int, extra: int) -> Placement:
    """``make_placement``'s entry (``hist`` checked there)."""
    return place_epic(hist, ranks, gpus_per_node, extra)


def _bin_loads(bins: np.ndarray, h: np.ndarray, load: np.ndarray, count: np.ndarray):
    """Per bin of ``bins [B, S]``: its total load and, per node ``n`` of ``h [N, E]``, the inbound
    NIC rows it would draw there (``sum (l_e - h[n, e]) / c_e``), both scaled by ``lcm(1..c_max)``
    (Python ints): ``(total [B], remote [B][N])``."""
    m = lcm_scale(int(count.max()))
    unit = [m // int(c) for c in count]  # replica weight = demand * unit[e]
    load_py = [int(x) for x in load]
    hist_py = h.tolist()
    bin_total, remote = [], []
    for row in bins:
        es = [int(e) for e in row if e >= 0]
        bin_total.append(sum(load_py[e] * unit[e] for e in es))
        remote.append([sum((load_py[e] - hist_py[n][e]) * unit[e] for e in es) for n in range(h.shape[0])])
    return bin_total, remote
