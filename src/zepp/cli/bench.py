"""``zepp bench`` and ``zepp timeline``: the simulated MoE-layer benchmark of PAPER.md section 4.

Per configuration (cluster, nodes, model, budget): a placement history and ``warmup + iters``
evaluation batches (built-in synthetic traces by default, ``--traces DIR`` for recorded ones),
every system of ``zepp.registry`` the simulator supports planned and simulated per batch
(``zepp.sim.run``), latency = max over ranks, reported as the median of the timed iterations.
``zepp`` is the best of its variants. The lower bound of a configuration is the smallest
physical floor of any system.

Work is split into units (one configuration and one system; Zepp's variants together, since
they share their routing), run largest first over ``--jobs`` worker processes; the progress
bar advances by each unit's estimated cost, so its time estimate holds early on. Every finished
configuration is written to ``--json`` at once (the file is valid JSON after each), and
``--resume`` skips the configurations that file already holds. Ctrl-C or SIGTERM ends every
worker.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import click
import numpy as np

from zepp import registry
from zepp.errors import ZeppInputError

DEFAULT_NODES = (4, 8, 16)
DEFAULT_MODELS = ("k2", "qwen")
DEFAULT_BUDGETS = (1.0, 4.0, 16.0)
WEAK_NODES = (2, 4, 8, 16, 32)
WEAK_BUDGETS = (1.0, 64.0)
WEAK_SYSTEMS = ("a2av", "zepp")
ROW_KEYS = ("cluster", "nodes", "gpus_per_node", "model", "budget_mb", "latency_ms", "lower_bound_ms",
            "measured_ms", "variant")
# what must match for --resume to reuse a stored configuration
RUN_KEYS = ("systems", "iters", "warmup", "seed", "traces")


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


def traces_for(model: str, traces_dir: str | None, seed: int):
    """``(pool, eval)`` Traces: ``DIR/<model>/`` when ``traces_dir`` is given, else built-in."""
    if traces_dir:
        from zepp.traces import load_model_traces

        return load_model_traces(traces_dir, model)
    from zepp.traces.synthetic import synthetic_traces

    return synthetic_traces(model, seed)


def make_config(job: dict):
    """The ``zepp.sim.run.Config`` of one configuration ``job``."""
    from zepp.sim.calibrate import calibrated
    from zepp.model import model_preset
    from zepp.sim.run import Config
    from zepp.traces import node_demand, sample_batches

    cl, net = calibrated(job["cluster"], job["nodes"], gpus_per_node=job.get("gpus_per_node", 4))
    spec = model_preset(job["model"])
    pool, ev = traces_for(job["model"], job.get("traces"), job["seed"])
    T = spec.tokens_for_budget(job["budget_mb"])
    hist = node_demand(pool, cl.nodes, cl.gpus_per_node)
    batches = sample_batches(ev, cl.ranks, T, job["warmup"] + job["iters"], job["seed"])
    return Config(cl, spec, net, hist, batches, warmup=job["warmup"])


def run_unit(unit: dict) -> dict:
    """Simulate the systems of one unit (a configuration and one or more systems)."""
    from zepp.sim.run import Shared, run_system

    t0 = time.process_time()
    cfg = make_config(unit["job"])
    shared = Shared()
    out = {}
    plain = [s for s in unit["systems"] if not registry.SYSTEMS[s].best_of]
    for s in plain:
        res = run_system(s, cfg, shared=shared)
        out[s] = dict(iters_ms=[x * 1e3 for x in res.latencies], median_ms=res.median * 1e3,
                      planning_ms=float(np.median(res.planning)) * 1e3,
                      floor_ms=float(np.median(res.lower_bound)) * 1e3,
                      swapped_slots=int(np.sum(res.swapped_slots)), variant=None,
                      granularity=res.granularity if any(g is not None for g in res.granularity) else None)
    for s in unit["systems"]:
        if s not in plain:  # a meta-system: the variant zepp.sim.run.run_system picks
            best = registry.pick_variant(s, cfg.batches.shape[2], {v: out[v]["median_ms"] for v in plain})
            out[s] = dict(out[best], variant=best)
    return dict(key=unit["key"], unit=list(unit["systems"]), systems=out, cpu_s=time.process_time() - t0)


# Relative simulation cost per mechanics (CPU seconds per system at 16 nodes, K2, 4 MB, over
# a2av's; measured once with cProfile-free timing): only the progress bar's estimate uses it.
_COST = {"serial-barrier": 1.0, "fast": 0.35, "comet": 0.95, "eplb-staged": 2.7, "epic-relay": 0.55, "moonep": 1.6,
         "signals": 0.8, "zepp-overlap": 1.0, "best-of": 0.0, "by-tokens": 0.0, "deepep-normal": 0.8,
         "deepep-ll": 0.8, "deepep-overlap": 1.0}


def unit_weight(job: dict, systems: list[str]) -> float:
    """Estimated relative cost of simulating ``systems`` on ``job``: messages grow with the
    square of the rank count, rows with ranks x tokens x k, times each system's mechanics."""
    from zepp.model import model_preset

    spec = model_preset(job["model"])
    R = job["nodes"] * job.get("gpus_per_node", 4)
    T = spec.tokens_for_budget(job["budget_mb"])
    factor = sum(_COST.get(registry.SYSTEMS[s].mechanics, 1.0) for s in systems)
    return factor * (R * R + R * T * spec.top_k / 64.0)


