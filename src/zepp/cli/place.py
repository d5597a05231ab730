"""``zepp place``: plan every layer's placement from an engine's expert history and write the
file that engine loads, with a report of what it buys against the engine's own EPLB.

    zepp place --history DUMP --model k2 --nodes 4 --gpus-per-node 8 --redundant 32 \\
        --format sglang --out placement.json

Reads any history :func:`zepp.interop.history.read_history` knows (or ``--history synthetic`` /
``synthetic:k2`` for built-in traces), plans each MoE layer with ``--policy`` (default
``zepp``) and EPLB (the engine's default, for the comparison), writes ``--out`` in
``--format`` (read back and compared before it is reported as written), and prints per layer
and in total the busiest NIC's bytes, inter-node bytes and busiest GPU's rows of four ways to
run the layer (``zepp.interop.buys``), on the history and on a held-out part of it.
"""

from __future__ import annotations

import json
import sys
import time

import click

from zepp.errors import ZeppInputError

_FORMATS = ("sglang", "vllm", "trtllm", "zepp")


def _policies():
    from zepp.registry import PLACEMENTS

    return tuple(PLACEMENTS)


def _hint(fmt: str, out: str, ep) -> str:
    if fmt == "sglang":
        return (f"SGLang: --init-expert-location {out} --ep-num-redundant-experts {ep.redundant} "
                f"(EP size {ep.ranks}; without --enable-eplb, which would re-plan it)")
    if fmt == "trtllm":
        return f"TensorRT-LLM: moe_config: {{backend: WideEP, load_balancer: {out}}} (EP size {ep.ranks})"
    if fmt == "vllm":
        if out.lower().endswith(".json"):
            return f"vLLM-Ascend: give {out} as the expert placement file (EP size {ep.ranks})"
        return (f"vLLM: {out} holds physical_to_logical_map, logical_to_physical_map and logical_replica_count per "
                f"MoE layer for its EPLB state (num_redundant_experts={ep.redundant}; mainline vLLM has no loader)")
    return f"zepp: zepp.interop.read_placement_file({out!r}, 'zepp', spec, {ep.nodes}, {ep.gpus_per_node})"


def _rule_lines(zepp_ep, eplb_ep, history) -> list[str]:
    """Zepp's rule, visible: copies per node and the hottest experts' copies."""
    import numpy as np

    lines = []
    worst = 0
    for layer, row in zepp_ep.maps.items():
        node = np.arange(row.size) // (zepp_ep.slots_per_gpu * zepp_ep.gpus_per_node)
        key = node * zepp_ep.model.num_experts + row
        worst = max(worst, int(np.bincount(key).max()))
    eplb_worst = 0
    for layer, row in eplb_ep.maps.items():
        node = np.arange(row.size) // (eplb_ep.slots_per_gpu * eplb_ep.gpus_per_node)
        eplb_worst = max(eplb_worst, int(np.bincount(node * eplb_ep.model.num_experts + row).max()))
    lines.append(f"most copies of one expert on one node: {zepp_ep.policy} {worst}, eplb {eplb_worst} "
                 f"({'no expert has two copies on one node' if worst == 1 else 'some expert has several copies on a node'})")
    i = 0
    layer = history.layers[0] if history.layers is not None else zepp_ep.model.moe_layers[0]
    load = history.load(i)
    share = load / max(1, load.sum())
    zc = np.bincount(zepp_ep.maps[layer], minlength=zepp_ep.model.num_experts)
    ec = np.bincount(eplb_ep.maps[layer], minlength=zepp_ep.model.num_experts)
    hot = np.argsort(-load, kind="stable")[:5]
    cold = np.argsort(load, kind="stable")[:1]
    lines.append(f"layer {layer}, hottest experts and the coldest: expert (share of entries): copies "
                 f"{zepp_ep.policy} / eplb")
    lines.append("  " + ", ".join(f"{e} ({share[e]:.1%}): {zc[e]}/{ec[e]}" for e in [*hot, *cold]))
    return lines


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
@click.option("--format", "fmt", type=click.Choice(_FORMATS), required=True, help="engine file to write")
@click.option("--out", required=True, help="file to write (.json/.pt sglang; .yaml trtllm; .pt/.json vllm; .json zepp)")
@click.option("--policy", default="zepp", help="placement to write (a registry placement; zepp place compares it "
                                               "with eplb)")
