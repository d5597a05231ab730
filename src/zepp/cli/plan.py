"""``zepp plan``: plan batches with each system's placement, routing and transport, and print
what each plan puts on the links, with the first batch's simulated layer time where the
cluster has a network calibration (no tensors)."""

from __future__ import annotations

from pathlib import Path

import click

from zepp.cluster import PRESET_NAMES as CLUSTER_PRESETS
from zepp.cluster import cluster_preset
from zepp.errors import ZeppInputError
from zepp.model import PRESET_NAMES as MODEL_NAMES
from zepp.model import MoESpec, model_preset
from zepp.planner.routing import default_relaxation
from zepp import registry
from zepp.cli.bench import schedule_option
from zepp.sim.plan_report import format_table, plan_table
from zepp.traces import Trace, read_trace
from zepp.traces.schedules import DEFAULT_SCHEDULE, check_schedule, drift_workload


DEFAULT_NODES = 4


def load_windows(spec: MoESpec, history: str | None, trace: str | None, seed: int, profile: str | None = None,
                 allow_duplicates: bool = False) -> tuple[Trace, Trace]:
    """The history window (placement) and evaluation window (batches): files when given,
    else the built-in synthetic traces of the model (drawn from skew ``profile``)."""
    if trace is None and history is None:
        from zepp.traces.synthetic import synthetic_traces

        pool, evaluation = synthetic_traces(spec.name, seed=seed, profile=profile)
        if pool.num_experts != spec.num_experts or pool.top_k != spec.top_k:
            raise ZeppInputError(
                f"the built-in trace of {spec.name!r} has {pool.num_experts} experts and top-{pool.top_k}, but "
                f"the model asks for {spec.num_experts} and top-{spec.top_k}; pass --history and --trace files"
            )
        return pool, evaluation
    if profile is not None:
        raise ZeppInputError("--profile chooses the skew of the built-in traces; drop it when giving --history/--trace")
    kw = dict(num_experts=spec.num_experts, top_k=spec.top_k, allow_duplicates=allow_duplicates)
    evaluation = read_trace(trace or history, **kw)
    pool = read_trace(history, **kw) if history else evaluation
    return pool, evaluation


def _workload(spec: MoESpec, schedule: str, pool: Trace, evaluation: Trace, files, cluster, tokens: int, iters: int,
              seed: int, profile: str | None):
    """The drift schedule's workload (``None`` under the default): topics of the given trace
    files, or of the built-in generator's prompt-structured windows."""
    if schedule == DEFAULT_SCHEDULE:
        return None
    from zepp.traces.topics import synthetic_topics

    source = (pool, evaluation) if files else synthetic_topics(spec.name, seed, profile=profile)
    return drift_workload(source, schedule, cluster.ranks, tokens, iters, seed)


@click.command("plan")
@click.option("--model", default="k2", show_default=True, type=click.Choice(MODEL_NAMES), help="Model preset.")
@click.option("--experts", type=int, default=None, help="Override the preset's expert count.")
@click.option("--topk", type=int, default=None, help="Override the preset's top-k.")
@click.option("--hidden", type=int, default=None, help="Override the preset's hidden size.")
@click.option("--ffn", type=int, default=None, help="Override the preset's expert FFN size.")
@click.option("--cluster", "cluster_name", default="a100", show_default=True, type=click.Choice(CLUSTER_PRESETS),
              help="Cluster preset (the simulated time needs a calibrated one: a100, h100).")
@click.option("--cluster-file", type=click.Path(dir_okay=False), default=None,
              help="YAML/JSON file with a cluster's fields (overrides --cluster).")
@click.option("--nodes", default=None, type=int, help=f"Nodes (default: the cluster file's, else {DEFAULT_NODES}).")
@click.option("--gpus-per-node", default=None, type=int, help="GPUs per node (default: the preset's board).")
@click.option("--budget-mb", default=16.0, show_default=True, type=float, help="Message budget per GPU (MB).")
@click.option("--history", type=click.Path(dir_okay=False), default=None,
              help="Trace the placement is planned from (default: built-in synthetic history).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Trace batches are sampled from (default: built-in synthetic evaluation window).")
@click.option("--profile", default=None,
              help="Skew profile of the built-in traces (k2 or qwen; default: the closer in expert count).")
@click.option("--allow-duplicate-ids", is_flag=True,
              help="Accept trace rows that repeat an expert id (synthetic data); refused by default.")
@click.option("--systems", default="zepp,a2av", show_default=True,
              help=f"Comma list of {registry.help_list('plan')}, or 'all' (zepp = its variants; see zepp systems).")
