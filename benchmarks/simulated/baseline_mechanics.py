"""How well the simulator predicts every measured baseline column (PAPER.md section 4), calibrated
on ``a2av`` only, before and after the baseline mechanics of PAPER.md section 7; plus the phase
times section 7 reports for EPLB, set against the simulated ones (a check, not a fit).

    zepp bench --traces ../shared/traces --systems a2av,fast,comet,eplb,epic,moonep,comet+eplb \\
        --json benchmarks/results/baseline_mechanics.json
    python benchmarks/simulated/baseline_mechanics.py BEFORE.json AFTER.json [--phases] [--traces DIR]

``BEFORE.json`` / ``AFTER.json``: ``zepp bench --json`` files (real traces) holding the baseline
columns; the errors are simulated / measured - 1 per cell, as ``benchmarks/simulated/bench_report.py``
computes them. ``--phases`` simulates the EPLB and FAST phase times on the recorded traces (``--traces``,
found by ``benchmarks/paths.py``). The tables are printed; ``benchmarks/results/baseline_mechanics.md``
holds them with the notes written around them (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import add_traces_option, find_traces  # noqa: E402
from zepp.registry import PAPER_BASELINES as BASELINES  # noqa: E402


def cell_errors(path: str) -> dict[tuple, dict[str, float]]:
    """``{(nodes, model, MB): {system: simulated / measured - 1}}`` of a bench JSON file."""
    out = {}
    for r in json.load(open(path))["rows"]:
        m = r.get("measured_ms") or {}
        key = (r["nodes"], r["model"], r["budget_mb"])
        out[key] = {s: r["latency_ms"][s] / m[s] - 1 for s in BASELINES if m.get(s) and s in r["latency_ms"]}
    return out


def summary(errs: dict) -> dict[str, tuple[float, float, float, int]]:
    """Per system ``(median error, median abs error, worst error, cells)``."""
    out = {}
    for s in BASELINES:
        e = np.array([v[s] for v in errs.values() if s in v])
        if e.size:
            out[s] = (float(np.median(e)), float(np.median(np.abs(e))), float(e[np.argmax(np.abs(e))]), e.size)
    return out


def eplb_phases(traces) -> list[str]:
    """Simulated EPLB dispatch / combine phase times at K2, 1 MB, 4 / 8 / 16 nodes (one batch)
    against section 7's measured 1.5 / 2.1 / 2.9 ms and 1.1 / 1.5 / 1.7 ms."""
    from zepp.sim.bench_jobs import make_config
    from zepp.sim.run import run_system

    measured = {4: (1.5, 1.1), 8: (2.1, 1.5), 16: (2.9, 1.7)}
    lines = ["| nodes | dispatch sim / measured ms | combine sim / measured ms | barriers in the layer (sim ms) |",
             "| --- | --- | --- | --- |"]
    for n, (md, mc) in measured.items():
        cfg = make_config(dict(cluster="a100", nodes=n, model="k2", budget_mb=1, seed=0, warmup=0, iters=1,
                               traces=str(traces)))
        tl = run_system("eplb", cfg, keep_timeline=True).timeline
        lab, kind = np.array(tl.label), np.array(tl.kind)
        plan_end = tl.end[lab == "plan"].max()
        bars = np.flatnonzero(lab == "call barriers")
        d_end = tl.end[bars[1]]  # second call's barriers end the dispatch
        g2_end = tl.end[kind == "gemm"].max()
        c_end = tl.end[bars[-1]]
        lines.append(f"| {n} | {(d_end - plan_end) * 1e3:.2f} / {md} | {(c_end - g2_end) * 1e3:.2f} / {mc} | "
                     f"{(tl.end[bars] - tl.start[bars]).sum() * 1e3:.2f} |")
    return lines


