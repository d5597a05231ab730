"""Inter-node bytes of each system's plan on the real traces (issue 2's table).

For K2 and Qwen, 4/8/16 nodes x 4 GPUs, 1/4/16 MB per GPU: plans ``--iters`` sampled batches
per system and reports the busiest NIC's bytes (send or receive, dispatch + combine), total
inter-node bytes and their ratios to ``a2av``. The first batch of every system is validated.
Writes ``benchmarks/results/plan_bytes.{json,md}``.

    python benchmarks/planner/plan_bytes.py [--traces ../shared/traces] [--iters 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.sim.plan_report import plan_table  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.planner.routing import default_relaxation  # noqa: E402
from zepp.traces import load_model_traces  # noqa: E402

SYSTEMS = ["a2av", "relay", "eplb", "sglang", "epic", "zepp-a2av", "zepp-relay", "zepp"]


def main() -> None:
    parser = argparse.ArgumentParser()
    add_traces_option(parser)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "plan_bytes"))
    args = parser.parse_args()
    traces = find_traces(args.traces)
    results = []
    for model in ("k2", "qwen"):
        spec = model_preset(model)
        pool, evaluation = load_model_traces(traces, model)
        for nodes in (4, 8, 16):
            for mb in (1, 4, 16):
                rows = plan_table(spec, nodes, 4, mb, pool, evaluation, SYSTEMS, args.iters, seed=0,
                                  relaxation=default_relaxation(nodes), extra=2, validate="first")
                results.append(dict(model=model, nodes=nodes, budget_mb=mb, systems=rows))
                base = rows[0]
                print(f"{model} {nodes:2d} nodes {mb:2d} MB: " + "  ".join(
                    f"{r['system']} {r['busiest_nic_bytes'] / base['busiest_nic_bytes']:.3f}" for r in rows), flush=True)
    Path(args.out + ".json").write_text(json.dumps(results, indent=1))
    lines = ["# Busiest-NIC bytes per plan, real traces (`../shared/traces`)", "",
             f"Mean over {args.iters} sampled batches (seed 0); 4 GPUs per node; C = 0.25 (0.5 at 16 nodes); "
             "2 redundant slots per GPU for replicating placements. Busiest NIC = the largest bytes any NIC "
             "sends or receives over dispatch + combine. Ratios are to `a2av` in the same row.", "",
             "Systems: `a2av` home/home/direct; `relay` home/home/relay (merge, no split, no pre-reduce); `eplb` "
             "EPLB global placement + replica round-robin + direct; `sglang` EPLB + SGLang static dispatch (sglang-static) + direct; "
             "`epic` EPIC placement + fixed routing (source mod replica count) + relay dispatch, pre-reduced combine straight to the owner; `zepp-a2av` Zepp placement + routing + direct; "
             "`zepp-relay` Zepp placement + routing + relay; `zepp` everything (split, coalescing, pre-reduce).", "",
             "| model | nodes | MB | a2av busiest NIC MB | " + " | ".join(SYSTEMS[1:]) + " | merge saving (relay vs a2av, total inter-node) | zepp total inter-node vs a2av |",
             "|---|---|---|---|" + "---|" * (len(SYSTEMS) - 1) + "---|---|"]
    for res in results:
        rows = {r["system"]: r for r in res["systems"]}
        a = rows["a2av"]
        ratios = " | ".join(f"{rows[s]['busiest_nic_bytes'] / a['busiest_nic_bytes']:.3f}" for s in SYSTEMS[1:])
        merge = 1 - rows["relay"]["inter_node_bytes"] / a["inter_node_bytes"]
        zt = rows["zepp"]["inter_node_bytes"] / a["inter_node_bytes"]
        lines.append(f"| {res['model']} | {res['nodes']} | {res['budget_mb']} | {a['busiest_nic_bytes'] / 1e6:.2f} | "
                     f"{ratios} | {merge:.1%} | {zt:.3f} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
