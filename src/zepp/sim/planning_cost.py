"""The planning-cost model: modelled seconds of each system's planner per iteration, one model per
name of ``zepp.registry`` (``System.planning``) in ``MODELS``. No wall-clock reaches a simulated
result.

``planning_seconds`` returns ``(prologue, planning)`` seconds per rank: ``prologue`` is what runs
before the dispatch (the all-gather of what the planner needs, then the planning itself),
``planning`` the planning part alone (reported).

The baselines' planners, from PAPER.md section 7 (measured on the A100 testbed):

- ``none``: nothing beyond the all-gather of the ``[W, E]`` loads (``a2av``).
- ``fast-host``: the host recomputes FAST's schedule every iteration, 0.9 ms.
- ``comet-routing``: COMET's routing kernel, 0.075 ms.
- ``eplb-torch``: EPLB's torch planner with device syncs: 3.0 ms + 4.1 ns per global entry
  (3.1 ms at K2, 4 nodes, 1 MB; 12.8 ms at 16 nodes, 64 MB).
- ``epic``: 2.2 ms + 34 ns per entry of the rank (2.5 ms at K2 16 MB).
- ``moonep``: all-gather of the top-k ids (not the loads), then 1.4 ms + 91 ns per entry of the
  rank (2.2 ms at K2 16 MB).
- ``zepp+lp`` (Zepp's flows over the LPLB routing): ``lplb``'s solve plus Zepp's flow-planning
  rounds (below) without its water-fill; it all-gathers the loads, which give the LP its counts.
- ``lplb``: SGLang's ``lp`` dispatch (DeepSeek's LPLB): the all-reduce of the per-expert counts
  on the simulated network, then the published solver time and one launch for the per-entry
  draw (``zepp/data/lp_solver.json``, which gives the sources).

Zepp's planner (``zepp``, ``zepp+swap``, ``zepp+granularity``: plus the per-batch choice of
``zepp.planner.overlap.granularity``, its rounds recorded by ``benchmarks/fit/granularity_cost.py``): counted
operations times recorded per-operation costs.
Each part of the planner (the routing, the flows of each transport pair, the swap planning)
costs a recorded number of *rounds* of a fixed op mix (sorts, histograms, gathers, prefix sums,
binary searches, masks over the batch's entries; ``benchmarks/fit/planner_cost.py`` counted them),
and one round takes the mix's GPU time at the batch's entry count (measured on an H200; both in
``zepp/data/planner_cost.json``, which says where and when). The GPU time is valid over the
whole size range: below the smallest measured size the mix costs its launch-bound floor (the
kernels and one host synchronisation, the same on any GPU); between measured sizes it is
interpolated linearly in the entry count; above the largest it grows along the last measured
slope (bytes-bound). The part above the floor is scaled by the HBM bandwidth ratio of the
cluster's GPU to the H200's. Where the torch planner's own device time of a part is recorded
(``zepp/data/planner_torch_times.json``, ``device_records``, or the records a caller puts in force
with ``zepp.sim.planner_times.charged_records``), that measurement replaces the part's op-mix
conversion. The package's file holds none: by default Zepp's planner is the op-mix model; the
torch planner as measured on an H200 is charged on request (``zepp.sim.planner_times``).
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources

from zepp.errors import ZeppInputError

@functools.lru_cache(maxsize=1)
def cost_data() -> dict:
    """The recorded planner cost figures (``zepp/data/planner_cost.json``)."""
    return json.loads((resources.files("zepp") / "data" / "planner_cost.json").read_text())


def gpu_opmix_seconds(entries: int, hbm_bw: float) -> float:
    """GPU time of one round of the op mix at ``entries`` on a GPU with ``hbm_bw`` bytes/s."""
    from zepp.sim.planner_times import measured_seconds

    d = cost_data()
    table = {int(k): float(v) for k, v in d["gpu_opmix"].items()}
    sizes = sorted(table)
    return measured_seconds(sizes, [table[k] for k in sizes], entries, float(d["gpu_opmix_source"]["hbm_bw"]), hbm_bw)


def zepp_parts(dispatch: str, combine: str, swaps: bool, granularity: bool = False, route: bool = True) -> list[str]:
    """The planner parts of a Zepp row (names of ``planner_cost.json``); ``route`` False: without
    Zepp's water-fill (a row whose routing is charged by another model)."""
    return ((["route:zepp"] if route else []) + [f"flows:{dispatch}/{combine}"] + (["swap"] if swaps else [])
            + (["granularity"] if granularity else []))


