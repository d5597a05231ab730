"""``zepp bench``: the simulated MoE-layer benchmark of PAPER.md section 4.

The command checks its options, builds the jobs and prints the table; the table itself is
``zepp.sim.bench_table`` (its run, JSON file and resume), ``zepp.sim.bench_jobs`` (configurations),
``zepp.sim.bench_units`` (units of work), ``zepp.sim.bench_pool`` (worker processes) and
``zepp.sim.bench_rows`` (rows, speedups, model error). Ctrl-C, SIGTERM or SIGKILL ends every worker.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from zepp import registry
from zepp.errors import ZeppInputError
from zepp.traces.schedules import DEFAULT_SCHEDULE, SCHEDULES, check_schedule


def schedule_option(f):
    """``--schedule``, with the same help wherever it appears (``SCHEDULES``)."""
    return click.option("--schedule", default=DEFAULT_SCHEDULE, show_default=True,
                        help="Demand schedule: " + "; ".join(f"{k}: {v}" for k, v in SCHEDULES.items()) + ".")(f)


def csv_option(option: str, value, cast) -> tuple | None:
    """A comma-separated option's values (``None`` when not given); one error naming the option."""
    if value is None:
        return None
    parts = [v.strip() for v in str(value).split(",")]
    if parts == [""]:
        raise ZeppInputError(f"{option}: empty list; give one or more comma-separated values")
    if "" in parts:
        raise ZeppInputError(f"{option} {value!r}: an empty entry between commas; remove the extra comma")
    try:
        out = tuple(cast(v) for v in parts)
    except ValueError:
        raise ZeppInputError(f"{option}: expected a comma-separated list, got {value!r}") from None
    twice = [p for i, (p, v) in enumerate(zip(parts, out)) if v in out[:i]]
    if twice:
        raise ZeppInputError(f"{option} {value!r}: {twice[0]} is named twice; name each value once")
    return out


def _jobs(sweep, nodes, gpus_per_node, models, budgets, clusters, systems, iters, warmup, seed, traces_dir,
          schedule=DEFAULT_SCHEDULE):
    """``(names shown, jobs)`` from the options, every option checked before any work."""
    from zepp.launch.checks import check_sim_numbers
    from zepp.sim import bench_jobs
    from zepp.sim.calibrate import calibrated

    check_schedule(schedule)
    check_sim_numbers(gpus_per_node=gpus_per_node, iters=iters, warmup=warmup, seed=seed)
    d = bench_jobs.SWEEPS[sweep]
    nodes = csv_option("--nodes", nodes, int) or d["nodes"]
    models = csv_option("--models", models, str) or d["models"]
    budgets = csv_option("--budgets", budgets, float) or d["budgets"]
    for n in nodes:
        check_sim_numbers(nodes=n)
    for b in budgets:
        check_sim_numbers(budget_mb=b)
    clusters = csv_option("--cluster", clusters, str) or d["clusters"]
    names = registry.parse_systems(systems, "sim", default_all=None) if systems else list(d["systems"])
    for c in clusters:
        calibrated(c, 1, gpus_per_node=gpus_per_node)
    bench_jobs.check_shapes(models, nodes, gpus_per_node, budgets)
    bench_jobs.check_traces(traces_dir, models, seed)
    jobs = bench_jobs.make_jobs(clusters, nodes, gpus_per_node, models, budgets, bench_jobs.systems_to_run(names),
                                iters, warmup, seed, traces_dir, schedule)
    return names, jobs


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
@click.option("--measured", "measured_path", type=click.Path(), default=None,
              help='Your own measured ms per layer, JSON {"rows": [{"cluster", "nodes", "gpus_per_node", "model", '
                   '"budget_mb", "ms": {system: ms}}]}: the table gives the model\'s error on Zepp\'s row too.')
