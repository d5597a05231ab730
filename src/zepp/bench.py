"""``zepp bench`` and ``zepp timeline``: the simulated MoE-layer benchmark of PAPER.md section 4.

Per configuration (cluster, nodes, model, budget): a placement history and ``warmup + iters``
evaluation batches (built-in synthetic traces by default, ``--traces DIR`` for real ones), every
system of ``zepp.systems`` planned and simulated per batch, latency = max over ranks, reported
as the median of the timed iterations. ``zepp`` is the best of its three variants. The lower
bound of a configuration is the smallest physical floor of any system (``zepp.lowerbound``).
"""

from __future__ import annotations

import json
import math
import os
import time

import click
import numpy as np

from zepp.errors import ZeppInputError

DEFAULT_NODES = (4, 8, 16)
DEFAULT_MODELS = ("k2", "qwen")
DEFAULT_BUDGETS = (1.0, 4.0, 16.0)
WEAK_NODES = (2, 4, 8, 16, 32)
WEAK_BUDGETS = (1.0, 64.0)
WEAK_SYSTEMS = ("a2av", "zepp-a2av", "zepp-overlap", "zepp-swap")


def _csv(kind, value, cast):
    if value is None:
        return None
    try:
        out = tuple(cast(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise ZeppInputError(f"--{kind}: expected a comma-separated list, got {value!r}") from None
    if not out:
        raise ZeppInputError(f"--{kind}: empty list")
    return out


def _traces(model: str, traces_dir: str | None, seed: int):
    if traces_dir:
        from zepp.trace import load_model_traces

        return load_model_traces(traces_dir, model)
    from zepp.synth import synthetic_traces

    return synthetic_traces(model, seed)


def run_config(job: dict) -> dict:
    """Simulate one configuration: ``job`` = cluster, nodes, model, budget_mb, systems, iters,
    warmup, seed, traces. Returns one JSON row (plus ``detail`` per system)."""
    from zepp.calibrate import calibrated, measured_ms
    from zepp.model import model_preset
    from zepp.systems import Config, run_system
    from zepp.trace import node_demand, sample_batches

    cl, net = calibrated(job["cluster"], job["nodes"])
    spec = model_preset(job["model"])
    pool, ev = _traces(job["model"], job.get("traces"), job["seed"])
    T = spec.tokens_for_budget(job["budget_mb"])
    hist = node_demand(pool, cl.nodes, cl.gpus_per_node)
    batches = sample_batches(ev, cl.ranks, T, job["warmup"] + job["iters"], job["seed"])
    cfg = Config(cl, spec, net, hist, batches, warmup=job["warmup"])
    placements, cache = {}, {}
    lat, floor, detail = {}, {}, {}
    for s in job["systems"]:
        t = time.perf_counter()
        res = run_system(s, cfg, placements=placements, cache=cache)
        lat[s] = res.median * 1e3
        floor[s] = float(np.median(res.lower_bound)) * 1e3
        detail[s] = dict(iters_ms=[x * 1e3 for x in res.latencies], planning_ms=float(np.median(res.planning)) * 1e3,
                         floor_ms=floor[s], wall_s=time.perf_counter() - t)
    variants = [s for s in ("zepp-a2av", "zepp-overlap", "zepp-swap") if s in lat]
    if variants:
        lat["zepp"] = min(lat[s] for s in variants)
    return dict(cluster=job["cluster"], nodes=job["nodes"], model=job["model"], budget_mb=job["budget_mb"],
                latency_ms=lat, lower_bound_ms=min(floor.values()) if floor else None,
                measured_ms=measured_ms(job["cluster"], job["nodes"], job["model"], job["budget_mb"]),
                detail=detail)


def _speedup(row: dict) -> float | None:
    from zepp.systems import BASELINES

    base = [row["latency_ms"][s] for s in BASELINES if s in row["latency_ms"]]
    if "zepp" not in row["latency_ms"] or not base:
        return None
    return min(base) / row["latency_ms"]["zepp"]


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return float(math.exp(np.mean(np.log(xs)))) if xs else None


def format_table(rows: list[dict], systems: list[str]) -> str:
    """Markdown table like PAPER.md section 4, with Zepp and the speedup over the best baseline."""
    from zepp.systems import BASELINES

    shown = [s for s in systems if s in BASELINES] + (["zepp"] if any("zepp" in r["latency_ms"] for r in rows) else [])
    head = ["cluster", "nodes", "model", "MB"] + shown + ["best baseline", "speedup", "LB ms"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        base = {s: r["latency_ms"][s] for s in BASELINES if s in r["latency_ms"]}
        best = min(base, key=base.get) if base else "-"
        sp = _speedup(r)
        cells = [r["cluster"], str(r["nodes"]), r["model"], f"{r['budget_mb']:g}"]
        cells += [f"{r['latency_ms'][s]:.2f}" if s in r["latency_ms"] else "-" for s in shown]
        cells += [best, f"{sp:.2f}x" if sp else "-", f"{r['lower_bound_ms']:.2f}" if r["lower_bound_ms"] else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_bench(jobs: list[dict], workers: int = 1, progress: bool = True) -> list[dict]:
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc="zepp bench", unit="config", disable=not progress)
    rows = []
    if workers > 1 and len(jobs) > 1:
        import multiprocessing as mp

        # biggest configurations first so the two workers finish together
        order = sorted(range(len(jobs)), key=lambda i: -jobs[i]["nodes"] * jobs[i]["budget_mb"])
        with mp.get_context("spawn").Pool(workers) as pool:
            results = {}
            for i, row in zip(order, pool.imap(run_config, [jobs[i] for i in order])):
                results[i] = row
                bar.update(1)
        rows = [results[i] for i in range(len(jobs))]
    else:
        for j in jobs:
            bar.set_postfix_str(f"{j['cluster']} {j['nodes']}n {j['model']} {j['budget_mb']:g}MB")
            rows.append(run_config(j))
            bar.update(1)
    bar.close()
    return rows


@click.command("bench")
@click.option("--traces", "traces_dir", type=click.Path(), default=None,
              help="Real traces in the layout of ../shared/traces (default: built-in synthetic traces).")
@click.option("--json", "json_path", type=click.Path(), default=None, help="Write every cell as JSON.")
@click.option("--plot", "plot_path", type=click.Path(), default=None, help="Grouped bars (PNG).")
@click.option("--sweep", type=click.Choice(["weak"]), default=None,
              help="weak: K2, 2-32 nodes, 1 and 64 MB, A100 and H100 (a2av and Zepp's variants).")
@click.option("--nodes", default=None, help="Comma-separated node counts (default 4,8,16).")
@click.option("--models", default=None, help="Comma-separated models (default k2,qwen).")
@click.option("--budgets", default=None, help="Comma-separated budgets in MB (default 1,4,16).")
@click.option("--cluster", "clusters", default=None, help="Comma-separated presets (default a100).")
@click.option("--systems", default=None, help="Comma-separated systems (default: all).")
@click.option("--iters", default=10, show_default=True, type=int, help="Timed iterations (median reported).")
@click.option("--warmup", default=5, show_default=True, type=int, help="Warm-up iterations.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--jobs", "workers", default=None, type=int, help="Worker processes (default: min(2, CPUs)).")
def bench(traces_dir, json_path, plot_path, sweep, nodes, models, budgets, clusters, systems, iters, warmup, seed,
          workers):
    """Simulate Zepp and the seven baselines; print the table of PAPER.md section 4."""
    from zepp.systems import SYSTEMS

    if iters < 1 or warmup < 0:
        raise ZeppInputError("--iters must be >= 1 and --warmup >= 0")
    if sweep == "weak":
        d_nodes, d_models, d_budgets, d_clusters, d_systems = WEAK_NODES, ("k2",), WEAK_BUDGETS, ("a100", "h100"), WEAK_SYSTEMS
    else:
        d_nodes, d_models, d_budgets, d_clusters, d_systems = DEFAULT_NODES, DEFAULT_MODELS, DEFAULT_BUDGETS, ("a100",), SYSTEMS
    nodes = _csv("nodes", nodes, int) or d_nodes
    models = _csv("models", models, str) or d_models
    budgets = _csv("budgets", budgets, float) or d_budgets
    clusters = _csv("cluster", clusters, str) or d_clusters
    systems = list(_csv("systems", systems, str) or d_systems)
    if "zepp" in systems:
        systems.remove("zepp")
        systems += [s for s in ("zepp-a2av", "zepp-overlap", "zepp-swap") if s not in systems]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ZeppInputError(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}, zepp")
    if traces_dir and not os.path.isdir(traces_dir):
        raise ZeppInputError(f"--traces {traces_dir!r}: not a directory; give the folder holding k2/ and qwen3/")
    from zepp.cluster import cluster_preset
    from zepp.model import model_preset

    for c in clusters:
        cluster_preset(c, 1)
    for m in models:
        spec = model_preset(m)
        for n in nodes:
            if n < 1 or spec.num_experts % (n * 4):
                raise ZeppInputError(f"--nodes {n}: {spec.num_experts} experts of {m} do not divide over {n * 4} GPUs")
        for b in budgets:
            spec.tokens_for_budget(b)
    jobs = [dict(cluster=c, nodes=n, model=m, budget_mb=b, systems=systems, iters=iters, warmup=warmup, seed=seed,
                 traces=traces_dir) for c in clusters for n in nodes for m in models for b in budgets]
    workers = workers or min(2, os.cpu_count() or 1)
    t0 = time.time()
    rows = run_bench(jobs, workers)
    gm = geomean(_speedup(r) for r in rows)
    click.echo(format_table(rows, systems))
    click.echo(f"geomean speedup of zepp over the fastest baseline per row: {gm:.2f}x" if gm else "")
    click.echo(f"({len(rows)} configurations, {iters} timed + {warmup} warm-up iterations, "
               f"traces: {traces_dir or 'built-in synthetic'}, {time.time() - t0:.0f} s)")
    if json_path:
        out = dict(rows=[{k: r[k] for k in ("cluster", "nodes", "model", "budget_mb", "latency_ms", "lower_bound_ms",
                                            "measured_ms")} for r in rows], geomean_speedup=gm)
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
        with open(os.path.splitext(json_path)[0] + ".detail.json", "w") as f:
            json.dump(rows, f, indent=1)
    if plot_path:
        from zepp.plots import bars

        shown = [s for s in systems if not s.startswith("zepp")] + ["zepp"]
        bars(rows, shown, plot_path, title=f"simulated MoE layer latency ({traces_dir or 'synthetic traces'})")


@click.command("timeline")
@click.option("--cluster", "cluster_name", default="a100", show_default=True)
@click.option("--nodes", default=4, show_default=True, type=int)
@click.option("--model", default="k2", show_default=True)
@click.option("--budget-mb", default=4.0, show_default=True, type=float)
@click.option("--system", default="zepp-overlap", show_default=True)
@click.option("--traces", "traces_dir", type=click.Path(), default=None)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--ranks", default=None, help="Comma-separated ranks to draw (default: the GPUs of node 0).")
@click.option("--out", "out_path", default="timeline.png", show_default=True, type=click.Path())
def timeline(cluster_name, nodes, model, budget_mb, system, traces_dir, seed, ranks, out_path):
    """Draw one configuration's per-resource Gantt chart (PNG) for one system and one batch
    (the third of three simulated)."""
    from zepp.calibrate import calibrated
    from zepp.model import model_preset
    from zepp.plots import gantt
    from zepp.systems import Config, run_system
    from zepp.trace import node_demand, sample_batches

    cl, net = calibrated(cluster_name, nodes)
    spec = model_preset(model)
    pool, ev = _traces(model, traces_dir, seed)
    T = spec.tokens_for_budget(budget_mb)
    # three batches, the last one drawn: Zepp's planner timing is the best so far, so the first
    # (cold) call does not stand for its cost
    cfg = Config(cl, spec, net, node_demand(pool, nodes, cl.gpus_per_node), sample_batches(ev, cl.ranks, T, 3, seed),
                 warmup=0)
    res = run_system(system, cfg, keep_timeline=True)
    rk = list(_csv("ranks", ranks, int) or range(cl.gpus_per_node))
    gantt(res.timeline, out_path, ranks=rk,
          title=f"{system}, {cluster_name} {nodes} nodes, {model} {budget_mb:g} MB: {res.timeline.latency * 1e3:.2f} ms")
    click.echo(f"{system}: {res.timeline.latency * 1e3:.3f} ms; wrote {out_path}")