@click.option("--routing", default=None, help="the engine's replica choice for the report (default: sglang locality, "
                                              "vllm random, trtllm replica-rr, zepp zepp)")
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
def place(history_path, model, nodes, gpus_per_node, redundant, fmt, out, policy, routing, dispatch, combine,
          cluster_name, cluster_file, budget_mb, iters, heldout, relaxation, seed, experts, topk, allow_duplicate_ids,
          sim_layers, report_path, no_report):
    """Plan every layer's expert placement from an engine's history and write the file it loads."""
    import math

    from zepp.cluster import cluster_preset, load_cluster_file
    from zepp.planner.flows import check_transports
    from zepp.interop import check_suffix, read_placement_file, write_placement
    from zepp.interop.buys import ENGINE_ROUTING, buys, format_table
    from zepp.interop.common import writable
    from zepp.interop.layers import physical_experts, plan_layers
    from zepp.model import model_preset
    from zepp.registry import ROUTINGS

    # ---- every option checked before any work
    spec = model_preset(model, experts=experts, topk=topk)
    if nodes is None or nodes < 1:
        raise ZeppInputError(f"--nodes must be a positive integer, got {nodes!r}")
    cl = load_cluster_file(cluster_file, nodes, gpus_per_node) if cluster_file else \
        cluster_preset(cluster_name, nodes, gpus_per_node)
    L = cl.gpus_per_node
    ranks = nodes * L
    if redundant is None:
        redundant = ranks + (-(spec.num_experts + ranks)) % ranks
    physical_experts(spec.num_experts, ranks, redundant)
    if policy not in _policies():
        raise ZeppInputError(f"--policy {policy!r}: choose one of {', '.join(_policies())}")
    routing = routing or ENGINE_ROUTING[fmt]
    if routing not in ROUTINGS or routing == "moonep":
        raise ZeppInputError(f"--routing {routing!r}: choose one of {', '.join(r for r in ROUTINGS if r != 'moonep')}")
    check_transports(dispatch, combine)
    for name, v in (("--budget-mb", budget_mb), ("--heldout", heldout)):
        if not math.isfinite(v):
            raise ZeppInputError(f"{name} must be a finite number, got {v!r}")
    if iters < 1:
        raise ZeppInputError(f"--iters must be >= 1, got {iters}")
    if sim_layers < 0:
        raise ZeppInputError(f"--sim-layers must be >= 0, got {sim_layers}")
    if not 0 <= heldout < 1:
        raise ZeppInputError(f"--heldout must lie in [0, 1), got {heldout}")
    spec.tokens_for_budget(budget_mb)
    rel = (0.5 if nodes >= 16 else 0.25) if relaxation is None else relaxation
    if not (math.isfinite(rel) and rel >= 0):
        raise ZeppInputError(f"--relaxation must be a finite number >= 0, got {relaxation!r}")
    check_suffix(fmt, out)
    writable(out)
    if report_path:
        writable(report_path)

    # ---- read
    t0 = time.perf_counter()
    if history_path == "synthetic" or history_path.startswith("synthetic:"):
        from zepp.traces.synthetic import synthetic_history

        prof = history_path.split(":", 1)[1] if ":" in history_path else None
        hist = synthetic_history(spec.name, profile=prof, seed=seed)
    else:
        from zepp.interop.history import read_history

        hist = read_history(history_path, spec.name, experts, topk, allow_duplicate_ids)
    click.echo(f"history: {hist.describe()}")
    for n in hist.notes:
        click.echo(f"  note: {n}")
    plan_hist, held = hist.split(heldout) if not no_report else (hist, None)
    if heldout and held is None and not no_report:
        click.echo("  note: nothing can be held out (one time bin); the report is on the planning history only")

    # ---- plan and write
    ep, how = plan_layers(plan_hist, spec, nodes, L, redundant, policy)
    eplb_ep, _ = plan_layers(plan_hist, spec, nodes, L, redundant, "eplb")
    click.echo(f"cluster: {cl.name}, {nodes} nodes x {L} GPUs = {ranks} GPUs; {spec.num_experts} experts + "
               f"{redundant} redundant = {ep.num_physical} physical ({ep.slots_per_gpu} per GPU); "
               f"{len(ep.maps)} MoE layers of {spec.num_layers}")
    click.echo(f"node demand: {how[0]}")
    for n in ep.notes:
        click.echo(f"  note: {n}")
    for line in _rule_lines(ep, eplb_ep, plan_hist):
        click.echo(line)
    write_placement(out, ep, fmt)
    back = read_placement_file(out, fmt, spec, nodes, L)
    if not back.same_as(ep):
        raise ZeppInputError(f"{out}: reading the written file back gave another placement (a bug; please report)")
    click.echo(f"wrote {out} ({fmt}, {policy} placement, read back identical)")
    click.echo(f"  {_hint(fmt, out, ep)}")
    if no_report:
        return

    # ---- what it buys
    def progress(i, n):
        if sys.stderr.isatty():
            click.echo(f"\rreport: layer {i}/{n}", err=True, nl=i == n)

    figs = buys(plan_hist, held, ep, eplb_ep, routing, dispatch, combine, budget_mb, iters, seed, rel, progress,
                cluster=cl if sim_layers else None, sim_layers=sim_layers)
    click.echo("")
    click.echo(f"what it buys ({spec.name}, {spec.tokens_for_budget(budget_mb)} tokens per GPU = {budget_mb:g} MiB "
               f"budget; engine routing '{routing}' over {dispatch}/{combine}; x eplb < 1 is better):")
    click.echo("  eplb: engine routing over EPLB's placement | engine+zepp-place: the same routing over this file | "
               "zepp-route: Zepp's routing, engine transport | zepp-full: Zepp's routing and transport")
    click.echo(format_table(figs))
    if sim_layers:
        from zepp.sim.calibrate import network_label

        net = network_label(cl.name)
        click.echo(f"sim layer ms: zepp.sim on {cl.name} with {net}, first batch of the first {sim_layers} layer(s), "
                   f"no overlap for any configuration")
    click.echo(f"({time.perf_counter() - t0:.1f} s)")
    if report_path:
        from pathlib import Path

        Path(report_path).write_text(json.dumps({
            "history": hist.describe(), "model": spec.name, "cluster": cl.name, "nodes": nodes, "gpus_per_node": L,
            "redundant": redundant, "policy": policy, "format": fmt, "out": out, "routing": routing,
            "dispatch": dispatch, "combine": combine, "budget_mb": budget_mb, "iters": iters, "heldout": heldout,
            "node_demand": how[0], "figures": [f.__dict__ for f in figs]}, indent=1) + "\n")
        click.echo(f"wrote {report_path} (report, every layer)")
