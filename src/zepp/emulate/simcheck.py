"""The simulator against the emulated cluster: calibrate, model this executor, compare.

Three parts:

1. ``worker_plans(cfg)``: the FlowPlans ``zepp.runtime.worker`` executes for a config (same
   traces, placement, batches, routing), recomputed outside the ranks.
2. Calibration of the emulated cluster: links with ``zepp.emulate.linkcal`` (gloo send/recv
   between rank processes); the fixed cost of one empty ``all_to_all_single`` over all ranks
   (``zepp.emulate.jobs.a2a_time``, 4 bytes per peer: scheduling and wake-up latency of R
   processes on this machine's cores, charged once per collective beyond the per-message
   costs); expert compute with ``compute_worker`` run in *every* rank at once
   (so the CPU contention of R processes on this machine's cores is in the figure), timing the
   runtime's own ``grouped_up``/``grouped_down`` on ``rows`` rows spread over ``groups`` slots,
   fitted by least squares to ``t = c_group * groups + c_row * rows``.
3. ``layer_graph`` / ``simulate_system``: a task graph of the runtime's executor (not of the paper's GPU baselines)
   for ``zepp.sim.engine.simulate``:

   - per rank: metadata all-gather + planning (a fixed task: the worker's own measured median
     ``plan`` time of that system in the same run: planning is CPU time the model does not try
     to predict), then per stage one ``all_to_all_single``. gloo's ``alltoallv`` walks the peers
     in a ring (step ``i``: send to ``rank+i``, receive from ``rank-i``), and on these links it
     behaves as one peer at a time: the 2x2 all-to-all of 1 MB per peer in
     ``benchmarks/results/emulate_links.md`` takes 31 ms at 1000 Mbit/s, what three sequential
     steps of 1 MB NIC messages cost (25 ms + fixed costs), not the 17 ms of concurrent sends.
     So each rank's messages of a stage are transfers one after another in ring order (each
     also waits for its receiver to post the collective), sharing the NIC and veth links
     max-min fairly with other ranks' messages and paying the link's measured per-message
     cost; a rank leaves the stage when its sends and receives are done; a stage's send of
     forwarded rows waits for the stage that brought them (the data dependency).
   - expert compute as one task per arrival group on the rank's compute stream with the fitted
     ``c_group * groups + c_row * rows``;
   - CPU cost of moving bytes and of Python: before each posted all-to-all, a rank spends
     ``stage_overhead`` seconds (free parameter 1) plus ``cpu_per_byte`` seconds per byte it
     sends and receives in it (free parameter 2: TCP through veth is kernel copying on the same
     2 cores that compute, and the gather/scatter of rows costs CPU too), times the ranks that
     share a core, ``max(1, R / cores)``. Both are fitted on the ``a2av`` measurements only
     (``fit_free_parameters``) and then used unchanged for every other system.
   - ``overlap`` systems (``zepp``): own rows compute while stage 0 is on the wire, each stage's
     received rows while the next stage is on the wire; combine stage 0 leaves in one wave per
     destination node (ring order, own node last), each wave's sends after its second GEMM.

   What it leaves out: CPU contention between communication (TCP copies through the kernel
   cost CPU on this 2-core machine) and compute, beyond the two parameters; ranks drifting
   out of step between stages when a loaded scheduler runs them late; TCP window dynamics;
   the gloo IO thread. Measured consequence (``benchmarks/results/emulate_bench.md``): the
   2-stage systems (a2av, eplb, zepp-a2av) are predicted to within ~10%, and the 3-stage
   systems (relay, zepp) too fast by 25-60%, because a cost per stage shows only there and an
   a2av-only fit cannot see it.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def worker_plans(cfg: dict) -> dict:
    """``{"spec", "tokens", "plans": {system: [FlowPlan per timed iteration]}}`` for a worker config."""
    from zepp.model import model_preset
    from zepp.placement import make_placement
    from zepp.runtime.dispatcher import build_plan
    from zepp.runtime.systems import SYSTEMS
    from zepp.runtime.worker import DTYPES, load_traces
    from zepp.trace import node_demand, sample_batches

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
    row = spec.hidden * torch.empty(0, dtype=DTYPES[cfg["dtype"]]).element_size()
    plans = {}
    for name in cfg["systems"]:
        sysd = SYSTEMS[name]
        if sysd.swaps:
            raise ValueError(f"worker_plans: system {name!r} swaps weights between iterations; not modelled here")
        placement = make_placement(sysd.placement, hist, spec.num_experts, R, L, extra=cfg["extra"])
        plans[name] = [build_plan(batches[it].astype(np.int64), placement, sysd.routing, cfg["relaxation"],
                                  sysd.dispatch, row, sysd.combine) for it in range(warmup, warmup + iters)]
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
    from zepp.runtime.worker import init_group

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
    empty = cl.call("zepp.emulate.jobs:a2a_time", {"bytes_per_peer": 4, "iters": 20, "warmup": 3}, timeout=120)[0]
    import os

    return {"links": links.as_dict(), "cluster_fields": links.cluster_fields(), "cores": os.cpu_count(),
            "a2a_empty_s": empty["median_s"],
            "compute": fit_compute(points, raw),
            "compute_points": points, "compute_raw": raw}


# ---------------------------------------------------------------------------------------------
# the executor's task graph


def _cluster(cal: dict, nodes: int, gpus_per_node: int, bw_scale: float):
    from zepp.cluster import Cluster

    f = cal["cluster_fields"]
    return Cluster(name="emulated", nodes=nodes, gpus_per_node=gpus_per_node, nvlink_bw=f["nvlink_bw"] * bw_scale,
                   nic_bw=f["nic_bw"] * bw_scale, nvlink_msg_cost=f["nvlink_msg_cost"],
                   nic_msg_cost=f["nic_msg_cost"], peak_flops=1e12, hbm_bw=1e12, kernel_launch=0.0)


def _gemm_s(cal: dict, kind: str, rows: int, groups: int) -> float:
    if rows <= 0:
        return 0.0
    cg, cr = cal["compute"][kind]
    return cg * groups + cr * rows


def layer_graph(plan, cal: dict, overlap: bool, plan_s: float, params: dict):
    """The task graph of one layer of the runtime executor for ``plan`` (see the module doc).

    ``params``: ``stage_overhead`` (s per posted all-to-all and rank), ``cpu_per_byte`` (CPU
    seconds per byte a rank sends plus receives in a collective, on one core; multiplied by the
    ranks per core, ``max(1, R / cores)``), ``bw_scale`` (multiplies both link rates)."""
    from zepp.runtime.program import compile_rank
    from zepp.sim.engine import TaskGraph

    R, L = plan.ranks, plan.gpus_per_node
    cl = _cluster(cal, R // L, L, params.get("bw_scale", 1.0))
    share = max(1.0, R / cal.get("cores", 2))
    s_over, c_byte = params["stage_overhead"], params.get("cpu_per_byte", 0.0) * share
    # measured fixed cost of an empty collective, less the per-message costs the transfers pay
    mean_msg = (L - 1) / (R - 1) * cl.nvlink_msg_cost + (R - L) / (R - 1) * cl.nic_msg_cost if R > 1 else 0.0
    s_over += max(0.0, cal.get("a2a_empty_s", 0.0) - (R - 1) * mean_msg)
    g = TaskGraph(cl)
    row = plan.row_bytes
    progs = [compile_rank(plan, r, waves=overlap) for r in range(R)]
    # gloo's alltoallv: rank r sends to r+1, r+2, ... in turn; row i-1 of (src, dst) = step i
    step_src = np.tile(np.arange(R), R - 1)
    step_dst = (step_src + np.repeat(np.arange(1, R), R)) % R
    src, dst = step_src, step_dst
    msg = np.where(src // L == dst // L, cl.nvlink_msg_cost, cl.nic_msg_cost)

    def transfers(sends, kind, post):
        """One collective's messages, each rank's sends one after another in gloo's order; a
        message also waits until its receiver has posted the collective."""
        x = g.add_transfer(src, dst, sends[src, dst].astype(float), msg, kind=kind)
        post = np.asarray(post)
        g.after(post[src], x)
        g.after(post[dst], x)
        if R > 2:
            g.after(x[:-R], x[R:])
        return x
    chain = [g.add_fixed(r, plan_s, kind="plan") for r in range(R)]  # last task of each rank's thread

    def collective(sends: np.ndarray, kind: str) -> list[int]:
        """One all_to_all_single: ``sends [R, R]`` bytes; each rank posts after its chain."""
        moved = sends.sum(axis=0) + sends.sum(axis=1)
        post = np.array([g.add_fixed(r, s_over + c_byte * moved[r], kind="other", deps=chain[r]) for r in range(R)])
        x = transfers(sends, kind, post)
        ends = []
        for r in range(R):
            e = g.add_fixed(r, 0.0, kind="barrier", stream=None)
            g.after(x[(src == r) | (dst == r)], e)
            g.after(post[r], e)
            ends.append(e)
        return ends

    def counts(stages, s, w=0):
        return np.stack([p_[s].send_counts[:, w] if s < len(p_) else np.zeros(R, np.int64)
                         for p_ in stages]).astype(float) * row

    n_d = max(len(p.dispatch) for p in progs)
    n_c = max(len(p.combine) for p in progs)
    if not overlap:
        for s in range(n_d):
            chain = collective(counts([p.dispatch for p in progs], s), "dispatch")
        chain = [g.add_fixed(r, _gemm_s(cal, "up", progs[r].n_entries, int((progs[r].counts > 0).sum()))
                             + _gemm_s(cal, "down", progs[r].n_entries, int((progs[r].counts > 0).sum())),
                             kind="gemm", deps=chain[r]) for r in range(R)]
        for s in range(n_c):
            chain = collective(counts([p.combine for p in progs], s), "combine")
        return g

    def up_group(r, events):
        m = np.isin(progs[r].e_event, events)
        return _gemm_s(cal, "up", int(m.sum()), len(np.unique(progs[r].e_slot[m])))

    pending = [[0]] * R
    for s in range(n_d):
        sends = counts([p.dispatch for p in progs], s)
        moved = sends.sum(axis=0) + sends.sum(axis=1)
        post = [g.add_fixed(r, s_over + c_byte * moved[r], kind="other", deps=chain[r]) for r in range(R)]
        comp = [g.add_fixed(r, up_group(r, pending[r]), kind="gemm", deps=post[r]) for r in range(R)]
        x = transfers(sends, "dispatch", post)
        chain = []
        for r in range(R):
            e = g.add_fixed(r, 0.0, kind="barrier", stream=None)
            g.after(x[(src == r) | (dst == r)], e)
            g.after(comp[r], e)
            chain.append(e)
        pending = [[1 + 2 * s, 2 + 2 * s]] * R
    chain = [g.add_fixed(r, up_group(r, pending[r]), kind="gemm", deps=chain[r]) for r in range(R)]
    W = max(p.num_waves for p in progs)
    wave_ends = [[] for _ in range(R)]
    for w in range(W):
        comp = []
        for r in range(R):
            m = progs[r].e_wave == w
            comp.append(g.add_fixed(r, _gemm_s(cal, "down", int(m.sum()), len(np.unique(progs[r].e_slot[m]))),
                                    kind="gemm", deps=chain[r]))
        chain = comp
        sends = np.stack([p.combine[0].send_counts[:, w] if p.combine and w < p.combine[0].send_counts.shape[1]
                          else np.zeros(R) for p in progs]).astype(float) * row
        moved = sends.sum(axis=0) + sends.sum(axis=1)
        post = [g.add_fixed(r, s_over + c_byte * moved[r], kind="other", deps=chain[r]) for r in range(R)]
        x = transfers(sends, "combine", post)
        for r in range(R):
            e = g.add_fixed(r, 0.0, kind="barrier", stream=None)
            g.after(x[(src == r) | (dst == r)], e)
            wave_ends[r].append(e)
        chain = post
    joined = []
    for r in range(R):
        e = g.add_fixed(r, 0.0, kind="barrier", stream=None)
        g.after(np.array(wave_ends[r] + [chain[r]]), e)
        joined.append(e)
    chain = joined
    for s in range(1, n_c):
        chain = collective(counts([p.combine for p in progs], s), "combine")
    return g


def simulate_layer(plan, cal: dict, overlap: bool, plan_s: float, params: dict) -> float:
    """Simulated layer latency (seconds, slowest rank) of one plan."""
    from zepp.sim.engine import simulate

    return simulate(layer_graph(plan, cal, overlap, plan_s, params), labels=False).latency


def simulate_system(plans: list, cal: dict, overlap: bool, plan_s: float, params: dict) -> float:
    """Median over the timed iterations' plans (the measured metric: median of the per-iteration max)."""
    return float(np.median([simulate_layer(p, cal, overlap, plan_s, params) for p in plans]))


def fit_free_parameters(cases: list[dict], cal_of) -> dict:
    """Fit ``stage_overhead`` and ``cpu_per_byte`` on ``a2av`` only (``bw_scale`` stays 1: the
    links run at their calibrated rates).

    ``cases``: ``[{"plans": [...], "plan_s", "measured_s", "key"}]`` (a2av of each configuration);
    ``cal_of(key)``: its calibration. The latency is close to linear in both parameters (they
    add CPU time before each collective), so three simulations per case give the slopes, and
    weighted least squares on relative error (non-negative) gives the values; a final
    simulation reports the fit's residuals.
    """
    meas = np.array([c["measured_s"] for c in cases])

    def sim(o, b):
        return np.array([simulate_system(c["plans"], cal_of(c["key"]), False, c["plan_s"],
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