def _units(job: dict, systems: list[str]) -> list[list[str]]:
    """Zepp's variants (and ``zepp``) run in one unit: they share placement and routing; any
    other meta-system runs in one unit with its variants."""
    zepp_family = [s for s in systems if registry.SYSTEMS[s].placement == "zepp"]
    units: list[list[str]] = []
    grouped = set(zepp_family)
    for s in systems:
        if s not in grouped and registry.SYSTEMS[s].best_of:
            units.append([v for v in systems if v in registry.SYSTEMS[s].best_of and v not in grouped] + [s])
            grouped.update(units[-1])
    return units + [[s] for s in systems if s not in grouped] + ([zepp_family] if zepp_family else [])


def config_key(job: dict) -> str:
    return f"{job['cluster']} {job['nodes']}x{job.get('gpus_per_node', 4)} {job['model']} {job['budget_mb']:g}MB"


def assemble_row(job: dict, results: dict) -> dict:
    """One configuration's JSON row from its systems' results."""
    from zepp.sim.measured import measured_ms

    lat = {s: r["median_ms"] for s, r in results.items()}
    floor = {s: r["floor_ms"] for s, r in results.items()}
    variant = {s: r["variant"] for s, r in results.items() if r.get("variant")}
    return dict(cluster=job["cluster"], nodes=job["nodes"], gpus_per_node=job.get("gpus_per_node", 4),
                model=job["model"], budget_mb=job["budget_mb"], latency_ms=lat,
                lower_bound_ms=min(floor.values()) if floor else None,
                measured_ms=measured_ms(job["cluster"], job["nodes"], job["model"], job["budget_mb"]),
                variant=variant, run={k: job.get(k) for k in RUN_KEYS}, detail=results)


def _baselines(row: dict) -> dict[str, float]:
    return {s: v for s, v in row["latency_ms"].items() if s in registry.PAPER_BASELINES}


def speedup(row: dict) -> float | None:
    """Zepp over the fastest simulated baseline of the row."""
    base = _baselines(row)
    if "zepp" not in row["latency_ms"] or not base:
        return None
    return min(base.values()) / row["latency_ms"]["zepp"]


def model_error(row: dict) -> tuple[str | None, float | None]:
    """The fastest simulated baseline and the model's error on its measured cell (simulated /
    measured - 1), where the paper measured it."""
    base = _baselines(row)
    if not base:
        return None, None
    best = min(base, key=base.get)
    m = (row.get("measured_ms") or {}).get(best)
    return best, (base[best] / m - 1 if m else None)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return float(math.exp(np.mean(np.log(xs)))) if xs else None


