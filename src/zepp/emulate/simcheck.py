"""The simulator against the emulated cluster: calibrate, simulate this executor, compare.

Three parts:

1. ``worker_plans(cfg)``: the FlowPlans ``zepp.runtime.worker`` executes for a config (same
   traces, placement, batches, routing), recomputed outside the ranks.
2. Calibration of the emulated cluster: links with ``zepp.emulate.linkcal`` (gloo send/recv
   between rank processes); the fixed cost of one empty ``all_to_all_single`` over all ranks
   (``zepp.emulate.a2a_jobs.a2a_time``, 4 bytes per peer: scheduling and wake-up latency of R
   processes on this machine's cores, charged once per collective beyond the per-message
   costs); expert compute with ``compute_worker`` run in *every* rank at once
   (so the CPU contention of R processes on this machine's cores is in the figure), timing the
   runtime's own ``grouped_up``/``grouped_down`` on ``rows`` rows spread over ``groups`` slots,
   fitted by least squares to ``t = c_group * groups + c_row * rows``.
3. ``layer_graph`` / ``simulate_system``: the simulator's one layer builder,
   ``zepp.sim.layer.build_layer`` (the one every system's simulation uses), fed the FlowPlan
   through ``LayerWork.of`` and the executor's record from ``zepp.emulate.glooexec``:

   - per rank: metadata all-gather + planning as the prologue (a fixed task: the worker's own
     measured median ``plan`` time of that system in the same run: planning is CPU time the
     model does not try to predict), then per stage one ``all_to_all_single``
     (``Mechanics.stage_collectives``, ``zepp.sim.collectives``). gloo's ``alltoallv`` walks
     the peers in a ring (step ``i``: send to ``rank+i``, receive from ``rank-i``), and on these
     links it behaves as one peer at a time: the 2x2 all-to-all of 1 MB per peer in
     ``benchmarks/results/emulate_links.md`` takes 31 ms at 1000 Mbit/s, what three sequential
     steps of 1 MB NIC messages cost (25 ms + fixed costs), not the 17 ms of concurrent sends.
     So each rank's messages of a call (every peer, empty ones too) go one after another in
     ring order, each waiting for its receiver to post the call, sharing the NIC and veth links
     max-min fairly with other ranks' messages and paying the link's measured per-message
     cost; a rank leaves the call when its sends and receives are done and posts the next one.
   - expert compute: ``build_layer``'s GEMM tasks timed by the fitted
     ``c_group * groups + c_row * rows`` (``glooexec.AdditiveGemm``) instead of a GPU roofline;
   - CPU cost of moving bytes and of Python: before each posted call a rank spends
     ``Net.call_cpu`` = ``stage_overhead`` (free parameter 1) plus the measured empty-collective
     cost beyond its messages' costs, and ``Net.cpu_per_byte`` = ``cpu_per_byte`` (free
     parameter 2: TCP through veth is kernel copying on the same 2 cores that compute, and the
     gather/scatter of rows costs CPU too) times the ranks that share a core,
     ``max(1, R / cores)``, per byte it sends and receives in the call. Both are fitted on the
     ``a2av`` measurements only (``fit_free_parameters``) and then used unchanged for every
     other system.
   - ``overlap`` systems (``zepp-overlap``): GEMM 1 in arrival-stage groups (own rows while
     stage 0 is on the wire, each stage's received rows while the next stage is on the wire);
     combine stage 0 as one asynchronous call per wave (destination node in ring order, own
     node last), each wave's call posted after its second GEMM.

   What it leaves out: CPU contention between communication (TCP copies through the kernel
   cost CPU on this 2-core machine) and compute, beyond the two parameters; ranks drifting
   out of step between stages when a loaded scheduler runs them late; TCP window dynamics;
   the gloo IO thread. Measured consequence (``benchmarks/results/emulate_bench_1712.md``, a
   quiet machine): the 2-call systems (a2av, eplb, zepp-a2av) are predicted to within ~10%,
   and the systems with 4-9 calls (relay, zepp-sync, zepp-direct, zepp-overlap) 24-46% too
   fast (median), because a cost per call shows only there and an a2av-only fit cannot see
   it; on a heavily loaded machine (``emulate_bench.md``) the a2av fit does see a per-call
   cost (23 ms) and every system's median error is 4-17%.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def worker_plans(cfg: dict) -> dict:
    """``{"spec", "tokens", "row_bytes", "plans": {system: [FlowPlan per timed iteration]}}`` for a
    worker config; ``spec`` carries the runtime's dtype (``spec.row_bytes == row_bytes``)."""
    from dataclasses import replace

    from zepp.model import model_preset
    from zepp.planner import plan_batch
    from zepp.planner.placement import make_placement
    from zepp.runtime.inputs import DTYPES, load_traces
    from zepp.runtime.systems import SYSTEMS
    from zepp.traces import node_demand, sample_batches

    import torch

    L, N = cfg["gpus_per_node"], cfg["nodes"]
    R = L * N
    spec = model_preset(cfg["model"], experts=cfg.get("experts"), topk=cfg.get("topk"), hidden=cfg.get("hidden"),
                        ffn=cfg.get("ffn"))
    T = cfg.get("tokens") or spec.tokens_for_budget(cfg["budget_mb"])
    hist_trace, eval_trace = load_traces(cfg, spec)
    hist = node_demand(hist_trace, N, L)
    warmup, iters = cfg["warmup"], cfg["iters"]
    batches = sample_batches(eval_trace, R, T, iters + warmup, cfg["seed"])
    elem = torch.empty(0, dtype=DTYPES[cfg["dtype"]]).element_size()
    spec = replace(spec, dtype_bytes=elem)
    row = spec.row_bytes
    plans = {}
    for name in cfg["systems"]:
        sysd = SYSTEMS[name]
        if sysd.swaps:
            raise ValueError(f"worker_plans: system {name!r} swaps weights between iterations; not modelled here")
        placement = make_placement(sysd.placement, hist, spec.num_experts, R, L, extra=cfg["extra"])
        plans[name] = [plan_batch(batches[it].astype(np.int64), placement, sysd, row, cfg["relaxation"])
                       for it in range(warmup, warmup + iters)]
    return {"spec": spec, "tokens": T, "row_bytes": row, "plans": plans}


