"""Planning speed: placement, routing and flow planning at 16 nodes x 4 GPUs, K2, 16 MB per GPU.

About 600k entries (64 ranks x 1168 tokens x top-8). Each stage is timed ``--repeats`` times on
one core (numpy's own threads pinned to 1) and the median is reported with entries per second.
Writes ``benchmarks/results/plan_speed.{json,md}`` (or ``--out PREFIX``). Batches come from the
recorded K2 traces (``--traces``, found by ``benchmarks/paths.py``), else from the built-in
synthetic ones.

    python benchmarks/planner/plan_speed.py [--traces ../shared/traces] [--repeats 7]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.planner.flows import build_flows  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.planner.placement import make_placement  # noqa: E402
from zepp.planner.routing import route  # noqa: E402
from zepp.traces import load_model_traces, node_demand, sample_batches  # noqa: E402


def timed(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    add_traces_option(parser)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--out", default=str(RESULTS / "plan_speed"))
    args = parser.parse_args()
    spec = model_preset("k2")
    nodes, L = args.nodes, 4
    ranks = nodes * L
    traces = find_traces(args.traces, required=False)
    if traces:
        pool, evaluation = load_model_traces(traces, "k2")
    else:
        from zepp.traces.synthetic import synthetic_traces
        pool, evaluation = synthetic_traces("k2", seed=0)
    source = str(evaluation.source)
    tokens = spec.tokens_for_budget(16)
    batch = sample_batches(evaluation, ranks, tokens, 1, 0)[0]
    entries = batch.size
    hist = node_demand(pool, nodes, L)
    relaxation = 0.5 if nodes >= 16 else 0.25
    rows = []
    for placement_name, routing_name, transport in (
        ("home", "home", "a2av"), ("home", "home", "relay"), ("eplb", "replica-rr", "a2av"),
        ("zepp", "zepp", "a2av"), ("zepp", "zepp", "zepp"),
    ):
        t_place, placement = timed(lambda: make_placement(placement_name, hist, spec.num_experts, ranks, L), args.repeats)
        t_route, routing = timed(lambda: route(routing_name, batch, placement, relaxation), args.repeats)
        t_flows, plan = timed(lambda: build_flows(routing, transport, spec.row_bytes), args.repeats)
        t_valid, _ = timed(plan.validate, 1)
        rows.append(dict(placement=placement_name, routing=routing_name, transport=transport,
                         placement_ms=t_place * 1e3, routing_ms=t_route * 1e3, flows_ms=t_flows * 1e3,
                         route_plus_flows_ms=(t_route + t_flows) * 1e3, validate_ms=t_valid * 1e3,
                         entries_per_s=entries / (t_route + t_flows), hops=plan.dispatch.size + plan.combine.size))
    info = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(), entries=entries,
                nodes=nodes, gpus_per_node=L, tokens_per_gpu=tokens, repeats=args.repeats,
                load_average=os.getloadavg(), traces=source, rows=rows)
    Path(args.out + ".json").write_text(json.dumps(info, indent=2))
    lines = [f"# Planning speed: K2, {nodes} nodes x {L} GPUs, 16 MB/GPU = {tokens} tokens, {entries:,} entries",
             "", f"Median of {args.repeats} runs, one thread; load average at the end {os.getloadavg()[0]:.1f} "
             f"on {os.cpu_count()} CPUs. Batch from {source}.", "",
             "| placement | routing | transport | placement ms | routing ms | flows ms | routing+flows ms | "
             "M entries/s | validate ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['placement']} | {r['routing']} | {r['transport']} | {r['placement_ms']:.1f} | "
                     f"{r['routing_ms']:.1f} | {r['flows_ms']:.1f} | {r['route_plus_flows_ms']:.1f} | "
                     f"{r['entries_per_s'] / 1e6:.2f} | {r['validate_ms']:.0f} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
