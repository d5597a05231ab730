"""The simulated MoE-layer benchmark table of PAPER.md section 4 (``zepp bench``; ``zepp timeline``
draws one of its configurations).

A *job* is one configuration (cluster, nodes, GPUs per node, model, budget) with the systems to
run, the iterations, the seed and the traces: a placement history and ``warmup + iters``
evaluation batches (built-in synthetic traces, or ``DIR/<model>/`` recorded ones), every
system planned and simulated per batch (``zepp.sim.run``), latency = max over ranks, reported
as the median of the timed iterations. ``zepp`` is the best of its variants. The lower bound
of a configuration is the smallest physical floor of any system.

Work is split into *units* (one configuration and one system; Zepp's variants together, since
they share their routing), run largest first over a pool of worker processes; the progress bar
advances by each unit's estimated cost (``Mechanics.sim_cost``), so its time estimate holds
early on. Every finished configuration is written to the JSON file at once (valid JSON after
each), and a resumed run skips the configurations that file already holds with the same run
settings (``RUN_KEYS``).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import numpy as np

from zepp import registry
from zepp.errors import ZeppInputError
from zepp.sim.mechanics import mechanics
from zepp.traces.schedules import DEFAULT_SCHEDULE

# the configurations a run covers by default, per --sweep (None: the paper's section-4 table)
SWEEPS = {
    None: dict(nodes=(4, 8, 16), models=("k2", "qwen"), budgets=(1.0, 4.0, 16.0), clusters=("a100",),
               systems=registry.PAPER_BASELINES + ("zepp",)),
    "weak": dict(nodes=(2, 4, 8, 16, 32), models=("k2",), budgets=(1.0, 64.0), clusters=("a100", "h100"),
                 systems=("a2av", "zepp")),
}
ROW_KEYS = ("cluster", "nodes", "gpus_per_node", "model", "budget_mb", "latency_ms", "lower_bound_ms",
            "measured_ms", "variant")
# what must match for a resumed run to reuse a stored configuration
RUN_KEYS = ("systems", "iters", "warmup", "seed", "traces")


# ----------------------------------------------------------------------------- configurations


def traces_for(model: str, traces_dir: str | None, seed: int):
    """``(pool, eval)`` Traces: ``DIR/<model>/`` when ``traces_dir`` is given, else built-in."""
    if traces_dir:
        from zepp.traces import load_model_traces

        return load_model_traces(traces_dir, model)
    from zepp.traces.synthetic import synthetic_traces

    return synthetic_traces(model, seed)


def check_traces(traces_dir: str | None, models, seed: int) -> None:
    """The traces of every model exist (recorded under ``traces_dir``, or built-in) before any
    work starts; one ``ZeppInputError`` naming what is missing otherwise."""
    from zepp.model import model_preset

    if traces_dir and not os.path.isdir(traces_dir):
        raise ZeppInputError(f"--traces {traces_dir!r}: not a directory; give the folder holding <model>/pool.txt "
                             f"and <model>/eval.txt")
    for m in models:
        traces_for(m, traces_dir, seed) if traces_dir else model_preset(m)


def check_shapes(models, nodes, gpus_per_node: int, budgets) -> None:
    """Every model's experts divide over every node count's GPUs and every budget holds a token."""
    from zepp.model import model_preset

    for m in models:
        spec = model_preset(m)
        for n in nodes:
            if n < 1 or spec.num_experts % (n * gpus_per_node):
                raise ZeppInputError(f"--nodes {n}: {spec.num_experts} experts of {m} do not divide over "
                                     f"{n}x{gpus_per_node} GPUs; choose a node count that divides them")
        for b in budgets:
            spec.tokens_for_budget(b)


def systems_to_run(names) -> list[str]:
    """``names`` with every meta-system's variants before it (a meta-system needs its variants
    simulated; they are reported too), each once, in order."""
    run_names: list[str] = []
    for n in names:
        for v in registry.variants(n, "sim") + ((n,) if registry.SYSTEMS[n].best_of else ()):
            if v not in run_names:
                run_names.append(v)
    return run_names


def make_jobs(clusters, nodes, gpus_per_node: int, models, budgets, systems, iters: int, warmup: int, seed: int,
              traces: str | None, schedule: str = DEFAULT_SCHEDULE) -> list[dict]:
    """One job per (cluster, nodes, model, budget), in that nesting order. A ``schedule``
    other than the default is stored in the job (the default's jobs stay as they were)."""
    extra = {} if schedule == DEFAULT_SCHEDULE else dict(schedule=schedule)
    return [dict(cluster=c, nodes=n, gpus_per_node=gpus_per_node, model=m, budget_mb=b, systems=systems,
                 iters=iters, warmup=warmup, seed=seed, traces=traces, **extra)
            for c in clusters for n in nodes for m in models for b in budgets]


def config_key(job: dict) -> str:
    sched = job.get("schedule", DEFAULT_SCHEDULE)
    return (f"{job['cluster']} {job['nodes']}x{job.get('gpus_per_node', 4)} {job['model']} {job['budget_mb']:g}MB"
            + ("" if sched == DEFAULT_SCHEDULE else f" {sched}"))


def job_workload(job: dict, pool, ev, ranks: int, tokens_per_rank: int):
    """The ``zepp.traces.DriftWorkload`` of a job with a drift schedule: topics of the recorded
    windows (``pool``, ``ev``), or of the preset's built-in generator."""
    from zepp.traces import drift_workload
    from zepp.traces.topics import find_topics, synthetic_topics

    topics = find_topics(pool, ev) if job.get("traces") else synthetic_topics(job["model"], job["seed"])
    return drift_workload(topics, job["schedule"], ranks, tokens_per_rank, job["warmup"] + job["iters"], job["seed"],
                          job.get("period"))


def make_config(job: dict, with_workload: bool = False):
    """The ``zepp.sim.run.Config`` of one configuration ``job`` (``with_workload``: and its
    ``DriftWorkload``, ``None`` under the default schedule)."""
    from zepp.model import model_preset
    from zepp.sim.calibrate import calibrated
    from zepp.sim.run import Config
    from zepp.traces import node_demand, sample_batches

    cl, net = calibrated(job["cluster"], job["nodes"], gpus_per_node=job.get("gpus_per_node", 4))
    spec = model_preset(job["model"])
    pool, ev = traces_for(job["model"], job.get("traces"), job["seed"])
    T = spec.tokens_for_budget(job["budget_mb"])
    wl = None
    if job.get("schedule", DEFAULT_SCHEDULE) == DEFAULT_SCHEDULE:
        hist = node_demand(pool, cl.nodes, cl.gpus_per_node)
        batches = sample_batches(ev, cl.ranks, T, job["warmup"] + job["iters"], job["seed"])
    else:
        wl = job_workload(job, pool, ev, cl.ranks, T)
        hist, batches = wl.hist(cl.nodes, cl.gpus_per_node), wl.batches
    cfg = Config(cl, spec, net, hist, batches, warmup=job["warmup"])
    return (cfg, wl) if with_workload else cfg


# ----------------------------------------------------------------------------- units of work


def _figures(res) -> dict:
    """One system's figures (ms) from its ``zepp.sim.run.SystemResult``."""
    return dict(iters_ms=[x * 1e3 for x in res.latencies], median_ms=res.median * 1e3,
                planning_ms=float(np.median(res.planning)) * 1e3, floor_ms=float(np.median(res.lower_bound)) * 1e3,
                swapped_slots=int(np.sum(res.swapped_slots)), variant=None,
                granularity=res.granularity if any(g is not None for g in res.granularity) else None)


def run_unit(unit: dict) -> dict:
    """Simulate the systems of one unit (a configuration and one or more systems)."""
    from zepp.sim.run import Shared, run_system

    t0 = time.process_time()
    cfg, wl = make_config(unit["job"], with_workload=True)
    shared = Shared()
    out = {}
    plain = [s for s in unit["systems"] if not registry.SYSTEMS[s].best_of]
    for s in plain:
        out[s] = _figures(run_system(s, cfg, shared=shared))
    for s in unit["systems"]:
        if s not in plain:  # a meta-system: the variant zepp.sim.run.run_system picks
            best = registry.pick_variant(s, cfg.batches.shape[2], {v: out[v]["median_ms"] for v in plain})
            out[s] = dict(out[best], variant=best)
    res = dict(key=unit["key"], unit=list(unit["systems"]), systems=out, cpu_s=time.process_time() - t0)
    if wl is not None:
        res["schedule"] = dict(wl.report(cfg.warmup), describe=wl.describe(cfg.warmup))
    return res


def unit_weight(job: dict, systems: list[str]) -> float:
    """Estimated relative cost of simulating ``systems`` on ``job``: messages grow with the
    square of the rank count, rows with ranks x tokens x k, times each system's mechanics'
    ``sim_cost`` (a meta-system costs nothing of its own)."""
    from zepp.model import model_preset

    spec = model_preset(job["model"])
    R = job["nodes"] * job.get("gpus_per_node", 4)
    T = spec.tokens_for_budget(job["budget_mb"])
    factor = sum(0.0 if registry.SYSTEMS[s].best_of else mechanics(registry.SYSTEMS[s].mechanics).sim_cost
                 for s in systems)
    return factor * (R * R + R * T * spec.top_k / 64.0)


def units_of(job: dict, systems: list[str]) -> list[list[str]]:
    """Zepp's variants (and ``zepp``) run in one unit: they share placement and routing; any
    other meta-system runs in one unit with its variants."""
    zepp_family = [s for s in systems if registry.SYSTEMS[s].ours]
    units: list[list[str]] = []
    grouped = set(zepp_family)
    for s in systems:
        if s not in grouped and registry.SYSTEMS[s].best_of:
            units.append([v for v in systems if v in registry.SYSTEMS[s].best_of and v not in grouped] + [s])
            grouped.update(units[-1])
    return units + [[s] for s in systems if s not in grouped] + ([zepp_family] if zepp_family else [])


def all_units(jobs: list[dict]) -> list[dict]:
    """Every unit of ``jobs``, largest estimated cost first."""
    units = [dict(key=config_key(j), job=j, systems=systems, weight=unit_weight(j, systems))
             for j in jobs for systems in units_of(j, j["systems"])]
    units.sort(key=lambda u: -u["weight"])
    return units


# ----------------------------------------------------------------------------- rows


def assemble_row(job: dict, results: dict, schedule: dict | None = None) -> dict:
    """One configuration's JSON row from its systems' results (``schedule``: a drift schedule's
    report, its timed batches' topic mix, stored as ``topic_mix`` beside the schedule's name;
    the default schedule's rows hold neither)."""
    from zepp.sim.measured import measured_ms

    lat = {s: r["median_ms"] for s, r in results.items()}
    floor = {s: r["floor_ms"] for s, r in results.items()}
    variant = {s: r["variant"] for s, r in results.items() if r.get("variant")}
    extra = {} if schedule is None else dict(schedule=job["schedule"], topic_mix=schedule)
    return dict(**extra, cluster=job["cluster"], nodes=job["nodes"], gpus_per_node=job.get("gpus_per_node", 4),
                model=job["model"], budget_mb=job["budget_mb"], latency_ms=lat,
                lower_bound_ms=min(floor.values()) if floor else None,
                measured_ms=measured_ms(job["cluster"], job["nodes"], job["model"], job["budget_mb"]),
                variant=variant, run={k: job.get(k) for k in RUN_KEYS}, detail=results)


def is_zepp(name: str) -> bool:
    """Zepp or one of its variants (a registry row marked ``ours``)."""
    s = registry.SYSTEMS.get(name)
    return s is not None and s.ours


def _baselines(row: dict, paper: bool = False) -> dict[str, float]:
    """The row's other systems than Zepp's (``paper``: only the paper's seven baselines)."""
    return {s: v for s, v in row["latency_ms"].items()
            if (s in registry.PAPER_BASELINES if paper else not is_zepp(s))}


def zepp_best(row: dict) -> str | None:
    """The fastest ``zepp*`` system of the row (``zepp`` when only it and its variants ran)."""
    z = {s: v for s, v in row["latency_ms"].items() if is_zepp(s)}
    return min(z, key=z.get) if z else None


def best_baseline(row: dict, paper: bool = False) -> str | None:
    """The fastest system of the row that is not Zepp's (``paper``: of the paper's seven)."""
    base = _baselines(row, paper)
    return min(base, key=base.get) if base else None


def speedup(row: dict, paper: bool = False) -> float | None:
    """Zepp's fastest system over the fastest other system of the row; ``paper``: ``zepp`` over
    the fastest of the paper's seven baselines (PAPER.md section 4's figure)."""
    best = best_baseline(row, paper)
    z = "zepp" if paper else zepp_best(row)
    if best is None or z not in row["latency_ms"]:
        return None
    return row["latency_ms"][best] / row["latency_ms"][z]


def model_error(row: dict) -> tuple[str | None, float | None]:
    """The fastest simulated baseline (``best_baseline``) and the model's error on its measured
    cell (simulated / measured - 1), where the paper measured it."""
    best = best_baseline(row)
    if best is None:
        return None, None
    m = (row.get("measured_ms") or {}).get(best)
    return best, (row["latency_ms"][best] / m - 1 if m else None)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return float(math.exp(np.mean(np.log(xs)))) if xs else None


def format_table(rows: list[dict], systems: list[str]) -> str:
    """Markdown table like PAPER.md section 4: ms per layer per system, the fastest system that is
    not Zepp's (any system of the run), Zepp's speedup over it (its fastest ``zepp*`` system,
    named when it is not ``zepp``), the model's error on that baseline's measured cell (how far
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
        z = zepp_best(r)
        sp_text = (f"{sp:.2f}x" + ("" if z == "zepp" else f" ({z})")) if sp else "-"
        cells += [best or "-", sp_text, f"{err:+.0%}" if err is not None else "not measured",
                  f"{r['lower_bound_ms']:.2f}" if r["lower_bound_ms"] else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the JSON file and resume


def detail_path(path: Path) -> Path:
    """``FILE.detail.json`` beside ``FILE.json``: every row with its per-iteration figures."""
    return path.with_name(path.stem + ".detail.json")


def write_json(path: Path, rows: list[dict]) -> None:
    """Rows so far as ``{"rows", "geomean_speedup"}`` (+ ``detail_path`` with per-iteration
    figures), replaced atomically so the file is valid JSON after every configuration."""
    gm = geomean(speedup(r) for r in rows)
    payload = dict(rows=[dict({k: r[k] for k in ROW_KEYS + ("run", "schedule", "topic_mix") if k in r},
                              best_baseline=best_baseline(r), zepp_best=zepp_best(r)) for r in rows],
                   geomean_speedup=gm, geomean_speedup_paper=geomean(speedup(r, paper=True) for r in rows))
    for p, data in ((path, payload), (detail_path(path), rows)):
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, p)


def load_resume(path: Path) -> list[dict]:
    """The configurations a previous run stored in ``path`` (its detail file when present); every
    row of both files checked first (``zepp.sim.resume_rows``)."""
    detail = detail_path(path)
    rows = _read_rows(path)
    return _read_rows(detail) if detail.is_file() else rows


def _read_rows(src: Path) -> list[dict]:
    from zepp.sim.resume_rows import check_rows

    try:
        data = json.loads(src.read_text())
    except (OSError, ValueError) as exc:
        raise ZeppInputError(f"--resume: cannot read {src} ({type(exc).__name__}); remove it or drop --resume") \
            from None
    rows = data if isinstance(data, list) else data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ZeppInputError(f"--resume: {src} is not a zepp bench --json file (no list of rows); remove it or "
                             f"drop --resume")
    return check_rows(rows, src, ROW_KEYS, RUN_KEYS)


def stored_rows(jobs: list[dict], path: Path) -> list[dict]:
    """The rows ``path`` already holds for ``jobs`` with the same run settings (``RUN_KEYS``)."""
    old = {config_key(r): r for r in load_resume(path)}
    stored = []
    for j in jobs:
        r = old.get(config_key(j))
        if r is not None and r.get("run") == {k: j.get(k) for k in RUN_KEYS}:
            stored.append(r)
    return stored


def run_table(jobs: list[dict], stored: list[dict], workers: int, json_file: Path | None,
              progress: bool = True) -> list[dict]:
    """The rows of ``jobs`` in their order: ``stored`` ones as they are, the others simulated
    (``run_bench``); with ``json_file``, every row written as it completes and all at the end."""
    skip = {config_key(r) for r in stored}
    jobs_left = [j for j in jobs if config_key(j) not in skip]
    done = list(stored)

    def on_row(row):
        done.append(row)
        if json_file is not None:
            write_json(json_file, done)

    new_rows = run_bench(jobs_left, workers, progress, on_row=on_row) if jobs_left else []
    by_key = {config_key(r): r for r in stored + new_rows}
    rows = [by_key[config_key(j)] for j in jobs]
    if json_file is not None:
        write_json(json_file, rows)
    return rows


# ----------------------------------------------------------------------------- the worker pool


class _Rows:
    """Gathers finished units: a configuration's row is assembled (and ``on_row`` called) once
    each of its systems is in; the progress bar advances by each unit's weight."""

    def __init__(self, jobs: list[dict], units: list[dict], bar, on_row):
        self.jobs: dict[str, dict] = {}
        for j in jobs:
            self.jobs.setdefault(config_key(j), j)
        self.pending = {k: {s for u in units if u["key"] == k for s in u["systems"]} for k in self.jobs}
        self.results: dict[str, dict] = {k: {} for k in self.pending}
        self.schedules: dict[str, dict] = {}
        self.rows: dict[str, dict] = {}
        self.weight = {(u["key"], tuple(u["systems"])): u["weight"] for u in units}
        self.bar, self.on_row, self.n_jobs = bar, on_row, len(jobs)
        self._describe()

    def _describe(self) -> None:
        self.bar.set_description_str(f"zepp bench ({len(self.rows)}/{self.n_jobs} configurations)")

    def add(self, res: dict) -> None:
        key = res["key"]
        self.results[key].update(res["systems"])
        if "schedule" in res:
            self.schedules[key] = res["schedule"]
        self.bar.update(round(self.weight[(key, tuple(res["unit"]))]))
        if set(self.results[key]) == self.pending[key]:
            job = self.jobs[key]
            self.rows[key] = assemble_row(job, {s: self.results[key][s] for s in job["systems"]},
                                          self.schedules.get(key))
            if self.on_row is not None:
                self.on_row(self.rows[key])
        self._describe()


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends the pool
    try:  # die with the parent even if it is killed hard (Linux)
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _run_units(units: list[dict], workers: int, on_result) -> None:
    """``on_result(run_unit(u))`` for every unit, as each finishes: over a spawn pool of
    ``workers`` processes (ended on any exit), or in this process."""
    if workers > 1 and len(units) > 1:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker)
        try:
            for res in pool.imap_unordered(run_unit, units):
                on_result(res)
            pool.close()
        finally:
            pool.terminate()
            pool.join()
    else:
        for u in units:
            on_result(run_unit(u))


def run_bench(jobs: list[dict], workers: int = 1, progress: bool = True, on_row=None) -> list[dict]:
    """Simulate every configuration of ``jobs``; ``on_row(row)`` is called as each completes.
    Returns the rows in ``jobs`` order. SIGTERM ends the run (and its workers) like Ctrl-C."""
    from tqdm import tqdm

    units = all_units(jobs)
    bar = tqdm(total=round(sum(u["weight"] for u in units)), desc="zepp bench", unit="work", disable=not progress,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    rows = _Rows(jobs, units, bar, on_row)
    old_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    try:
        _run_units(units, workers, rows.add)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        bar.close()
    return [rows.rows[config_key(j)] for j in jobs]