def fast_phases(traces) -> list[str]:
    """Simulated FAST dispatch / combine phase times at K2, 4 nodes (one batch), over the phase's
    NIC floor (busiest NIC direction's cross-node bytes at 26 GB/s, the authors' floor model),
    against section 7's "about 1.9x (dispatch) and 3.3x (combine) above the NIC floor"."""
    from zepp import registry
    from zepp.sim.bench_jobs import make_config
    from zepp.sim.run import Shared, run_system

    lines = ["| MB | dispatch sim ms (x floor) | combine sim ms (x floor) | measured x floor |", "| --- | --- | --- | --- |"]
    for mb in (1, 4, 16):
        cfg = make_config(dict(cluster="a100", nodes=4, model="k2", budget_mb=mb, seed=0, warmup=0, iters=1,
                               traces=str(traces)))
        shared = Shared()
        tl = run_system("fast", cfg, keep_timeline=True, shared=shared).timeline
        plan = shared.plan(registry.system("fast"), cfg, 0)
        lab, R, L = np.array(tl.label), cfg.cluster.ranks, cfg.cluster.gpus_per_node
        done = tl.end[lab == "phase done"]
        spans = (done.min() - tl.end[lab == "plan"].max(), done.max() - tl.end[np.array(tl.kind) == "gemm"].max())
        cells = []
        for h, span in zip((plan.dispatch, plan.combine), spans):
            cross = (h.src // L) != (h.dst // L)
            rows = max(np.bincount(h.src[cross], minlength=R).max(), np.bincount(h.dst[cross], minlength=R).max())
            cells.append(f"{span * 1e3:.2f} ({span / (rows * cfg.spec.row_bytes / 26e9):.2f}x)")
        lines.append(f"| {mb} | {cells[0]} | {cells[1]} | 1.9x / 3.3x |")
    return lines


def report(before: str, after: str, phases: bool, traces=None) -> str:
    eb, ea = cell_errors(before), cell_errors(after)
    sb, sa = summary(eb), summary(ea)
    out = [f"Before: `{before}`; after: `{after}`. Relative error = simulated / measured - 1 per cell "
           "(18 cells per column, real traces, A100); only `a2av` is fitted.", "",
           "| system | median abs error before | after | worst before | after | median error after |",
           "| --- | --- | --- | --- | --- | --- |"]
    for s in BASELINES:
        if s in sa:
            b = sb.get(s)
            a = sa[s]
            out.append(f"| {s}{' (fitted)' if s == 'a2av' else ''} | {b[1] * 100:.1f}% | **{a[1] * 100:.1f}%** | "
                       f"{b[2] * 100:+.0f}% | {a[2] * 100:+.0f}% | {a[0] * 100:+.1f}% |")
    out += ["", "Per cell, after (before in brackets):", "",
            "| nodes | model | MB | " + " | ".join(BASELINES) + " |",
            "| --- | --- | --- | " + " | ".join("---" for _ in BASELINES) + " |"]
    for key in sorted(ea):
        cells = [f"{ea[key][s] * 100:+.0f}% ({eb.get(key, {}).get(s, float('nan')) * 100:+.0f}%)"
                 if s in ea[key] else "-" for s in BASELINES]
        out.append(f"| {key[0]} | {key[1]} | {key[2]:g} | " + " | ".join(cells) + " |")
    if phases:
        out += ["", "EPLB phase times (K2, 1 MB; PAPER.md section 7 measured):", ""] + eplb_phases(find_traces(traces))
        out += ["", "FAST phase times (K2, 4 nodes; PAPER.md section 7: about 1.9x / 3.3x the NIC floor, budget not "
                "given):", ""] + fast_phases(find_traces(traces))
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="zepp bench --json file before the change")
    ap.add_argument("after", help="zepp bench --json file after the change")
    ap.add_argument("--phases", action="store_true", help="also simulate EPLB's and FAST's phase times (recorded traces)")
    add_traces_option(ap)
    args = ap.parse_args()
    print(report(args.before, args.after, args.phases, args.traces))


if __name__ == "__main__":
    main()