def zepp_planning(dispatch: str, combine: str, swaps: bool, entries: int, hbm_bw: float,
                  granularity: bool = False, route: bool = True) -> float:
    """Seconds of Zepp's planner for a batch of ``entries``: per part the measured device time
    of the torch planner where one is recorded (``zepp.sim.planner_times``), else its op-mix rounds
    times the op mix's GPU time."""
    from zepp.sim.planner_times import device_part_seconds

    r = cost_data()["rounds"]
    total = 0.0
    for part in zepp_parts(dispatch, combine, swaps, granularity, route):
        measured = device_part_seconds(part, entries, hbm_bw)
        if measured is not None:
            total += measured
            continue
        if part not in r:
            raise ZeppInputError(f"no recorded planning cost for {part}; rerun benchmarks/fit/planner_cost.py")
        total += r[part] * gpu_opmix_seconds(entries, hbm_bw)
    return total


# ----------------------------------------------------------------------------- the models
# Each: ``(system, cluster, rank_entries) -> planning seconds`` of one rank's batch of
# ``rank_entries`` entries (PAPER.md section 7's measured planners; Zepp's counted rounds).


def _none(system, cluster, rank_entries: int) -> float:
    return 0.0


def _fast_host(system, cluster, rank_entries: int) -> float:
    return 0.9e-3


def _comet_routing(system, cluster, rank_entries: int) -> float:
    return 0.075e-3


# A torch planner on the paper's testbeds: EPLB's, measured there, costs 4.1 ns per global entry
# above its 3 ms of device syncs (PAPER.md section 7).
TESTBED_PLANNER_NS = 4.1e-9


def _eplb_torch(system, cluster, rank_entries: int) -> float:
    return 3.0e-3 + TESTBED_PLANNER_NS * cluster.ranks * rank_entries


def _epic(system, cluster, rank_entries: int) -> float:
    return 2.2e-3 + 3.4e-8 * rank_entries


def _moonep(system, cluster, rank_entries: int) -> float:
    return 1.4e-3 + 9.1e-8 * rank_entries


def _zepp(system, cluster, rank_entries: int, swaps: bool = False, granularity: bool = False) -> float:
    entries = cluster.ranks * rank_entries
    modelled = zepp_planning(system.dispatch, system.combine, swaps, entries, cluster.hbm_bw, granularity=granularity)
    return modelled + testbed_per_entry(cluster, entries)


def testbed_per_entry(cluster, entries: int) -> float:
    """On the paper's testbeds (the ``a100`` / ``h100`` presets, whose network is fitted), the
    per-entry cost a torch planner was measured to take there (``TESTBED_PLANNER_NS``, EPLB's),
    beyond what the op-mix model counts for Zepp's planner (its rounds at an H200's speed): the
    paper's planner ran in torch on those GPUs. 0 on today's presets (our planner, H200-measured)."""
    from zepp.sim.calibrate import FITTED

    return TESTBED_PLANNER_NS * entries if cluster.name in FITTED else 0.0


# ``zepp-table``: a batch routes by lookup in the routing table built once per placement
# (zepp.planner.routing.table_routing): per entry of the rank's own batch an integer hash, a
# compare against the entry's m cumulative shares and a gather of the pick, no host read. Counted:
# TABLE_LOOKUP_KERNELS kernels (the hash, compare and gather fuse into one elementwise kernel over
# the rank's entries; it runs on the device before the dispatch kernel) at the cluster's kernel
# launch cost, plus the bytes it moves at HBM rate (ids in, m shares and m choices read, slot out).
# Nothing is gathered first: the table is local and the low-latency kernels exchange their counts
# themselves (their own flag waits, zepp.sim.mechanics kernel_calls).
TABLE_LOOKUP_KERNELS = 1
TABLE_LOOKUP_BYTES_PER_ENTRY = 4 + 4 + 2 * 4 * 4  # id, slot, 4 shares and 4 choices (int32; m <= 4 read)