@schedule_option
def bench(traces_dir, json_path, resume, plot_path, sweep, nodes, gpus_per_node, models, budgets, clusters, systems,
          iters, warmup, seed, workers, measured_path, schedule):
    """Simulate Zepp and the baselines; print the table of PAPER.md section 4."""
    from zepp.launch.checks import check_number
    from zepp.sim import bench_table as table
    from zepp.sim.bench_jobs import config_key

    if workers is not None:
        check_number("--jobs", workers, 1, 1024, integer=True)
    outputs = _outputs(json_path, plot_path)
    json_file = Path(json_path) if json_path is not None else None
    if resume and json_file is None:
        raise ZeppInputError("--resume needs --json FILE (the file to resume)")
    names, jobs = _jobs(sweep, nodes, gpus_per_node, models, budgets, clusters, systems, iters, warmup, seed,
                        traces_dir, schedule)
    measured = _read_measured(measured_path)
    baselines = [s for s in names if s in registry.PAPER_BASELINES]
    if plot_path and not baselines:
        raise ZeppInputError(f"--plot draws each system against the fastest of the paper's baselines: add one of "
                             f"{', '.join(registry.PAPER_BASELINES)} to --systems")
    _claim(outputs, traces_dir, measured_path)
    stored = []
    if resume and json_file.is_file():
        stored = table.stored_rows(jobs, json_file)
        keys = {config_key(j) for j in jobs}
        redo = sum(config_key(r) in keys for r in table.load_resume(json_file)) - len(stored)
        click.echo(f"--resume: {len(stored)} of {len(jobs)} configurations already in {json_file}"
                   + (f"; {redo} stored with other run settings (systems, iters, warmup, seed, traces) are "
                      f"simulated again and replaced" if redo else ""), err=True)
    t0 = time.time()
    rows = table.run_table(jobs, stored, workers or min(2, os.cpu_count() or 1), json_file)
    how = f"{iters} timed + {warmup} warm-up iterations, traces: {traces_dir or 'built-in synthetic'}, "
    _report(_with_measured(rows, measured, measured_path), names, how + f"{time.time() - t0:.0f} s", json_file)
    if plot_path:
        from zepp.sim.plots import bars

        bars(rows, baselines + [s for s in names if s == "zepp"], plot_path,
             title=f"simulated MoE layer latency ({traces_dir or 'synthetic traces'})")
        click.echo(f"wrote {plot_path}")


def _read_measured(path):
    """``--measured``: the user's figures (``zepp.sim.user_measured``), checked before any work."""
    if path is None:
        return None
    from zepp.sim.user_measured import read_measured

    return read_measured(path)


def _with_measured(rows: list[dict], measured, path) -> list[dict]:
    """The rows to print: with the user's measured figures where ``--measured`` gave some, and a
    note on stderr naming the file's configurations this run did not simulate."""
    if measured is None:
        return rows
    from zepp.sim.user_measured import apply_measured

    shown, unused = apply_measured(rows, measured)
    if unused:
        click.echo(f"--measured: {len(unused)} configuration(s) of {path} not in this run: "
                   + "; ".join(str(k) for k in unused[:4]) + (" ..." if len(unused) > 4 else ""), err=True)
    return shown


def _outputs(json_path, plot_path) -> list:
    """``--json``, its ``.detail.json`` and ``--plot``, each path checked (``zepp.outputs``)."""
    from zepp.launch.checks import plot_suffixes
    from zepp.outputs import Place, check_output_file
    from zepp.sim.bench_table import detail_path

    out = []
    if json_path is not None:
        check_output_file(json_path, "--json")  # before its .detail.json's name is derived from it
        detail = Place("--json (its .detail.json)", str(detail_path(Path(json_path))))
        check_output_file(detail.path, detail.option)
        out += [Place("--json", json_path), detail]
    if plot_path is not None:
        out.append(Place("--plot", plot_path, suffixes=plot_suffixes()))
        check_output_file(plot_path, "--plot", plot_suffixes())
    return out


def _claim(outputs: list, traces_dir, measured_path) -> None:
    """The outputs held for this run, none a file of ``--traces``, the ``--measured`` file or another output."""
    from zepp.outputs import Place, claim_outputs
    from zepp.sim.bench_jobs import TRACE_FILES

    claim_outputs(outputs, [Place("--traces", traces_dir, folder=True, names=TRACE_FILES),
                            Place("--measured", measured_path)])


def _report(rows: list[dict], names: list[str], how: str, json_file: Path | None) -> None:
    """The table, the geomean speedup, how the rows were made and the files written."""
    from zepp.sim.bench_jobs import config_key
    from zepp.sim.bench_rows import format_table, geomean, speedup
    from zepp.sim.bench_table import detail_path

    click.echo(format_table(rows, names))
    for r in rows:
        if r.get("topic_mix"):
            click.echo(f"{config_key(r)}: {r['topic_mix']['describe']}")
    gm = geomean(speedup(r) for r in rows)
    if gm:
        click.echo(f"geomean speedup of zepp over the fastest simulated baseline per row: {gm:.2f}x "
                   "(Zepp's fastest zepp* system over the fastest other system of the run)")
    gm_paper = geomean(speedup(r, paper=True) for r in rows)
    if gm_paper:
        click.echo(f"geomean speedup of zepp over the fastest of the paper's seven baselines per row: {gm_paper:.2f}x")
    click.echo(f"({len(rows)} configuration{'s' if len(rows) != 1 else ''}, {how})")
    if json_file is not None:
        click.echo(f"wrote {json_file} and {detail_path(json_file)}")
