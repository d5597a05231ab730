"""``zepp timeline``: one configuration of the benchmark table (``zepp.sim.bench_jobs``) drawn as
a per-resource Gantt chart (``zepp.sim.plots.gantt``) for one or two systems and one batch."""

from __future__ import annotations

import click
import numpy as np

from zepp import registry
from zepp.cli.bench import csv_option, schedule_option
from zepp.errors import ZeppInputError
from zepp.traces.schedules import DEFAULT_SCHEDULE


def _systems(system: str, compare: str | None) -> list[str]:
    """The systems to draw: ``--system`` (and ``--compare B`` below it), or ``--compare A,B``."""
    if compare and "," in compare:
        names = registry.parse_systems(compare, "sim", option="--compare")
        if len(names) != 2:
            raise ZeppInputError(f"--compare {compare!r}: give two systems, A,B")
        return names
    names = [registry.parse_systems(system, "sim", option="--system")[0]]
    if compare:
        names.append(registry.parse_systems(compare, "sim", option="--compare")[0])
    return names


def _ranks(ranks: str | None, nodes: int, gpus_per_node: int) -> list[int]:
    """The ranks to draw (default: the GPUs of node 0), each inside the cluster."""
    R = nodes * gpus_per_node
    rk = list(csv_option("--ranks", ranks, int) or range(gpus_per_node))
    bad = [r for r in rk if not 0 <= r < R]
    if bad:
        raise ZeppInputError(f"--ranks {ranks}: rank(s) {bad} outside [0, {R}) of {nodes}x{gpus_per_node} GPUs")
    return rk


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
@click.option("--ranks", default=None, help="Comma-separated ranks to draw (default: the GPUs of node 0; under a "
                                           "drift schedule those of the node with the most weight copies).")
@click.option("--out", "out_path", default="timeline.png", show_default=True, type=click.Path())
@schedule_option
def timeline(cluster_name, nodes, gpus_per_node, model, budget_mb, system, compare, traces_dir, seed, ranks,
             out_path, schedule):
    """Draw one configuration's per-resource Gantt chart (PNG) for one system and one batch."""
    from zepp.launch.checks import check_sim_numbers, plot_suffixes
    from zepp.outputs import Place, check_output_file, claim_outputs
    from zepp.sim import bench_jobs as jobs
    from zepp.sim.calibrate import calibrated
    from zepp.sim.critical_path import format_path
    from zepp.sim.plots import gantt
    from zepp.sim.run import run_system
    from zepp.traces.schedules import check_schedule

    check_schedule(schedule)
    check_sim_numbers(nodes=nodes, gpus_per_node=gpus_per_node, budget_mb=budget_mb, seed=seed)
    names = _systems(system, compare)
    check_output_file(out_path, "--out", plot_suffixes())
    calibrated(cluster_name, 1, gpus_per_node=gpus_per_node)
    jobs.check_shapes([model], [nodes], gpus_per_node, [budget_mb])
    jobs.check_traces(traces_dir, [model], seed)
    rk = _ranks(ranks, nodes, gpus_per_node)
    claim_outputs([Place("--out", out_path, suffixes=plot_suffixes())],
                  [Place("--traces", traces_dir, folder=True, names=jobs.TRACE_FILES)])
    # under drift the second batch: the first whose swaps are planned from a batch of the schedule
    warmup = 2 if schedule == DEFAULT_SCHEDULE else 1
    cfg, wl = jobs.make_config(jobs.make_jobs([cluster_name], [nodes], gpus_per_node, [model], [budget_mb], names,
                                              iters=1, warmup=warmup, seed=seed, traces=traces_dir,
                                              schedule=schedule)[0], with_workload=True)
    drawn = []
    for name in names:
        res = run_system(name, cfg, keep_timeline=True)
        drawn.append((name if not res.variant else f"{name} ({res.variant})", res.timeline))
    if wl is not None and ranks is None:
        rk = [_copy_node(drawn, nodes, gpus_per_node) * gpus_per_node + i for i in range(gpus_per_node)]
    which = "third batch" if wl is None else f"second batch, {schedule} demand"
    gantt(drawn, out_path, ranks=rk, title=f"{cluster_name} {nodes}x{gpus_per_node}, {model} {budget_mb:g} MB, {which}")
    for label, tl in drawn:
        links = [r[:3] for r, k in zip(tl.resource, tl.kind) if k == "copy"]
        copies = f", weight copies: {links.count('nvl')} on NVLink, {links.count('nic')} on NICs" if links else ""
        click.echo(f"{label}: {tl.latency * 1e3:.3f} ms{copies}; critical path: {format_path(tl.path)}")
    if wl is not None:
        click.echo(f"{wl.describe()}; drawn: batch {warmup}, topic mix {wl.mix_names(warmup)}, ranks {rk}")
    click.echo(f"wrote {out_path}")


def _copy_node(drawn, nodes: int, gpus_per_node: int) -> int:
    """The node whose GPUs receive the most weight copies in the drawn timelines (0 if none)."""
    from zepp.sim.plots import rank_of

    dst = [rank_of(r) // gpus_per_node for _, tl in drawn for r, k in zip(tl.resource, tl.kind) if k == "copy"]
    return int(np.argmax(np.bincount(dst, minlength=nodes))) if dst else 0
