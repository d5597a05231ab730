"""``zepp place``: plan every layer's placement from an engine's expert history and write the
file that engine loads, with a report of what it buys against the engine's own EPLB.

    zepp place --history DUMP --model k2 --nodes 4 --gpus-per-node 8 --redundant 32 \\
        --format sglang --out placement.json

Reads any history :func:`zepp.interop.history.read_history` knows (or ``--history synthetic`` /
``synthetic:k2`` for built-in traces), plans each MoE layer with ``--policy`` (default
``zepp``) and EPLB (the engine's default, for the comparison), writes ``--out`` in
``--format`` (read back and compared before it is reported as written) and, for SGLang and vLLM,
Zepp's routing table in the engine's own form beside it (``zepp.interop.engine_tables``: the file
``zepp.engines``' plug-ins install), and prints per layer and in total the busiest NIC's bytes,
inter-node bytes and busiest GPU's rows of the ways to run the layer (``zepp.interop.buys``), on
the history and on a held-out part of it.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from zepp.errors import ZeppInputError
from zepp.interop import FORMATS

if TYPE_CHECKING:
    from pathlib import Path

    from zepp.cluster import Cluster
    from zepp.model import MoESpec


@dataclass(frozen=True)
class PlaceOptions:
    """The options of ``zepp place`` as given (click's parameter names)."""

    history_path: str
    model: str
    nodes: int
    gpus_per_node: int | None
    redundant: int | None
    fmt: str
    out: str
    policy: str
    routing: str | None
    dispatch: str
    combine: str
    cluster_name: str
    cluster_file: str | None
    budget_mb: float
    iters: int
    heldout: float
    relaxation: float | None
    seed: int
    experts: int | None
    topk: int | None
    allow_duplicate_ids: bool
    sim_layers: int
    report_path: str | None
    no_report: bool


@dataclass(frozen=True)
class PlaceJob:
    """Checked options and what follows from them: the model, the cluster, the redundant
    experts, the engine's routing for the report and Zepp's relaxation ``C``."""

    opts: PlaceOptions
    spec: MoESpec
    cluster: Cluster
    redundant: int
    routing: str
    relaxation: float
    table_out: Path | None = None  # Zepp's table for the engine, beside --out (SGLang, vLLM)

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node


# ---------------------------------------------------------------- every option checked before any work


def _policies():
    from zepp.registry import PLACEMENTS

    return tuple(PLACEMENTS)


def _check_deployment(o: PlaceOptions):
    """``(spec, cluster, redundant)``: the model, the cluster and the redundant experts (default:
    the smallest count >= the GPU count that makes experts + redundant divide)."""
    from zepp.cluster import cluster_preset, load_cluster_file
    from zepp.interop.layers import check_copies_per_node, physical_experts
    from zepp.model import model_preset

    from zepp.launch.checks import check_number, check_sim_numbers

    check_sim_numbers(nodes=o.nodes, gpus_per_node=o.gpus_per_node, seed=o.seed)
    if o.redundant is not None:
        check_number("--redundant", o.redundant, 0, 1 << 20, integer=True)
    spec = model_preset(o.model, experts=o.experts, topk=o.topk)
    cl = load_cluster_file(o.cluster_file, o.nodes, o.gpus_per_node) if o.cluster_file else \
        cluster_preset(o.cluster_name, o.nodes, o.gpus_per_node)
    ranks = o.nodes * cl.gpus_per_node
    redundant = o.redundant
    if redundant is None:
        redundant = ranks + (-(spec.num_experts + ranks)) % ranks
    physical_experts(spec.num_experts, ranks, redundant)
    if o.policy in _policies():
        check_copies_per_node(o.policy, spec.num_experts, o.nodes, cl.gpus_per_node, redundant)
    return spec, cl, redundant


def _check_engine(o: PlaceOptions) -> str:
    """The placement policy, the engine's routing (returned, defaulted by format) and transports."""
    from zepp.interop.buys import engine_routing
    from zepp.planner.flows import check_transports
    from zepp.planner.routing import ROUTINGS

    if o.policy not in _policies():
        raise ZeppInputError(f"--policy {o.policy!r}: choose one of {', '.join(_policies())}")
    routing = o.routing or engine_routing(o.fmt)
    usable = [r for r, c in ROUTINGS.items() if not c.own_slots and not c.needs_table]
    if routing not in usable:
        raise ZeppInputError(f"--routing {routing!r}: choose one of {', '.join(usable)}")
    check_transports(o.dispatch, o.combine)
    return routing


def _check_report_numbers(o: PlaceOptions, spec) -> float:
    """The report's budget, batches, held-out share and layers; returns Zepp's relaxation ``C``."""
    from zepp.launch.checks import check_number, check_sim_numbers
    from zepp.planner.routing import default_relaxation

    check_sim_numbers(budget_mb=o.budget_mb, iters=o.iters)
    check_number("--sim-layers", o.sim_layers, 0, 10**4, integer=True)
    if not math.isfinite(o.heldout):
        raise ZeppInputError(f"--heldout must be a finite number, got {o.heldout!r}")
    if not 0 <= o.heldout < 1:
        raise ZeppInputError(f"--heldout must lie in [0, 1), got {o.heldout}")
    spec.tokens_for_budget(o.budget_mb)
    rel = default_relaxation(o.nodes) if o.relaxation is None else o.relaxation
    check_number("--relaxation", rel, 0, 1000)
    return rel


def _check_outputs(o: PlaceOptions) -> Path | None:
    """``--out``, its table file (returned; ``None`` where the format has none) and ``--report``
    (``zepp.outputs``): none another of them, the history or the cluster file."""
    import os

    from zepp.interop import check_suffix
    from zepp.interop.engine_tables import table_path
    from zepp.outputs import Place, claim_outputs

    check_suffix(o.fmt, o.out)
    table = table_path(o.fmt, o.out)
    history = None if o.history_path == "synthetic" or o.history_path.startswith("synthetic:") else o.history_path
    claim_outputs([Place("--out", o.out), Place("the table file beside --out", None if table is None else str(table)),
                   Place("--report", o.report_path)],
                  [Place("--history", history, folder=history is not None and os.path.isdir(history)),
                   Place("--cluster-file", o.cluster_file)])
    return table


def checked(o: PlaceOptions) -> PlaceJob:
    """Every option checked, in the order the messages come, before anything is read."""
    spec, cl, redundant = _check_deployment(o)
    routing = _check_engine(o)
    rel = _check_report_numbers(o, spec)
    table = _check_outputs(o)
    return PlaceJob(o, spec, cl, redundant, routing, rel, table)


# ---------------------------------------------------------------- read, plan, write


def _read_history(job: PlaceJob):
    o = job.opts
    if o.history_path == "synthetic" or o.history_path.startswith("synthetic:"):
        from zepp.traces.synthetic import synthetic_history

        prof = o.history_path.split(":", 1)[1] if ":" in o.history_path else None
        hist = synthetic_history(job.spec.name, profile=prof, seed=o.seed)
    else:
        from zepp.interop.history import read_history

        hist = read_history(o.history_path, job.spec.name, o.experts, o.topk, o.allow_duplicate_ids)
    click.echo(f"history: {hist.describe()}")
    for n in hist.notes:
        click.echo(f"  note: {n}")
    return hist


def _most_copies_on_a_node(ep) -> int:
    """The most copies of one expert on one node, over every layer of ``ep``."""
    import numpy as np

    worst = 0
    for row in ep.maps.values():
        node = np.arange(row.size) // (ep.slots_per_gpu * ep.gpus_per_node)
        worst = max(worst, int(np.bincount(node * ep.model.num_experts + row).max()))
    return worst


def _rule_lines(zepp_ep, eplb_ep, history) -> list[str]:
    """Zepp's rule, visible: copies per node and the hottest experts' copies."""
    import numpy as np

    worst, eplb_worst = _most_copies_on_a_node(zepp_ep), _most_copies_on_a_node(eplb_ep)
    verdict = "no expert has two copies on one node" if worst == 1 else "some expert has several copies on a node"
    lines = [f"most copies of one expert on one node: {zepp_ep.policy} {worst}, eplb {eplb_worst} ({verdict})"]
    layer = history.layers[0] if history.layers is not None else zepp_ep.model.moe_layers[0]
    load = history.load(0)
    share = load / max(1, load.sum())
    zc = np.bincount(zepp_ep.maps[layer], minlength=zepp_ep.model.num_experts)
    ec = np.bincount(eplb_ep.maps[layer], minlength=zepp_ep.model.num_experts)
    hot = np.argsort(-load, kind="stable")[:5]
    cold = np.argsort(load, kind="stable")[:1]
    lines.append(f"layer {layer}, hottest experts and the coldest: expert (share of entries): copies "
                 f"{zepp_ep.policy} / eplb")
    lines.append("  " + ", ".join(f"{e} ({share[e]:.1%}): {zc[e]}/{ec[e]}" for e in [*hot, *cold]))
    return lines


def _plan_and_write(job: PlaceJob, plan_hist):
    """``(placement, eplb's placement, how each layer's node demand was obtained)``; the
    placement is written, read back and compared before it is reported as written."""
    from zepp.interop import load_hint, read_placement_file, write_placement
    from zepp.interop.layers import plan_layers

    o, spec, L = job.opts, job.spec, job.gpus_per_node
    ep, how = plan_layers(plan_hist, spec, o.nodes, L, job.redundant, o.policy)
    eplb_ep, _ = plan_layers(plan_hist, spec, o.nodes, L, job.redundant, "eplb")
    click.echo(f"cluster: {job.cluster.name}, {o.nodes} nodes x {L} GPUs = {o.nodes * L} GPUs; {spec.num_experts} "
               f"experts + {job.redundant} redundant = {ep.num_physical} physical ({ep.slots_per_gpu} per GPU); "
               f"{len(ep.maps)} MoE layers of {spec.num_layers}")
    click.echo(f"node demand: {how[0]}")
    for n in ep.notes:
        click.echo(f"  note: {n}")
    for line in _rule_lines(ep, eplb_ep, plan_hist):
        click.echo(line)
    from zepp.outputs import replacing

    with replacing(o.out, "--out") as tmp:  # read back before it replaces the path
        write_placement(tmp, ep, o.fmt)
        if not read_placement_file(tmp, o.fmt, spec, o.nodes, L).same_as(ep):
            raise ZeppInputError(f"{o.out}: reading the written file back gave another placement (a bug; please "
                                 f"report)")
    click.echo(f"wrote {o.out} ({o.fmt}, {o.policy} placement, read back identical)")
    click.echo(f"  {load_hint(o.fmt, o.out, ep)}")
    return ep, eplb_ep, how


def _write_table(job: PlaceJob, plan_hist, ep):
    """Zepp's table per MoE layer in the engine's own form, written beside the placement and read
    back; ``None`` where the format has no table."""
    if job.table_out is None:
        return None
    from zepp.engines import launch_lines
    from zepp.interop.engine_tables import ENGINE_ROWS, plan_tables, table_routing, write_tables
    from zepp.outputs import replacing
    from zepp.registry import SYSTEMS

    o = job.opts
    tokens = job.spec.tokens_for_budget(o.budget_mb)
    tables = plan_tables(o.fmt, plan_hist, ep, job.relaxation, tokens)
    with replacing(job.table_out, "the table file beside --out") as tmp:  # whole or not at all, as --out
        write_tables(tmp, o.fmt, ep, tables)
    click.echo(f"wrote {job.table_out} ({table_routing(o.fmt, tokens)}: Zepp's table per MoE layer for batches of "
               f"{tokens} tokens per GPU (--budget-mb), read back identical)")
    decode = tokens <= SYSTEMS[ENGINE_ROWS[o.fmt][1]].switch_tokens
    for line in launch_lines(o.fmt, o.out, str(job.table_out), ep.redundant, ep.nodes, ep.gpus_per_node, decode):
        click.echo(f"  {line}")
    return tables


# ---------------------------------------------------------------- what it buys


def _progress(i: int, n: int) -> None:
    if sys.stderr.isatty():
        click.echo(f"\rreport: layer {i}/{n}", err=True, nl=i == n)


def _report(job: PlaceJob, plan_hist, held, ep, eplb_ep, tables) -> list:
    """The report's figures per layer, window and configuration, printed as a table."""
    from zepp.interop.buys import buys, format_table
    from zepp.interop.engine_tables import table_routing

    o, spec = job.opts, job.spec
    figs = buys(plan_hist, held, ep, eplb_ep, job.routing, o.dispatch, o.combine, o.budget_mb, o.iters, o.seed,
                job.relaxation, _progress, cluster=job.cluster if o.sim_layers else None, sim_layers=o.sim_layers,
                tables=tables, table_routing=table_routing(o.fmt, spec.tokens_for_budget(o.budget_mb))
                if tables is not None else None)
    click.echo("")
    click.echo(f"what it buys ({spec.name}, {spec.tokens_for_budget(o.budget_mb)} tokens per GPU = {o.budget_mb:g} "
               f"MiB budget; engine routing '{job.routing}' over {o.dispatch}/{o.combine}; x eplb < 1 is better):")
    click.echo("  eplb: engine routing over EPLB's placement | engine+zepp-place: the same routing over this file"
               + (" | engine+zepp-table: the engine's dispatch over this file and its table" if tables else "")
               + " | zepp-route: Zepp's routing, engine transport | zepp-full: Zepp's routing and transport")
    click.echo(format_table(figs))
    if o.sim_layers:
        from zepp.sim.calibrate import network_label

        cl = job.cluster
        net = network_label(cl.name)
        click.echo(f"sim layer ms: zepp.sim on {cl.name} with {net}, first batch of the first {o.sim_layers} "
                   f"layer(s), no overlap for any configuration")
        from zepp.sim.calibrate import unused_note

        if unused_note(cl):
            click.echo(f"  {unused_note(cl)}")
    return figs


def _write_report(job: PlaceJob, hist, how: list[str], figs: list) -> None:
    from zepp.outputs import write_json

    o = job.opts
    write_json(o.report_path, {
        "history": hist.describe(), "model": job.spec.name, "cluster": job.cluster.name, "nodes": o.nodes,
        "gpus_per_node": job.gpus_per_node, "redundant": job.redundant, "policy": o.policy, "format": o.fmt,
        "out": o.out, "table": str(job.table_out) if job.table_out else None, "routing": job.routing, "dispatch": o.dispatch, "combine": o.combine,
        "budget_mb": o.budget_mb, "iters": o.iters, "heldout": o.heldout, "node_demand": how[0],
        "figures": [f.__dict__ for f in figs]}, "--report")
    click.echo(f"wrote {o.report_path} (report, every layer)")


@click.command("place")
@click.option("--history", "history_path", required=True,
              help="engine history: SGLang .pt dump (or folder of per-rank dumps), TensorRT-LLM statistics folder, "
                   "vLLM load window .pt/.npz, zepp recorder folder, a .txt trace, or 'synthetic[:k2|qwen]'")
@click.option("--model", required=True, help="model preset the history was recorded with (sets layers, experts, top-k)")
@click.option("--nodes", type=int, required=True, help="nodes of the deployment")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the --cluster preset's board)")
@click.option("--redundant", type=int, default=None,
              help="extra physical experts in total (E + R must be divisible by the GPU count); default: the "
                   "smallest R >= GPU count that divides")
@click.option("--format", "fmt", type=click.Choice(tuple(FORMATS)), required=True, help="engine file to write")
@click.option("--out", required=True, help="file to write (.json/.pt sglang; .yaml trtllm; .pt/.json vllm; .json zepp); "
                                          "sglang and vllm (.pt) also get Zepp's table beside it, NAME.zepp-table.SUFFIX")
@click.option("--policy", default="zepp", help="placement to write (a registry placement; zepp place compares it "
                                               "with eplb)")
@click.option("--routing", default=None, help="the engine's replica choice for the report (default: sglang "
                                              "sglang-static, vllm vllm-hash, trtllm replica-rr, zepp zepp)")
@click.option("--dispatch", default="relay", show_default=True, help="the engine's dispatch transport for the report")
@click.option("--combine", default="reduce", show_default=True, help="the engine's combine transport for the report")
@click.option("--cluster", "cluster_name", default="h100-8", show_default=True, help="cluster preset")
@click.option("--cluster-file", default=None, help="YAML/JSON file with the cluster's fields (overrides --cluster)")
@click.option("--budget-mb", type=float, default=4.0, show_default=True, help="per-GPU message budget of the report's batches")
@click.option("--iters", type=int, default=2, show_default=True, help="batches per layer and window in the report")
@click.option("--heldout", type=float, default=0.25, show_default=True,
              help="fraction of the history held out (last rows / time bins): planned without, reported on")
@click.option("--relaxation", type=float, default=None, help="Zepp's C (default 0.25, 0.5 from 16 nodes)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--experts", type=int, default=None, help="override the model's expert count")
@click.option("--topk", type=int, default=None, help="override the model's top-k")
@click.option("--allow-duplicate-ids", is_flag=True, help="accept one expert twice in a token's top-k (synthetic data)")
@click.option("--sim-layers", type=int, default=2, show_default=True,
              help="simulate the first N layers' layer time on the cluster (0: none)")
@click.option("--report", "report_path", default=None, help="write the report (every layer) as JSON here")
@click.option("--no-report", is_flag=True, help="write the placement only")
def place(**options):
    """Plan every layer's expert placement from an engine's history and write the file it loads."""
    job = checked(PlaceOptions(**options))
    o = job.opts
    t0 = time.perf_counter()
    hist = _read_history(job)
    plan_hist, held = hist.split(o.heldout) if not o.no_report else (hist, None)
    if o.heldout and held is None and not o.no_report:
        click.echo("  note: nothing can be held out (one time bin); the report is on the planning history only")
    ep, eplb_ep, how = _plan_and_write(job, plan_hist)
    tables = _write_table(job, plan_hist, ep)
    if o.no_report:
        return
    figs = _report(job, plan_hist, held, ep, eplb_ep, tables)
    click.echo(f"({time.perf_counter() - t0:.1f} s)")
    if o.report_path:
        _write_report(job, hist, how, figs)
