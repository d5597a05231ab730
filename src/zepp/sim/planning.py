"""Planning cost per iteration: deterministic models, one per name of ``zepp.registry``
(``System.planning``). No wall-clock reaches a simulated result.

Every model returns ``(prologue, planning)`` seconds per rank: ``prologue`` is what runs before
the dispatch (the all-gather of what the planner needs, then the planning itself), ``planning``
the planning part alone (reported).

The baselines' planners, from PAPER.md section 7 (measured on the A100 testbed):

- ``none``: nothing beyond the all-gather of the ``[W, E]`` loads (``a2av``).
- ``fast-host``: the host recomputes FAST's schedule every iteration, 0.9 ms.
- ``comet-routing``: COMET's routing kernel, 0.075 ms.
- ``eplb-torch``: EPLB's torch planner with device syncs: 3.0 ms + 4.1 ns per global entry
  (3.1 ms at K2, 4 nodes, 1 MB; 12.8 ms at 16 nodes, 64 MB).
- ``epic``: 2.2 ms + 34 ns per entry of the rank (2.5 ms at K2 16 MB).
- ``moonep``: all-gather of the top-k ids (not the loads), then 1.4 ms + 91 ns per entry of the
  rank (2.2 ms at K2 16 MB).

Zepp's planner (``zepp``, ``zepp+swap``, ``zepp+granularity``: plus the per-batch choice of
``zepp.planner.granularity``, its rounds recorded by ``benchmarks/granularity_cost.py``): counted
operations times recorded per-operation costs.
Each part of the planner (the routing, the flows of each transport pair, the swap planning)
costs a recorded number of *rounds* of a fixed op mix (sorts, histograms, gathers, prefix sums,
binary searches, masks over the batch's entries; ``benchmarks/planner_cost.py`` counted them),
and one round takes the mix's GPU time at the batch's entry count (measured on an H200; both in
``zepp/data/planner_cost.json``, which says where and when). The GPU time is valid over the
whole size range: below the smallest measured size the mix costs its launch-bound floor (the
kernels and one host synchronisation, the same on any GPU); between measured sizes it is
interpolated linearly in the entry count; above the largest it grows along the last measured
slope (bytes-bound). The part above the floor is scaled by the HBM bandwidth ratio of the
cluster's GPU to the H200's. Where the torch planner's own device time of a part is recorded
(``zepp/data/planner_torch_times.json``, ``device_records``; none yet: no GPU was lent when it
was written), that measurement replaces the part's op-mix conversion (``zepp.planner.torch.costs``).
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from zepp.errors import ZeppInputError

MODELS = ("none", "fast-host", "comet-routing", "eplb-torch", "epic", "moonep", "zepp", "zepp+swap",
          "zepp+granularity")


@functools.lru_cache(maxsize=1)
def cost_data() -> dict:
    """The recorded planner cost figures (``zepp/data/planner_cost.json``)."""
    return json.loads((resources.files("zepp") / "data" / "planner_cost.json").read_text())


def gpu_opmix_seconds(entries: int, hbm_bw: float) -> float:
    """GPU time of one round of the op mix at ``entries`` on a GPU with ``hbm_bw`` bytes/s."""
    from zepp.planner.torch.costs import measured_seconds

    d = cost_data()
    table = {int(k): float(v) for k, v in d["gpu_opmix"].items()}
    sizes = sorted(table)
    return measured_seconds(sizes, [table[k] for k in sizes], entries, float(d["gpu_opmix_source"]["hbm_bw"]), hbm_bw)


def zepp_parts(dispatch: str, combine: str, swaps: bool, granularity: bool = False) -> list[str]:
    """The planner parts of a Zepp row (names of ``planner_cost.json``)."""
    return (["route:zepp", f"flows:{dispatch}/{combine}"] + (["swap"] if swaps else [])
            + (["granularity"] if granularity else []))


def zepp_planning(dispatch: str, combine: str, swaps: bool, entries: int, hbm_bw: float,
                  granularity: bool = False) -> float:
    """Seconds of Zepp's planner for a batch of ``entries``: per part the measured device time
    of the torch planner where one is recorded (``zepp.planner.torch.costs``), else its op-mix rounds
    times the op mix's GPU time."""
    from zepp.planner.torch.costs import device_part_seconds

    r = cost_data()["rounds"]
    total = 0.0
    for part in zepp_parts(dispatch, combine, swaps, granularity):
        measured = device_part_seconds(part, entries, hbm_bw)
        if measured is not None:
            total += measured
            continue
        if part not in r:
            raise ZeppInputError(f"no recorded planning cost for {part}; rerun benchmarks/planner_cost.py")
        total += r[part] * gpu_opmix_seconds(entries, hbm_bw)
    return total


def zepp_rounds(dispatch: str, combine: str, swaps: bool) -> float:
    """Op-mix rounds of Zepp's planner: routing, the flows of ``dispatch/combine``, swaps."""
    r = cost_data()["rounds"]
    key = f"flows:{dispatch}/{combine}"
    if key not in r:
        raise ZeppInputError(f"no recorded planning cost for flows {dispatch}/{combine}; rerun benchmarks/planner_cost.py")
    return r["route:zepp"] + r[key] + (r["swap"] if swaps else 0.0)


def planning_seconds(model: str, system, cluster, spec, tokens_per_rank: int, net) -> tuple[float, float]:
    """``(prologue, planning)`` seconds of planning model ``model`` for ``system`` (a registry
    row) on ``cluster`` with ``tokens_per_rank`` tokens of ``spec`` per rank; ``net``: the
    calibrated network (its all-gather)."""
    if model not in MODELS:
        raise ZeppInputError(f"unknown planning model {model!r}; choose one of {', '.join(MODELS)}")
    R, k, E = cluster.ranks, spec.top_k, spec.num_experts
    rank_entries = tokens_per_rank * k
    loads = net.allgather(R, E * 4.0, cluster.nic_bw)
    if model == "none":
        planning = 0.0
    elif model == "fast-host":
        planning = 0.9e-3
    elif model == "comet-routing":
        planning = 0.075e-3
    elif model == "eplb-torch":
        planning = 3.0e-3 + 4.1e-9 * R * rank_entries
    elif model == "epic":
        planning = 2.2e-3 + 3.4e-8 * rank_entries
    elif model == "moonep":
        planning = 1.4e-3 + 9.1e-8 * rank_entries
        return net.allgather(R, rank_entries * 4.0, cluster.nic_bw) + planning, planning
    else:
        planning = zepp_planning(system.dispatch, system.combine, model == "zepp+swap", R * rank_entries,
                                 cluster.hbm_bw, granularity=model == "zepp+granularity")
    return loads + planning, planning
