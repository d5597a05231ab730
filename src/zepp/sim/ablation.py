"""The paper's ablation (section 6.5): COMET, then Zepp's parts one at a time, under drifting demand.

Six *arms* (``ARMS``), each a registry row or a row built from two rows' stage choices:

- ``comet``: the ``comet`` row (COMET's fused kernels, home placement);
- ``overlap``: Zepp's execution alone: ``zepp-overlap``'s transport (merge, split, pre-reduce)
  and overlap (dispatch groups, combine waves) on ``comet``'s home placement and routing;
- ``placement``: Zepp's placement and routing alone: ``comet``'s kernels on ``zepp-overlap``'s
  placement and routing (as the ``comet+eplb`` row runs COMET on EPLB's);
- ``static``: both, the placement fixed: the ``zepp-overlap`` row;
- ``swap``: ``static`` plus intra-node swaps before every batch: the ``zepp-swap`` row;
- ``swap1``: ``static`` plus one round of swaps: ``zepp-swap`` with adaptation
  ``zepp-swap-once`` (planned from the first batch's loads, then kept).

Per schedule (``zepp.traces.SCHEDULES``) one workload (``drift_workload``: history and batches,
no warm-up: every batch of the schedule is timed) is simulated with every arm
(``zepp.sim.run.run_system``); the figure per arm is the mean over the schedule of the
per-iteration time (latency = max over ranks).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from zepp import registry

ARMS = {
    "comet": "COMET (registry row comet): fused tile-level overlap, dense all-gather dispatch, home placement",
    "overlap": "Zepp's transport and overlap alone: zepp-overlap's dispatch/combine/overlap on comet's home "
               "placement and routing",
    "placement": "Zepp's placement and routing alone: comet's kernels on zepp-overlap's placement and routing",
    "static": "both, placement fixed (registry row zepp-overlap)",
    "swap": "static plus intra-node swaps before every batch from the previous batch's loads (registry row zepp-swap)",
    "swap1": "static plus one round of swaps, planned from the first batch's loads and then kept (zepp-swap with "
             "adaptation zepp-swap-once)",
}
DEFAULT_SCHEDULES = ("in-history", "rotating")


def arm_system(arm: str) -> registry.System:
    """The simulator row of ``arm`` (``ARMS``)."""
    rows = registry.SYSTEMS
    if arm == "overlap":
        return replace(rows["zepp-overlap"], name="ablation-overlap", placement=rows["comet"].placement,
                       routing=rows["comet"].routing, summary=ARMS[arm], paper_column=None)
    if arm == "placement":
        return replace(rows["comet"], name="ablation-placement", placement=rows["zepp-overlap"].placement,
                       routing=rows["zepp-overlap"].routing, summary=ARMS[arm], paper_column=None)
    if arm == "swap1":
        return replace(rows["zepp-swap"], name="ablation-swap1", adaptation="zepp-swap-once", summary=ARMS[arm])
    return rows[{"comet": "comet", "static": "zepp-overlap", "swap": "zepp-swap"}[arm]]


def run_schedule(job: dict, arms=tuple(ARMS)) -> dict:
    """Every arm on one configuration ``job`` (``zepp.sim.bench_jobs`` job with a schedule and
    ``warmup = 0``): per arm ``mean_ms``, ``median_ms``, ``iters_ms``, ``swapped_slots`` (per
    iteration), ``path_ms`` (the mean critical path by category, ``zepp.sim.critical_path``);
    with the workload's ``topic_mix`` report and the CPU seconds it took."""
    from zepp.sim.bench_jobs import make_config
    from zepp.sim.critical_path import mean_path
    from zepp.sim.run import Shared, run_system

    t0 = time.process_time()
    cfg, wl = make_config(job, with_workload=True)
    cfg.paths = True
    shared = Shared()
    out = {}
    for arm in arms:
        r = run_system(arm_system(arm), cfg, shared=shared)
        ms = np.asarray(r.latencies) * 1e3
        out[arm] = dict(mean_ms=float(ms.mean()), median_ms=float(np.median(ms)), iters_ms=ms.round(4).tolist(),
                        swapped_slots=[int(x) for x in r.swapped_slots],
                        path_ms={c: round(v * 1e3, 4) for c, v in mean_path(r.paths).items()})
    mix = dict(wl.report(), describe=wl.describe()) if wl is not None else None
    return dict(arms=out, topic_mix=mix, topics=wl.topics.stats if wl is not None else None,
                cpu_s=time.process_time() - t0)