@click.option("--iters", default=3, show_default=True, type=int, help="Batches to plan per system.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--relaxation", type=float, default=None, help="C (default 0.25; 0.5 at 16+ nodes).")
@click.option("--extra", default=2, show_default=True, type=int, help="Redundant slots per GPU.")
@click.option("--no-validate", is_flag=True, help="Skip validate() on every plan.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the table as JSON.")
@click.option("--dump", type=click.Path(file_okay=False), default=None,
              help="Write DIR/<system>_iter<i>.npz with topk_ids, slot and slot_expert per batch.")
@schedule_option
def plan(model, experts, topk, hidden, ffn, cluster_name, cluster_file, nodes, gpus_per_node, budget_mb, history, trace,
         profile, allow_duplicate_ids, systems, iters, seed, relaxation, extra, no_validate, json_path, dump, schedule):
    """Plan batches with each system and print per-link bytes, planning time and the simulated
    layer time on the chosen cluster."""
    from zepp.cluster import load_cluster_file
    from zepp.launch.checks import check_sim_numbers

    check_schedule(schedule)
    check_sim_numbers(nodes=nodes, gpus_per_node=gpus_per_node, budget_mb=budget_mb, iters=iters, seed=seed)
    spec = model_preset(model, experts=experts, topk=topk, hidden=hidden, ffn=ffn)
    cluster = load_cluster_file(cluster_file, nodes, gpus_per_node, default_nodes=DEFAULT_NODES) if cluster_file \
        else cluster_preset(cluster_name, DEFAULT_NODES if nodes is None else nodes, gpus_per_node)
    nodes, gpus_per_node = cluster.nodes, cluster.gpus_per_node
    _check_outputs(spec, relaxation, extra, json_path, dump, dict(history=history, trace=trace,
                                                                  cluster_file=cluster_file))
    names = registry.parse_systems(systems, "plan", expand=True)
    tokens = spec.tokens_for_budget(budget_mb)
    relaxation = default_relaxation(nodes) if relaxation is None else relaxation
    pool, evaluation = load_windows(spec, history, trace, seed, profile, allow_duplicate_ids)
    wl = _workload(spec, schedule, pool, evaluation, history or trace, cluster, tokens, iters, seed, profile)
    rows = plan_table(spec, cluster.nodes, cluster.gpus_per_node, budget_mb, pool, evaluation, names, iters, seed,
                      relaxation, extra, validate=not no_validate, dump=Path(dump) if dump else None, cluster=cluster,
                      workload=wl)
    if wl is not None:  # what the rows were planned from and drawn from
        pool, evaluation = wl.history, wl.topics.eval
    click.echo(f"{spec.name} on {cluster.name} {nodes}x{gpus_per_node}, {budget_mb:g} MB = {tokens} tokens/GPU, "
               f"C={relaxation:g}, {iters} batch(es), history {pool.source}, batches from {evaluation.source}"
               + ("" if no_validate else "; every plan validated"))
    if wl is not None:
        click.echo(wl.describe())
    click.echo(format_table(rows))
    from zepp.sim.calibrate import unused_note

    if unused_note(cluster):
        click.echo(unused_note(cluster))
    if json_path:
        payload = dict(model=spec.name, cluster=cluster.name, nodes=nodes, gpus_per_node=gpus_per_node,
                       budget_mb=budget_mb, tokens_per_gpu=tokens, relaxation=relaxation, iters=iters, seed=seed,
                       history=pool.source, trace=evaluation.source, systems=rows)
        if wl is not None:
            payload.update(schedule=schedule, topic_mix=dict(wl.report(), describe=wl.describe()))
        from zepp.outputs import write_json

        write_json(json_path, payload, "--json", indent=2)
        click.echo(f"wrote {json_path}")
    if dump:
        click.echo(f"wrote {len(names) * iters} plans to {dump}/")


def _check_outputs(spec: MoESpec, relaxation: float | None, extra: int, json_path, dump, inputs: dict) -> None:
    """``--relaxation``, ``--extra`` and the output paths (none an input file of ``inputs``, the
    options' values by click name), before anything is planned."""
    from zepp.launch.checks import check_number
    from zepp.outputs import Place, claim_outputs

    if relaxation is not None:
        check_number("--relaxation", relaxation, 0, 1000)
    if not 0 <= extra <= spec.num_experts:
        raise ZeppInputError(f"--extra must lie in [0, {spec.num_experts}] (a GPU holds at most every expert once), "
                             f"got {extra}")
    claim_outputs([Place("--json", json_path), Place("--dump", dump, folder=True, names=("*.npz",))],
                  [Place("--" + k.replace("_", "-"), v) for k, v in inputs.items()])
