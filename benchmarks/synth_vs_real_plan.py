"""Do the built-in synthetic traces give the planner the same numbers as the real ones?

    python benchmarks/synth_vs_real_plan.py [--traces ../shared/traces] [--iters 2]

Runs ``zepp plan`` (a2av, relay, eplb, zepp; 16 MB per GPU; 4/8/16 nodes; both models) once on
the real windows and once on the built-in synthetic ones (seed 0) and writes
``benchmarks/results/synth_vs_real_plan.md``: busiest-NIC bytes, total inter-node bytes and
busiest GPU's rows side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from paths import RESULTS, add_traces_option, find_traces
from zepp.model import TRACE_DIR_OF


def plan(model: str, nodes: int, iters: int, files: tuple[str, str] | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        cmd = [sys.executable, "-m", "zepp.cli", "plan", "--model", model, "--nodes", str(nodes), "--budget-mb", "16",
               "--systems", "a2av,relay,eplb,zepp", "--iters", str(iters), "--no-validate", "--json", str(out)]
        if files:
            cmd += ["--history", files[0], "--trace", files[1]]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return {s["system"]: s for s in json.loads(out.read_text())["systems"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_traces_option(ap)
    ap.add_argument("--iters", type=int, default=2)
    args = ap.parse_args()
    traces = find_traces(args.traces)
    rows = ["# Planner on real vs built-in synthetic traces", "",
            f"`python benchmarks/synth_vs_real_plan.py --iters {args.iters}`: `zepp plan`, A100 preset, 16 MB per GPU, "
            "seed 0, history dealt to nodes by `node_demand` (shuffled). diff = synthetic / real - 1.", "",
            "| model | nodes | system | busiest NIC MB real | synth | diff | inter-node GB real | synth | diff "
            "| busiest GPU rows real | synth | diff |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in ("k2", "qwen"):
        d = traces / TRACE_DIR_OF[model]
        for nodes in (4, 8, 16):
            real = plan(model, nodes, args.iters, (str(d / "pool.txt"), str(d / "eval.txt")))
            syn = plan(model, nodes, args.iters, None)
            for name, a in real.items():
                b = syn[name]
                cells = []
                for key, scale, fmt in (("busiest_nic_bytes", 1e6, ".1f"), ("inter_node_bytes", 1e9, ".2f"),
                                        ("busiest_gpu_rows", 1, ".0f")):
                    x, y = a[key] / scale, b[key] / scale
                    cells += [f"{x:{fmt}}", f"{y:{fmt}}", f"{(y - x) / x:+.1%}"]
                rows.append(f"| {model} | {nodes} | {name} | " + " | ".join(cells) + " |")
            print(model, nodes, "done", flush=True)
    out = RESULTS / "synth_vs_real_plan.md"
    out.write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