# ---------------------------------------------------------------------------------------------
# compute calibration (runs in every rank at once, via EmulatedCluster.call)


def compute_worker(hidden: int, ffn: int, points: list, reps: int = 5, seed: int = 0) -> dict:
    """Time ``grouped_up`` and ``grouped_down`` (the runtime's expert code) on ``rows`` rows
    spread evenly over ``groups`` slots, for each ``[rows, groups]`` in ``points``; every rank
    runs this at the same moment (barrier before each point), so the figures carry the CPU
    contention of a full run. Returns ``{"up": [s], "down": [s]}`` (median of ``reps``) per point."""
    import os

    import torch
    import torch.distributed as dist

    from zepp.runtime.experts import grouped_down, grouped_up

    torch.set_num_threads(int(os.environ.get("ZEPP_THREADS", "1")))
    from zepp.runtime.rank_process import init_group

    init_group("gloo", 120.0)
    g = torch.Generator().manual_seed(seed)
    up, down = [], []
    for rows, groups in points:
        w1 = torch.randn(groups, hidden, ffn, generator=g)
        w2 = torch.randn(groups, ffn, hidden, generator=g)
        x = torch.randn(rows, hidden, generator=g)
        slot = np.sort(np.arange(rows) % groups)
        tu, td = [], []
        for _ in range(reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            h = grouped_up(x, slot, w1)
            t1 = time.perf_counter()
            grouped_down(h, slot, w2)
            t2 = time.perf_counter()
            tu.append(t1 - t0)
            td.append(t2 - t1)
        up.append(statistics.median(tu[1:]))
        down.append(statistics.median(td[1:]))
    dist.barrier()
    dist.destroy_process_group()
    return {"up": up, "down": down}


def fit_compute(points: list, per_rank: list[dict]) -> dict:
    """Least squares ``t = c_group * groups + c_row * rows`` for up and down, on the median over
    ranks of each point. Returns ``{"up": [c_group, c_row], "down": [...], "rel_rms": {...}}``."""
    A = np.array([[g, r] for r, g in points], float)
    out, err = {}, {}
    for kind in ("up", "down"):
        t = np.median(np.array([pr[kind] for pr in per_rank]), axis=0)
        coef, *_ = np.linalg.lstsq(A, t, rcond=None)
        coef = np.maximum(coef, 0.0)
        out[kind] = coef.tolist()
        err[kind] = float(np.sqrt(np.mean(((A @ coef - t) / t) ** 2)))
    out["rel_rms"] = err
    return out


def calibrate(cl, hidden: int, ffn: int, points=None, link_kwargs=None) -> dict:
    """Links (``zepp.emulate.linkcal``) and expert compute of a running emulated cluster.

    Returns ``{"links": LinkCalibration.as_dict(), "cluster_fields": {...}, "compute": fit,
    "compute_points": points, "compute_raw": per-rank timings}``.
    """
    from zepp.emulate.linkcal import calibrate_links

    links = calibrate_links(cl, **(link_kwargs or {}))
    points = points or [[64, 8], [256, 8], [1024, 8], [256, 32], [1024, 32], [2048, 32], [4096, 32]]
    raw = cl.call("zepp.emulate.simcheck:compute_worker", {"hidden": hidden, "ffn": ffn, "points": points},
                  timeout=300)
    # the fixed cost of one all_to_all_single with (almost) nothing to move, slowest rank
    empty = cl.call("zepp.emulate.a2a_jobs:a2a_time", {"bytes_per_peer": 4, "iters": 20, "warmup": 3},
                    timeout=120)[0]
    import os

    return {"links": links.as_dict(), "cluster_fields": links.cluster_fields(), "cores": os.cpu_count(),
            "a2a_empty_s": empty["median_s"],
            "compute": fit_compute(points, raw),
            "compute_points": points, "compute_raw": raw}


# ---------------------------------------------------------------------------------------------
# the simulated layer: the simulator's one layer builder with the executor's record (glooexec)


def layer_graph(plan, spec, cal: dict, mech, plan_s: float, params: dict):
    """The task graph of one layer of ``plan`` on the runtime's gloo executor:
    ``zepp.sim.layer.build_layer`` with ``mech`` (``zepp.emulate.glooexec.gloo_mechanics`` of the
    system) and glooexec's net, cluster and GEMM cost. ``spec``: the layer's ``MoESpec`` with
    the wire dtype (``row_bytes`` of the plan);
    ``params``: ``stage_overhead``, ``cpu_per_byte``, ``bw_scale`` (see ``fit_free_parameters``).
    Returns ``(graph, cluster, net)``."""
    from zepp.emulate.glooexec import emulated_cluster, emulated_gemm, emulated_net
    from zepp.sim.layer import build_layer
    from zepp.sim.layer_work import LayerWork
    from zepp.sim.task_graph import TaskGraph

    if spec.row_bytes != plan.row_bytes:
        raise ValueError(f"spec rows of {spec.row_bytes} B, plan rows of {plan.row_bytes} B")
    R, L = plan.ranks, plan.gpus_per_node
    cl = emulated_cluster(cal, R // L, L, params.get("bw_scale", 1.0))
    net = emulated_net(cal, R, L, params["stage_overhead"], params.get("cpu_per_byte", 0.0))
    g = TaskGraph(cl)
    build_layer(g, cl, spec, LayerWork.of(plan), mech, net, np.full(R, plan_s),
                planning=np.full(R, plan_s), gemm_cost=emulated_gemm(cal))
    return g, cl, net


def simulate_layer(plan, spec, cal: dict, mech, plan_s: float, params: dict) -> float:
    """Simulated layer latency (seconds, slowest rank) of one plan (exact engine: no coarsening)."""
    from zepp.sim.engine import simulate

    g, cl, net = layer_graph(plan, spec, cal, mech, plan_s, params)
    return simulate(g, nic_bw=cl.nic_bw * net.nic_eff, labels=False).latency


def simulate_system(plans: list, spec, cal: dict, mech, plan_s: float, params: dict) -> float:
    """Median over the timed iterations' plans (the measured metric: median of the per-iteration max)."""
    return float(np.median([simulate_layer(p, spec, cal, mech, plan_s, params) for p in plans]))


def fit_free_parameters(cases: list[dict], cal_of) -> dict:
    """Fit ``stage_overhead`` and ``cpu_per_byte`` on ``a2av`` only (``bw_scale`` stays 1: the
    links run at their calibrated rates).

    ``cases``: ``[{"plans": [...], "spec", "plan_s", "measured_s", "key"}]`` (a2av of each configuration);
    ``cal_of(key)``: its calibration. The latency is close to linear in both parameters (they
    add CPU time before each collective), so three simulations per case give the slopes, and
    weighted least squares on relative error (non-negative) gives the values; a final
    simulation reports the fit's residuals.
    """
    from zepp.emulate.glooexec import gloo_mechanics
    from zepp.registry import system

    mech = gloo_mechanics(system("a2av"))
    meas = np.array([c["measured_s"] for c in cases])

    def sim(o, b):
        return np.array([simulate_system(c["plans"], c["spec"], cal_of(c["key"]), mech, c["plan_s"],
                                         {"stage_overhead": o, "cpu_per_byte": b}) for c in cases])

    base = sim(0.0, 0.0)
    d_o = (sim(1e-3, 0.0) - base) / 1e-3
    d_b = (sim(0.0, 1e-9) - base) / 1e-9
    A = np.stack([d_o, d_b], axis=1) / meas[:, None]
    y = (meas - base) / meas
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    if np.any(coef < 0):  # non-negative: best single-parameter fit
        cands = [np.array([max(0.0, float(A[:, 0] @ y / (A[:, 0] @ A[:, 0]))), 0.0]),
                 np.array([0.0, max(0.0, float(A[:, 1] @ y / (A[:, 1] @ A[:, 1])))])]
        coef = min(cands, key=lambda c: float(np.sum((A @ c - y) ** 2)))
    params = {"stage_overhead": float(coef[0]), "cpu_per_byte": float(coef[1]), "bw_scale": 1.0}
    final = sim(params["stage_overhead"], params["cpu_per_byte"])
    return {**params, "rel_err": ((final - meas) / meas).tolist(), "no_overhead_ms": (base * 1e3).tolist()}
