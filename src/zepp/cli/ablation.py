"""``zepp ablation``: the paper's ablation (section 6.5) under drifting demand; the arms and the
run are ``zepp.sim.ablation``."""

from __future__ import annotations

import time

import click

from zepp.cli.bench import csv_option
from zepp.traces.schedules import DEFAULT_PERIOD, SCHEDULES, check_schedule


def _check(cluster, nodes, gpus_per_node, model, budget_mb, traces_dir, schedules, iters, period, seed,
           json_path, plot_path) -> tuple:
    """Every option checked before any work: the schedules, the numbers, the shapes, the paths."""
    from zepp.launch.checks import check_number, check_sim_numbers, plot_suffixes
    from zepp.outputs import Place, check_output_file, claim_outputs
    from zepp.sim import bench_jobs as jobs
    from zepp.sim.calibrate import calibrated

    names = csv_option("--schedules", schedules, str)
    for s in names:
        check_schedule(s, "--schedules")
    check_sim_numbers(nodes=nodes, gpus_per_node=gpus_per_node, budget_mb=budget_mb, iters=iters, seed=seed)
    check_number("--period", period, 1, 10**6, integer=True)
    outputs = [Place("--json", json_path), Place("--plot", plot_path, suffixes=plot_suffixes())]
    for o in outputs:
        if o.path is not None:
            check_output_file(o.path, o.option, o.suffixes)
    calibrated(cluster, 1, gpus_per_node=gpus_per_node)
    jobs.check_shapes([model], [nodes], gpus_per_node, [budget_mb])
    jobs.check_traces(traces_dir, [model], seed)
    claim_outputs(outputs, [Place("--traces", traces_dir, folder=True, names=jobs.TRACE_FILES)])
    return names


@click.command("ablation")
@click.option("--model", default="k2", show_default=True, help="Model preset.")
@click.option("--nodes", default=4, show_default=True, type=int)
@click.option("--gpus-per-node", default=4, show_default=True, type=int)
@click.option("--budget-mb", default=64.0, show_default=True, type=float, help="Message budget per GPU (MB).")
@click.option("--cluster", "cluster_name", default="a100", show_default=True, help="Cluster preset.")
@click.option("--traces", "traces_dir", type=click.Path(), default=None,
              help="Recorded traces: DIR/<model>/{pool,eval}.txt (default: built-in synthetic traces).")
@click.option("--schedules", default="in-history,rotating", show_default=True,
              help="Comma-separated demand schedules: " + "; ".join(f"{k}: {v}" for k, v in SCHEDULES.items()) + ".")
@click.option("--iters", default=32, show_default=True, type=int,
              help="Batches per schedule, all timed (the mean over them is reported).")
@click.option("--period", default=DEFAULT_PERIOD, show_default=True, type=int, help="Batches per topic.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_path", type=click.Path(), default=None, help="Write the table and every figure as JSON.")
@click.option("--plot", "plot_path", type=click.Path(), default=None, help="Bars of the arms per schedule (PNG).")
def ablation(model, nodes, gpus_per_node, budget_mb, cluster_name, traces_dir, schedules, iters, period, seed,
             json_path, plot_path):
    """COMET, Zepp's overlap alone, its placement alone, both, both plus swaps every batch and
    plus one round of swaps: the mean layer time over each demand schedule."""
    from zepp.sim import ablation as abl

    names = _check(cluster_name, nodes, gpus_per_node, model, budget_mb, traces_dir, schedules, iters, period, seed,
                   json_path, plot_path)
    t0 = time.time()
    res = abl.run_ablation(model, nodes, gpus_per_node, budget_mb, cluster_name, traces_dir, names, iters, period,
                           seed, on_schedule=lambda s, d: click.echo(f"{s}: {d['topic_mix']['describe']}", err=True))
    res["wall_s"] = round(time.time() - t0, 1)
    click.echo(f"{model} on {cluster_name} {nodes}x{gpus_per_node}, {budget_mb:g} MB per GPU, {iters} batches per "
               f"schedule (period {period}), traces: {traces_dir or 'built-in synthetic'}; mean ms per layer "
               f"(speedup over comet)")
    click.echo(abl.format_table(res))
    click.echo(abl.closing_note(res))
    click.echo(abl.format_paths(res))
    click.echo(f"({res['cpu_s']:.0f} s CPU, {res['wall_s']:.0f} s)")
    if json_path:
        from zepp.outputs import write_json

        write_json(json_path, res, "--json")
        click.echo(f"wrote {json_path}")
    if plot_path:
        from zepp.sim.plots import ablation_bars

        ablation_bars(res, plot_path, title=f"{model}, {nodes}x{gpus_per_node} {cluster_name}, {budget_mb:g} MB")
        click.echo(f"wrote {plot_path}")