def format_table(rows: list[dict], systems: list[str]) -> str:
    """Markdown table like PAPER.md section 4: ms per layer per system, Zepp, its speedup over
    the fastest simulated baseline, the model's error on that baseline's measured cell (how far
    to trust the row), and the lower bound."""
    shown = [s for s in systems if s in registry.PAPER_BASELINES] + [s for s in systems
                                                                    if s not in registry.PAPER_BASELINES]
    head = ["cluster", "nodes", "model", "MB"] + [f"{s} ms" for s in shown] + [
        "best baseline", "speedup", "model err on best", "LB ms"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        best, err = model_error(r)
        sp = speedup(r)
        cells = [r["cluster"], f"{r['nodes']}x{r.get('gpus_per_node', 4)}", r["model"], f"{r['budget_mb']:g}"]
        cells += [f"{r['latency_ms'][s]:.2f}" if s in r["latency_ms"] else "-" for s in shown]
        cells += [best or "-", f"{sp:.2f}x" if sp else "-", f"{err:+.0%}" if err is not None else "not measured",
                  f"{r['lower_bound_ms']:.2f}" if r["lower_bound_ms"] else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_json(path: Path, rows: list[dict]) -> None:
    """Rows so far as ``{"rows", "geomean_speedup"}`` (+ ``.detail.json`` with per-iteration
    figures), replaced atomically so the file is valid JSON after every configuration."""
    gm = geomean(speedup(r) for r in rows)
    payload = dict(rows=[{k: r[k] for k in ROW_KEYS + ("run",)} for r in rows], geomean_speedup=gm)
    for p, data in ((path, payload), (path.with_name(path.stem + ".detail.json"), rows)):
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, p)


def load_resume(path: Path) -> list[dict]:
    """The configurations a previous ``--json`` run stored (detail file when present)."""
    detail = path.with_name(path.stem + ".detail.json")
    src = detail if detail.is_file() else path
    try:
        data = json.loads(src.read_text())
    except (OSError, ValueError) as exc:
        raise ZeppInputError(f"--resume: cannot read {src} ({type(exc).__name__}); remove it or drop --resume") from None
    rows = data if isinstance(data, list) else data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "latency_ms" in r for r in rows):
        raise ZeppInputError(f"--resume: {src} is not a zepp bench --json file")
    return rows


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends the pool
    try:  # die with the parent even if it is killed hard (Linux)
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_bench(jobs: list[dict], workers: int = 1, progress: bool = True, on_row=None) -> list[dict]:
    """Simulate every configuration of ``jobs``; ``on_row(row)`` is called as each completes.
    Returns the rows in ``jobs`` order."""
    from tqdm import tqdm

    units = []
    for j in jobs:
        for systems in _units(j, j["systems"]):
            units.append(dict(key=config_key(j), job=j, systems=systems, weight=unit_weight(j, systems)))
    units.sort(key=lambda u: -u["weight"])
    pending = {config_key(j): {s for u in units if u["key"] == config_key(j) for s in u["systems"]} for j in jobs}
    results: dict[str, dict] = {k: {} for k in pending}
    rows: dict[str, dict] = {}
    bar = tqdm(total=round(sum(u["weight"] for u in units)), desc="zepp bench", unit="work", disable=not progress,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    weight = {(u["key"], tuple(u["systems"])): u["weight"] for u in units}
    done_configs = [0]

    def collect(res):
        results[res["key"]].update(res["systems"])
        bar.update(round(weight[(res["key"], tuple(res["unit"]))]))
        if set(results[res["key"]]) == pending[res["key"]]:
            job = next(j for j in jobs if config_key(j) == res["key"])
            rows[res["key"]] = assemble_row(job, {s: results[res["key"]][s] for s in job["systems"]})
            done_configs[0] += 1
            if on_row is not None:
                on_row(rows[res["key"]])
        bar.set_description_str(f"zepp bench ({done_configs[0]}/{len(jobs)} configurations)")

    bar.set_description_str(f"zepp bench (0/{len(jobs)} configurations)")
    old_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    try:
        if workers > 1 and len(units) > 1:
            import multiprocessing as mp

            pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker)
            try:
                for res in pool.imap_unordered(run_unit, units):
                    collect(res)
                pool.close()
            finally:
                pool.terminate()
                pool.join()
        else:
            for u in units:
                collect(run_unit(u))
    finally:
        signal.signal(signal.SIGTERM, old_term)
        bar.close()
    return [rows[config_key(j)] for j in jobs]