def run_ablation(model: str = "k2", nodes: int = 4, gpus_per_node: int = 4, budget_mb: float = 64.0,
                 cluster: str = "a100", traces: str | None = None, schedules=DEFAULT_SCHEDULES, iters: int = 32,
                 period: int | None = None, seed: int = 0, on_schedule=None) -> dict:
    """The ablation table: ``{"schedules": {schedule: {arm: mean ms}}, "speedup_over_comet":
    {schedule: {arm: x}}, "detail": {schedule: run_schedule(...)}, "arms": ARMS, "config": ...}``.
    ``on_schedule(name, detail)`` is called as each schedule finishes."""
    from zepp.sim.bench_jobs import make_jobs

    table, speed, detail = {}, {}, {}
    for sched in schedules:
        job = make_jobs([cluster], [nodes], gpus_per_node, [model], [budget_mb], [], iters, 0, seed, traces,
                        schedule=sched)[0]
        if period is not None:
            job["period"] = period
        d = run_schedule(job)
        detail[sched] = d
        table[sched] = {a: round(v["mean_ms"], 4) for a, v in d["arms"].items()}
        speed[sched] = {a: round(table[sched]["comet"] / v, 4) for a, v in table[sched].items()}
        if on_schedule is not None:
            on_schedule(sched, d)
    config = dict(model=model, nodes=nodes, gpus_per_node=gpus_per_node, budget_mb=budget_mb, cluster=cluster,
                  traces=traces, iters=iters, period=period, seed=seed, warmup=0)
    return dict(schedules=table, speedup_over_comet=speed, arms=ARMS, config=config, detail=detail,
                cpu_s=round(sum(d["cpu_s"] for d in detail.values()), 1))


def _ratio_line(table: dict, sched: str, a: str, b: str) -> str:
    return f"{table[sched][b] / table[sched][a]:.2f}x"


def closing_note(result: dict) -> str:
    """Each arm's speedup over COMET per schedule, and what each step buys (ratios of means)."""
    t = result["schedules"]
    lines = []
    for sched, row in t.items():
        sp = result["speedup_over_comet"][sched]
        swaps = sum(sum(result["detail"][sched]["arms"][a]["swapped_slots"]) for a in ("swap", "swap1")
                    if a in result["detail"][sched]["arms"])
        lines.append(f"{sched}: speedup over comet " + ", ".join(f"{a} {sp[a]:.2f}x" for a in row) + ".")
        lines.append(f"  overlap vs comet ({_ratio_line(t, sched, 'overlap', 'comet')}): Zepp's transport and "
                     f"overlap on COMET's placement; placement vs comet ({_ratio_line(t, sched, 'placement', 'comet')}): "
                     f"Zepp's placement and routing under COMET's kernels; static vs overlap "
                     f"({_ratio_line(t, sched, 'static', 'overlap')}): what the placement adds to the overlap; "
                     f"static vs placement ({_ratio_line(t, sched, 'static', 'placement')}): what the overlap adds "
                     f"to the placement; swap vs static ({_ratio_line(t, sched, 'swap', 'static')}) and swap1 vs "
                     f"static ({_ratio_line(t, sched, 'swap1', 'static')}): what swaps buy "
                     f"({swaps} swapped slots in all, both swap arms).")
    return "\n".join(lines)


def format_table(result: dict) -> str:
    """Markdown: one row per schedule, mean ms per arm and its speedup over COMET."""
    arms = list(next(iter(result["schedules"].values())))
    head = ["schedule"] + [f"{a} ms (x)" for a in arms]
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for sched, row in result["schedules"].items():
        sp = result["speedup_over_comet"][sched]
        out.append("| " + " | ".join([sched] + [f"{row[a]:.2f} ({sp[a]:.2f}x)" for a in arms]) + " |")
    return "\n".join(out)


def format_paths(result: dict) -> str:
    """Markdown: where each arm's time goes, per schedule: mean ms per category along the critical
    path (``zepp.sim.critical_path.CATEGORIES``; categories no arm spends time on left out)."""
    from zepp.sim.critical_path import CATEGORIES

    out = []
    for sched, d in result["detail"].items():
        arms = d["arms"]
        cats = [c for c in CATEGORIES if any(a["path_ms"].get(c, 0) >= 0.005 for a in arms.values())]
        out.append(f"{sched}: mean ms per layer along the critical path")
        out.append("| arm | " + " | ".join(cats) + " | total |")
        out.append("| " + " | ".join("---" for _ in range(len(cats) + 2)) + " |")
        for arm, a in arms.items():
            out.append(f"| {arm} | " + " | ".join(f"{a['path_ms'].get(c, 0):.2f}" for c in cats)
                       + f" | {a['mean_ms']:.2f} |")
        out.append("")
    return "\n".join(out).rstrip()
