"""MoonEP's per-batch balance (PAPER.md section 7): a replicated integer planner that gives
every GPU exactly ``T * k`` rows using ``E/R`` prefetch slots per GPU.

The routing choice ``moonep`` of ``zepp.registry``; the simulator's ``moonep-pulls`` plug-in adds
the weight pulls it implies. Loops run over ranks and experts, never over entries.
"""

from __future__ import annotations

import numpy as np

from zepp.planner.intsort import stable_argsort
from zepp.planner.types import Placement, Routing


def moonep_plan(topk_ids: np.ndarray, num_experts: int, gpus_per_node: int) -> tuple[Routing, np.ndarray]:
    """MoonEP's per-batch balance: ``topk_ids [R, T, k]`` -> (Routing over home + ``E/R``
    prefetch slots per rank, ``pulls [M, 2]`` (home rank, puller rank) weight transfers).

    Every rank ends with exactly ``T*k`` rows when the prefetch slots suffice: excess entries
    of an overloaded home rank move, its hottest expert first, to the ranks with the largest
    deficit; each (expert, puller) pair takes one prefetch slot on the puller.
    """
    R, T, k = topk_ids.shape
    E = num_experts
    epr = E // R
    target = T * k
    demand = np.bincount(topk_ids.ravel(), minlength=E).astype(np.int64)
    home = np.arange(E) // epr
    load = np.bincount(home, weights=demand, minlength=R).astype(np.int64)
    slot_expert = np.full((R, 2 * epr), -1, np.int32)
    slot_expert[:, :epr] = np.arange(E).reshape(R, epr)
    used = np.zeros(R, np.int64)
    quota: dict[int, list] = {}  # expert -> [(rank, local slot, rows)]
    keep_home = demand.copy()
    deficit = target - load
    pulls = []
    for r in np.argsort(-load, kind="stable").tolist():
        excess = int(load[r] - target)
        if excess <= 0:
            break
        exps = r * epr + np.argsort(-demand[r * epr:(r + 1) * epr], kind="stable")
        for e in exps.tolist():
            while excess > 0 and keep_home[e] > 0:
                cand = np.flatnonzero((deficit > 0) & (used < epr) & (np.arange(R) != r))
                if cand.size == 0:
                    break
                d = int(cand[np.argmax(deficit[cand])])
                amount = int(min(excess, keep_home[e], deficit[d]))
                slot_expert[d, epr + used[d]] = e
                quota.setdefault(e, []).append((d, epr + int(used[d]), amount))
                used[d] += 1
                deficit[d] -= amount
                keep_home[e] -= amount
                excess -= amount
                pulls.append((r, d))
            if excess <= 0:
                break
    placement = Placement(slot_expert, E, gpus_per_node)
    S = 2 * epr
    flat = topk_ids.ravel().astype(np.int64)
    slot = (home[flat] * S + flat % epr).astype(np.int64)
    # entries of each expert in batch order: the first keep_home stay home, the rest fill quotas
    order = stable_argsort(flat)  # entries grouped by expert, each group in batch order
    starts = np.concatenate(([0], np.cumsum(demand)[:-1]))
    for e, parts in quota.items():
        bounds = keep_home[e] + np.cumsum([p[2] for p in parts])
        mine = order[starts[e]:starts[e] + demand[e]]
        p = np.arange(mine.size)  # each entry's position among its expert's entries
        moved = p >= keep_home[e]
        which = np.searchsorted(bounds, p[moved], side="right")
        tgt = np.array([p_[0] * S + p_[1] for p_ in parts], np.int64)
        slot[mine[moved]] = tgt[which]
    routing = Routing(topk_ids, slot.reshape(R, T, k).astype(np.int32), placement)
    return routing, np.asarray(pulls, np.int64).reshape(-1, 2)