def _check_out_path(option: str, path: str | None) -> Path | None:
    """An output path whose folder exists and is writable, checked before any work."""
    if path is None:
        return None
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ZeppInputError(f"{option} {path!r}: is a directory; give a file name")
    if not folder.is_dir():
        raise ZeppInputError(f"{option} {path!r}: folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise ZeppInputError(f"{option} {path!r}: folder {str(folder)!r} is not writable")
    return p


def check_shapes(models, nodes, gpus_per_node: int, budgets) -> None:
    from zepp.model import model_preset

    for m in models:
        spec = model_preset(m)
        for n in nodes:
            if n < 1 or spec.num_experts % (n * gpus_per_node):
                raise ZeppInputError(f"--nodes {n}: {spec.num_experts} experts of {m} do not divide over "
                                     f"{n}x{gpus_per_node} GPUs; choose a node count that divides them")
        for b in budgets:
            spec.tokens_for_budget(b)


@click.command("bench")
@click.option("--traces", "traces_dir", type=click.Path(), default=None,
              help="Recorded traces: DIR/<model>/{pool,eval}.txt (the layout of ../shared/traces; default: "
                   "built-in synthetic traces).")
@click.option("--json", "json_path", type=click.Path(), default=None,
              help="Write every configuration as JSON, as each finishes (and FILE.detail.json).")
@click.option("--resume", is_flag=True, help="Skip the configurations the --json file already holds.")
@click.option("--plot", "plot_path", type=click.Path(), default=None, help="Bars per model, normalised (PNG).")
@click.option("--sweep", type=click.Choice(["weak"]), default=None,
              help="weak: K2, 2-32 nodes, 1 and 64 MB, A100 and H100 (a2av and Zepp).")
@click.option("--nodes", default=None, help="Comma-separated node counts (default 4,8,16).")
@click.option("--gpus-per-node", default=4, show_default=True, type=int, help="GPUs per node.")
@click.option("--models", default=None, help="Comma-separated model presets (default k2,qwen).")
@click.option("--budgets", default=None, help="Comma-separated budgets in MB per GPU (default 1,4,16).")
@click.option("--cluster", "clusters", default=None, help="Comma-separated cluster presets (default a100).")
@click.option("--systems", default=None,
              help=f"Comma-separated systems (default: the paper's baselines and zepp); any of "
                   f"{registry.help_list('sim')}, or 'all'. See zepp systems.")
@click.option("--iters", default=10, show_default=True, type=int, help="Timed iterations (median reported).")
@click.option("--warmup", default=5, show_default=True, type=int, help="Warm-up iterations.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--jobs", "workers", default=None, type=int, help="Worker processes (default: min(2, CPUs)).")
def bench(traces_dir, json_path, resume, plot_path, sweep, nodes, gpus_per_node, models, budgets, clusters, systems,
          iters, warmup, seed, workers):
    """Simulate Zepp and the baselines; print the table of PAPER.md section 4."""
    if iters < 1 or warmup < 0:
        raise ZeppInputError(f"--iters must be >= 1 and --warmup >= 0, got {iters} and {warmup}")
    if workers is not None and workers < 1:
        raise ZeppInputError(f"--jobs must be at least 1, got {workers}")
    if gpus_per_node < 1:
        raise ZeppInputError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    if sweep == "weak":
        d_nodes, d_models, d_budgets, d_clusters, d_systems = WEAK_NODES, ("k2",), WEAK_BUDGETS, ("a100", "h100"), \
            WEAK_SYSTEMS
    else:
        d_nodes, d_models, d_budgets, d_clusters = DEFAULT_NODES, DEFAULT_MODELS, DEFAULT_BUDGETS, ("a100",)
        d_systems = registry.PAPER_BASELINES + ("zepp",)
    nodes = _csv("nodes", nodes, int) or d_nodes
    models = _csv("models", models, str) or d_models
    budgets = _csv("budgets", budgets, float) or d_budgets
    clusters = _csv("cluster", clusters, str) or d_clusters
    names = registry.parse_systems(systems, "sim", default_all=None) if systems else list(d_systems)
    # a meta-system needs its variants simulated; they are reported too
    run_names = []
    for n in names:
        for v in registry.variants(n, "sim") + ((n,) if registry.SYSTEMS[n].best_of else ()):
            if v not in run_names:
                run_names.append(v)
    if traces_dir and not os.path.isdir(traces_dir):
        raise ZeppInputError(f"--traces {traces_dir!r}: not a directory; give the folder holding <model>/pool.txt "
                             f"and <model>/eval.txt")
    json_file = _check_out_path("--json", json_path)
    _check_out_path("--plot", plot_path)
    if resume and json_file is None:
        raise ZeppInputError("--resume needs --json FILE (the file to resume)")
    from zepp.sim.calibrate import calibrated
    from zepp.model import model_preset

    for c in clusters:
        calibrated(c, 1, gpus_per_node=gpus_per_node)
    check_shapes(models, nodes, gpus_per_node, budgets)
    for m in models:  # the traces exist (recorded or built-in) before any work starts
        traces_for(m, traces_dir, seed) if traces_dir else model_preset(m)
    jobs = [dict(cluster=c, nodes=n, gpus_per_node=gpus_per_node, model=m, budget_mb=b, systems=run_names,
                 iters=iters, warmup=warmup, seed=seed, traces=traces_dir)
            for c in clusters for n in nodes for m in models for b in budgets]
    stored: list[dict] = []
    if resume and json_file.is_file():
        old = {config_key(r): r for r in load_resume(json_file)}
        for j in jobs:
            r = old.get(config_key(j))
            if r is not None and r.get("run") == {k: j.get(k) for k in RUN_KEYS}:
                stored.append(r)
        skip = {config_key(r) for r in stored}
        jobs_left = [j for j in jobs if config_key(j) not in skip]
        click.echo(f"--resume: {len(stored)} of {len(jobs)} configurations already in {json_file}", err=True)
    else:
        jobs_left = jobs
    workers = workers or min(2, os.cpu_count() or 1)
    t0 = time.time()
    done = list(stored)

    def on_row(row):
        done.append(row)
        if json_file is not None:
            _write_json(json_file, done)

    new_rows = run_bench(jobs_left, workers, on_row=on_row) if jobs_left else []
    by_key = {config_key(r): r for r in stored + new_rows}
    rows = [by_key[config_key(j)] for j in jobs]
    if json_file is not None:
        _write_json(json_file, rows)
    gm = geomean(speedup(r) for r in rows)
    click.echo(format_table(rows, names))
    if gm:
        click.echo(f"geomean speedup of zepp over the fastest simulated baseline per row: {gm:.2f}x")
    n = len(rows)
    click.echo(f"({n} configuration{'s' if n != 1 else ''}, {iters} timed + {warmup} warm-up iterations, "
               f"traces: {traces_dir or 'built-in synthetic'}, {time.time() - t0:.0f} s)")
    if json_file is not None:
        click.echo(f"wrote {json_file} and {json_file.with_name(json_file.stem + '.detail.json')}")
    if plot_path:
        from zepp.sim.plots import bars

        bars(rows, [s for s in names if s in registry.PAPER_BASELINES] + ["zepp"], plot_path,
             title=f"simulated MoE layer latency ({traces_dir or 'synthetic traces'})")
        click.echo(f"wrote {plot_path}")


@click.command("timeline")
@click.option("--cluster", "cluster_name", default="a100", show_default=True)
@click.option("--nodes", default=4, show_default=True, type=int)
@click.option("--gpus-per-node", default=4, show_default=True, type=int)
@click.option("--model", default="k2", show_default=True)
@click.option("--budget-mb", default=4.0, show_default=True, type=float)
@click.option("--system", default="zepp", show_default=True,
              help=f"One of {registry.help_list('sim')} (zepp: its fastest variant here).")
@click.option("--compare", default=None,
              help="B: draw system B below --system on the same time axis; A,B: draw A and B (instead of --system).")
@click.option("--traces", "traces_dir", type=click.Path(), default=None)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--ranks", default=None, help="Comma-separated ranks to draw (default: the GPUs of node 0).")
@click.option("--out", "out_path", default="timeline.png", show_default=True, type=click.Path())
def timeline(cluster_name, nodes, gpus_per_node, model, budget_mb, system, compare, traces_dir, seed, ranks,
             out_path):
    """Draw one configuration's per-resource Gantt chart (PNG) for one system and one batch."""
    from zepp.sim.plots import gantt
    from zepp.sim.run import run_system

    if compare and "," in compare:
        names = registry.parse_systems(compare, "sim", option="--compare")
        if len(names) != 2:
            raise ZeppInputError(f"--compare {compare!r}: give two systems, A,B")
    else:
        names = [registry.parse_systems(system, "sim", option="--system")[0]]
        if compare:
            names.append(registry.parse_systems(compare, "sim", option="--compare")[0])
    out = _check_out_path("--out", out_path)
    if traces_dir and not os.path.isdir(traces_dir):
        raise ZeppInputError(f"--traces {traces_dir!r}: not a directory")
    check_shapes([model], [nodes], gpus_per_node, [budget_mb])
    R = nodes * gpus_per_node
    rk = list(_csv("ranks", ranks, int) or range(gpus_per_node))
    bad = [r for r in rk if not 0 <= r < R]
    if bad:
        raise ZeppInputError(f"--ranks {ranks}: rank(s) {bad} outside [0, {R}) of {nodes}x{gpus_per_node} GPUs")
    job = dict(cluster=cluster_name, nodes=nodes, gpus_per_node=gpus_per_node, model=model, budget_mb=budget_mb,
               iters=1, warmup=2, seed=seed, traces=traces_dir)
    cfg = make_config(job)
    drawn = []
    for name in names:
        res = run_system(name, cfg, keep_timeline=True)
        label = name if not res.variant else f"{name} ({res.variant})"
        drawn.append((label, res.timeline))
    title = f"{cluster_name} {nodes}x{gpus_per_node}, {model} {budget_mb:g} MB, third batch"
    gantt(drawn, str(out), ranks=rk, title=title)
    for label, tl in drawn:
        click.echo(f"{label}: {tl.latency * 1e3:.3f} ms")
    click.echo(f"wrote {out}")
