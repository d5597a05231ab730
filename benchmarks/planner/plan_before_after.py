"""Zepp's plan before and after issue 28 (decisions on counts), on this machine, interleaved.

Times Zepp's routing and flows (K2, 16 nodes x 4 GPUs, 16 MB per GPU, recorded traces, one CPU
thread, CPU milliseconds of the process, median of 7 after one warm-up) in a checkout of the code
before issue 28 (``--old-src``: its ``src`` folder, e.g. a ``git worktree`` of 196459d) and in this
one, each in its own process, the two alternated ``--rounds`` times; one ``np.bincount`` over the
same entries is timed in every process. Before: the routing (water-fill with its per-entry
assignment, then the vacate pass) and the flows as per-row hop tables; after: the routing on counts
and the flows' volumes.

    git worktree add /tmp/zepp-196459d 196459d
    python benchmarks/planner/plan_before_after.py --old-src /tmp/zepp-196459d/src --traces ../shared/traces

writes ``benchmarks/results/plan_before_after.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, ROOT, add_traces_option, find_traces  # noqa: E402

CHILD = r'''
import os, sys, time, statistics, json
import numpy as np
from zepp.model import model_preset
from zepp.planner.placement import make_placement
from zepp.planner.routing import route
from zepp.planner.flows import build_flows
from zepp.traces import load_model_traces, node_demand, sample_batches
old, traces = sys.argv[1] == "before", sys.argv[2]
spec, nodes, L = model_preset("k2"), 16, 4
pool, ev = load_model_traces(traces, "k2")
batch = sample_batches(ev, nodes * L, spec.tokens_for_budget(16), 1, 0)[0]
pl = make_placement("zepp", node_demand(pool, nodes, L), spec.num_experts, nodes * L, L)
def t(fn, n=7):
    fn()
    out = []
    for _ in range(n):
        a = time.process_time(); fn(); out.append((time.process_time() - a) * 1e3)
    return statistics.median(out)
res = {}
r = route("zepp", batch, pl, 0.25)
if old:
    from zepp.planner.routing.zepp_routing import water_fill
    from zepp.planner.routing.zepp_vacate import vacate
    s0 = water_fill(batch, pl, 0.25)
    res["water-fill and assignment"] = t(lambda: water_fill(batch, pl, 0.25))
    res["vacate pass (3 rounds)"] = t(lambda: vacate(batch, s0, pl, 0.25, 3))
    res["flows"] = t(lambda: build_flows(r, "zepp", spec.row_bytes, "reduce"))
else:
    res["flows"] = t(lambda: build_flows(r, "zepp", spec.row_bytes, "reduce").volumes)
res["routing"] = t(lambda: route("zepp", batch, pl, 0.25))
res["bincount"] = t(lambda: np.bincount(batch.ravel(), minlength=spec.num_experts))
print(json.dumps(res))
'''


def run(which: str, src: str, traces: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, which, traces], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-src", required=True, help="the src folder of a checkout before issue 28")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "plan_before_after"))
    add_traces_option(ap)
    args = ap.parse_args()
    traces = str(find_traces(args.traces, required=True))
    load = [os.getloadavg()[0]]
    runs = {"before": [], "after": []}
    for _ in range(args.rounds):
        runs["before"].append(run("before", args.old_src, traces))
        runs["after"].append(run("after", str(ROOT / "src"), traces))
    load.append(os.getloadavg()[0])
    med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()}
    Path(args.out + ".json").write_text(json.dumps(dict(runs=runs, median=med, load=load, old_src=args.old_src),
                                                   indent=1))
    b, a = med["before"], med["after"]
    lines = ["# Zepp's plan before and after issue 28 (interleaved, this machine)", "",
             f"`python benchmarks/planner/plan_before_after.py --old-src {args.old_src}`: K2, 16 nodes x 4 GPUs, "
             f"16 MB per GPU, recorded traces, one thread, CPU ms (median of 7 per process, then the median of "
             f"{args.rounds} alternated processes each); load average {load[0]:.1f} at the start, {load[1]:.1f} at "
             "the end. Before: 196459d (water-fill with per-entry assignment, vacate pass, per-row hop tables); "
             "after: this checkout (routing on counts, the flows' volumes).", "",
             "| part | before ms | after ms | after / before |", "|---|---|---|---|"]
    for k in ("routing", "flows"):
        lines.append(f"| {k} | {b[k]:.1f} | {a[k]:.1f} | {a[k] / b[k]:.2f}x |")
    lines.append(f"| plan (routing + flows) | {b['routing'] + b['flows']:.1f} | {a['routing'] + a['flows']:.1f} | "
                 f"{(a['routing'] + a['flows']) / (b['routing'] + b['flows']):.2f}x |")
    lines.append(f"| one np.bincount (floor) | {b['bincount']:.2f} | {a['bincount']:.2f} | |")
    lines += ["", f"Before, inside the routing: water-fill and assignment {b['water-fill and assignment']:.1f} ms, "
              f"vacate pass {b['vacate pass (3 rounds)']:.1f} ms (after: `plan_speed.md` step by step)."]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