def _zepp_table(system, cluster, rank_entries: int) -> float:
    return TABLE_LOOKUP_KERNELS * cluster.kernel_launch + rank_entries * TABLE_LOOKUP_BYTES_PER_ENTRY / cluster.hbm_bw


@functools.lru_cache(maxsize=1)
def lp_solver_data() -> dict:
    """The LPLB solver record (``zepp/data/lp_solver.json``)."""
    return json.loads((resources.files("zepp") / "data" / "lp_solver.json").read_text())


def _lplb(system, cluster, rank_entries: int) -> float:
    return float(lp_solver_data()["solver_s"]) + cluster.kernel_launch


def _zepp_lp(system, cluster, rank_entries: int) -> float:
    """Zepp's flows over the LPLB routing: the LP solve (``lplb``), then Zepp's flow planning
    (merge, NIC split) without its water-fill."""
    return _lplb(system, cluster, rank_entries) + zepp_planning(
        system.dispatch, system.combine, False, cluster.ranks * rank_entries, cluster.hbm_bw, route=False)


MODELS = {"none": _none, "zepp-table": _zepp_table, "fast-host": _fast_host, "comet-routing": _comet_routing,
          "eplb-torch": _eplb_torch, "epic": _epic, "moonep": _moonep, "zepp": _zepp,
          "zepp+swap": functools.partial(_zepp, swaps=True), "zepp+granularity": functools.partial(_zepp, granularity=True),
          "lplb": _lplb, "zepp+lp": _zepp_lp}


def _gather_loads(cluster, spec, rank_entries: int, net) -> float:
    """The all-gather of the ``[W, E]`` fp32 loads."""
    return net.allgather(cluster.ranks, spec.num_experts * 4.0, cluster.nic_bw)


def _gather_topk_ids(cluster, spec, rank_entries: int, net) -> float:
    """The all-gather of every rank's top-k ids (MoonEP)."""
    return net.allgather(cluster.ranks, rank_entries * 4.0, cluster.nic_bw)


def _allreduce_counts(cluster, spec, rank_entries: int, net) -> float:
    """The all-reduce of the ``[E]`` fp32 per-expert counts (SGLang's LPLB solver): recursive
    doubling, ``ceil(log2 W)`` rounds of one put (a flag wait inside one node) plus the counts."""
    W, nbytes = cluster.ranks, spec.num_experts * 4.0
    if W <= 1:
        return 0.0
    if cluster.nodes > 1:
        step = net.put(W) + nbytes / (cluster.nic_bw * net.nic_eff)
    else:
        step = net.signal + nbytes / (cluster.nvlink_bw * net.nvlink_eff)
    return math.ceil(math.log2(W)) * step


# what each model gathers before it plans (default: the loads)


GATHERS = {"moonep": _gather_topk_ids, "lplb": _allreduce_counts,
           "zepp-table": lambda cluster, spec, rank_entries, net: 0.0}


def planning_seconds(model: str, system, cluster, spec, tokens_per_rank: int, net) -> tuple[float, float]:
    """``(prologue, planning)`` seconds of planning model ``model`` for ``system`` (a registry
    row) on ``cluster`` with ``tokens_per_rank`` tokens of ``spec`` per rank; ``net``: the
    calibrated network (its all-gather)."""
    if model not in MODELS:
        raise ZeppInputError(f"unknown planning model {model!r}; choose one of {', '.join(MODELS)}")
    rank_entries = tokens_per_rank * spec.top_k
    planning = MODELS[model](system, cluster, rank_entries)
    return GATHERS.get(model, _gather_loads)(cluster, spec, rank_entries, net) + planning, planning
