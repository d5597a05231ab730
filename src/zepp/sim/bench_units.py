"""The units of work of the simulated benchmark table, and their run (here or over worker processes).

A *unit* is one configuration and one system (Zepp's variants together, since they share their
routing; any other meta-system with its variants; systems that share a placement and a routing).
Units run largest first over the worker processes of ``zepp.sim.bench_pool``; the progress bar
advances by each unit's estimated cost (``Mechanics.sim_cost``), so its time estimate holds early on. A configuration's row is
assembled (``zepp.sim.bench_rows``) once each of its units is in. ``zepp`` is the best of its
variants; every system is planned and simulated per batch (``zepp.sim.run``), latency = max over
ranks, reported as the median of the timed iterations.
"""

from __future__ import annotations

import time

import numpy as np

from zepp import registry
from zepp.sim.bench_jobs import config_key, make_config
from zepp.sim.bench_rows import assemble_row
from zepp.sim.mechanics import mechanics


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
    other meta-system runs in one unit with its variants; the other systems that share a placement
    and a routing (and do not swap: their placement stays) run in one unit, so that their batches
    are routed once (``zepp.sim.run.Shared``)."""
    zepp_family = [s for s in systems if registry.SYSTEMS[s].ours]
    units: list[list[str]] = []
    grouped = set(zepp_family)
    for s in systems:
        if s not in grouped and registry.SYSTEMS[s].best_of:
            units.append([v for v in systems if v in registry.SYSTEMS[s].best_of and v not in grouped] + [s])
            grouped.update(units[-1])
    sharing: dict = {}
    for s in systems:
        if s not in grouped:
            row = registry.SYSTEMS[s]
            sharing.setdefault(s if row.swaps else (row.placement, row.routing), []).append(s)
    return units + list(sharing.values()) + ([zepp_family] if zepp_family else [])


def all_units(jobs: list[dict]) -> list[dict]:
    """Every unit of ``jobs``, largest estimated cost first."""
    units = [dict(key=config_key(j), job=j, systems=systems, weight=unit_weight(j, systems))
             for j in jobs for systems in units_of(j, j["systems"])]
    units.sort(key=lambda u: -u["weight"])
    return units


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


def run_bench(jobs: list[dict], workers: int = 1, progress: bool = True, on_row=None) -> list[dict]:
    """Simulate every configuration of ``jobs``; ``on_row(row)`` is called as each completes.
    Returns the rows in ``jobs`` order. SIGTERM ends the run (and its workers) like Ctrl-C
    (``zepp.launch.signals.launcher_signals``)."""
    from tqdm import tqdm

    from zepp.launch.signals import launcher_signals

    units = all_units(jobs)
    bar = tqdm(total=round(sum(u["weight"] for u in units)), desc="zepp bench", unit="work", disable=not progress,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    rows = _Rows(jobs, units, bar, on_row)
    try:
        with launcher_signals():
            if workers > 1 and len(units) > 1:
                from zepp.sim.bench_pool import run_pool

                run_pool(units, workers, rows.add)
            else:
                for u in units:
                    rows.add(run_unit(u))
    finally:
        bar.close()
    return [rows.rows[config_key(j)] for j in jobs]
