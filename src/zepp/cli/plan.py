"""``zepp plan``: plan batches with each system's placement, routing and transport, and print
what each plan puts on the links, with the first batch's simulated layer time where the
cluster has a network calibration (no tensors)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np

from zepp.cluster import PRESET_NAMES as CLUSTER_PRESETS
from zepp.cluster import cluster_preset
from zepp.errors import ZeppInputError
from zepp.model import PRESET_NAMES as MODEL_NAMES
from zepp.model import MoESpec, model_preset
from zepp.planner.placement import make_placement
from zepp.planner.batch import plan_batch
from zepp.planner.routing import default_relaxation
from zepp import registry
from zepp.cli.bench import schedule_option
from zepp.traces import Trace, node_demand, read_trace, sample_batches
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


def simulated_ms(cluster, spec: MoESpec, system: str, plan) -> float | None:
    """The simulated layer time of ``plan`` on ``cluster`` (``zepp.sim.run.simulate_flowplan``;
    ``None`` where the simulator has no network figures for the cluster's preset, fitted or
    published, or does not run the system from one FlowPlan)."""
    from zepp.sim.calibrate import has_network
    from zepp.sim.run import simulate_flowplan

    s = registry.system(system)
    if not has_network(cluster.name) or not s.supports("sim") or s.adaptation_choice.changes_placement or s.plugins:
        return None
    tl, _, _ = simulate_flowplan(plan, cluster, spec, s)
    return tl.latency * 1e3


def _timed_plan(system, batch, placement, row_bytes: int, relaxation: float):
    """``(FlowPlan, routing s, flows s)`` of one batch (``zepp.planner.plan_batch`` times its two
    steps apart: the table's two columns)."""
    t: dict = {}
    plan = plan_batch(batch, placement, system, row_bytes, relaxation, timings=t)
    return plan, t["routing"], t["flows"]


def _figures(plan, routing_s: float, flows_s: float) -> dict:
    """What one plan puts on the links, and its planning seconds."""
    stats = plan.stats()
    return dict(inter_node_bytes=stats.inter_node_bytes, busiest_nic_bytes=stats.busiest_nic_bytes,
                nvlink_bytes=stats.nvlink_bytes, busiest_gpu_rows=int(stats.rows_computed.max()),
                messages=int(stats.messages.sum()), routing_s=routing_s, flows_s=flows_s)


def plan_table(spec: MoESpec, nodes: int, gpus_per_node: int, budget_mb: float, pool: Trace, evaluation: Trace,
               systems: list[str], iters: int, seed: int, relaxation: float, extra: int,
               validate: bool | str = True, dump: Path | None = None, cluster=None, workload=None) -> list[dict]:
    """Plan ``iters`` sampled batches with each system; one summary dict per system (means over
    iterations of bytes, rows and planning seconds; ``sim_ms``: the first batch simulated on
    ``cluster`` where the simulator can). ``validate``: every plan (``True``), the first batch's
    only (``"first"``) or none (``False``). ``workload``: a ``zepp.traces.DriftWorkload`` whose
    history and batches replace ``pool`` / ``evaluation``'s."""
    ranks = nodes * gpus_per_node
    if workload is None:
        hist = node_demand(pool, nodes, gpus_per_node)
        batches = sample_batches(evaluation, ranks, spec.tokens_for_budget(budget_mb), iters, seed)
    else:
        hist, batches = workload.hist(nodes, gpus_per_node), workload.batches
    rows = []
    for name in systems:
        system = registry.system(name)
        t0 = time.perf_counter()
        placement = make_placement(system.placement, hist, spec.num_experts, ranks, gpus_per_node, extra=extra)
        place_s = time.perf_counter() - t0
        per_iter, sim_first = [], None
        for it, batch in enumerate(batches):
            plan, routing_s, flows_s = _timed_plan(system, batch, placement, spec.row_bytes, relaxation)
            if validate is True or (validate == "first" and it == 0):
                plan.validate()
            if it == 0 and cluster is not None:
                sim_first = simulated_ms(cluster, spec, name, plan)
            per_iter.append(_figures(plan, routing_s, flows_s))
            if dump is not None:
                dump.mkdir(parents=True, exist_ok=True)
                np.savez_compressed(dump / f"{name}_iter{it}.npz", topk_ids=batch, slot=plan.routing.slot,
                                    slot_expert=placement.slot_expert)
        row = {key: float(np.mean([d[key] for d in per_iter])) for key in per_iter[0]}
        row["sim_ms"] = sim_first
        row.update(system=name, placement=system.placement, routing=system.routing, dispatch=system.dispatch,
                   combine=system.combine, placement_s=place_s, entries=int(batches[0].size))
        rows.append(row)
    return rows


COLUMNS = (
    ("inter-node MiB", "bytes crossing any NIC, both phases, mean per batch"),
    ("busiest NIC MiB", "the most loaded NIC direction (send or receive)"),
    ("vs a2av", "busiest NIC bytes relative to a2av's"),
    ("NVLink MiB", "bytes over intra-node links"),
    ("busiest GPU rows", "GEMM rows of the most loaded GPU"),
    ("msgs", "messages, both phases"),
    ("plan ms", "routing + flows on this CPU (numpy), not the simulated GPU planner"),
    ("sim ms", "the first batch's simulated layer time on the chosen cluster"),
)


def format_table(rows: list[dict]) -> str:
    """The plan table; units in the headers (MiB = 2**20 bytes); ``COLUMNS`` says what each means."""
    mib = 2**20
    w = max([len("system")] + [len(r["system"]) for r in rows])
    widths = [max(len(c), 9) for c, _ in COLUMNS]
    head = f"{'system':<{w}} " + " ".join(f"{c:>{n}}" for (c, _), n in zip(COLUMNS, widths))
    base = next((r["busiest_nic_bytes"] for r in rows if r["system"] == "a2av"), None)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = [f"{r['inter_node_bytes'] / mib:.2f}", f"{r['busiest_nic_bytes'] / mib:.3f}",
                 f"{r['busiest_nic_bytes'] / base:.3f}" if base else "-", f"{r['nvlink_bytes'] / mib:.2f}",
                 f"{r['busiest_gpu_rows']:.0f}", f"{r['messages']:.0f}", f"{(r['routing_s'] + r['flows_s']) * 1e3:.1f}",
                 f"{r['sim_ms']:.2f}" if r.get("sim_ms") is not None else "-"]
        lines.append(f"{r['system']:<{w}} " + " ".join(f"{c:>{n}}" for c, n in zip(cells, widths)))
    lines.append("")
    lines.extend(f"  {c}: {m}" for c, m in COLUMNS)
    return "\n".join(lines)


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
    _check_outputs(spec, relaxation, extra, json_path, dump)
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
        Path(json_path).write_text(json.dumps(payload, indent=2))
        click.echo(f"wrote {json_path}")
    if dump:
        click.echo(f"wrote {len(names) * iters} plans to {dump}/")


def _check_outputs(spec: MoESpec, relaxation: float | None, extra: int, json_path, dump) -> None:
    """``--relaxation``, ``--extra`` and the output paths, before anything is planned."""
    from zepp.launch.checks import check_number, check_output_folder, check_output_path

    if relaxation is not None:
        check_number("--relaxation", relaxation, 0, 1000)
    if not 0 <= extra <= spec.num_experts:
        raise ZeppInputError(f"--extra must lie in [0, {spec.num_experts}] (a GPU holds at most every expert once), "
                             f"got {extra}")
    if json_path is not None:
        check_output_path(json_path, "--json")
    if dump is not None:
        check_output_folder(dump, "--dump")
