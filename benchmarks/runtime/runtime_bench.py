"""Wall-clock per MoE layer of the real runtime (gloo, local processes), zepp against a2av.

Every configuration runs all systems in one process group, iteration by iteration
(interleaved), so each system sees the same machine load; per iteration the slowest rank's
time counts, and the table reports the median over the timed iterations. The timed window
covers the id/weight all-gather, routing and flow planning, dispatch, expert GEMMs and combine.

This is loopback TCP on one machine: "NIC" and "NVLink" bytes cost the same here, so the
ratio measures executor overheads (stages, messages, planning), not the network savings that
the inter-node byte columns show. The emulated cluster (zepp.emulate) is where NIC bytes are
scarce.

    python benchmarks/runtime/runtime_bench.py [--quick] [--traces DIR] [--out benchmarks/results/runtime_bench]

Batches come from the recorded traces (``--traces``, found by ``benchmarks/paths.py``), else from
the built-in synthetic ones; the table names its source.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.launch.ranks import spawn_local  # noqa: E402
from zepp.runtime.worker import default_config  # noqa: E402

WORKER = "zepp.runtime.worker"  # what every rank runs (as ``zepp run``'s ranks)

SYSTEMS = ["a2av", "eplb", "relay", "zepp-overlap", "zepp-sync", "zepp-a2av"]


def _trace_files(traces: Path | None, tdir: str) -> dict:
    """``history`` / ``trace`` of one model's recorded traces, or ``{}`` (built-in synthetic)."""
    if traces is None or not (traces / tdir / "eval.txt").is_file():
        return {}
    return {"history": str(traces / tdir / "pool.txt"), "trace": str(traces / tdir / "eval.txt")}


def configs(quick: bool, traces: Path | None) -> list[dict]:
    out = []
    for model, tdir in (("k2", "k2"), ("qwen", "qwen3")):
        files = _trace_files(traces, tdir)
        for mb in ((1.0,) if quick else (1.0, 2.0)):
            out.append(dict(nodes=2, gpus_per_node=2, model=model, hidden=1024, ffn=64, budget_mb=mb, **files))
    if not quick:
        f = _trace_files(traces, "k2")
        out.append(dict(nodes=2, gpus_per_node=4, model="k2", hidden=1024, ffn=64, budget_mb=1.0, **f))
    return out


def table(raw: list[dict]) -> list[str]:
    """Markdown rows (one per configuration and system) from the reports of ``spawn_local``."""
    lines = ["| ranks | model | MB | tokens/rank | system | layer ms | speedup vs a2av | plan ms | NIC MB | NVLink MB "
             "| correct | bytes==plan |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rep in raw:
        c = rep["config"]
        base = rep["systems"]["a2av"]["median_layer_ms"]
        for name, s in rep["systems"].items():
            b = s["bytes_per_iter"]
            n = len(b["measured_dispatch_nic"])
            nic = (sum(b["measured_dispatch_nic"]) + sum(b["measured_combine_nic"])) / n / 2**20
            nvl = (sum(b["measured_dispatch_nvlink"]) + sum(b["measured_combine_nvlink"])) / n / 2**20
            lines.append(
                f"| {c['nodes']}x{c['gpus_per_node']} | {c['model']} | {c['budget_mb']:g} | {rep['tokens_per_rank']} | "
                f"{name} | {s['median_layer_ms']:.1f} | {base / s['median_layer_ms']:.2f} | "
                f"{s['median_plan_ms']:.1f} | "
                f"{nic:.2f} | {nvl:.2f} | {'yes' if s['correct'] else 'NO'} | {'yes' if s['bytes_match'] else 'NO'} |")
    names = list(raw[0]["systems"])
    gm = {n: float(np.exp(np.mean([np.log(r["systems"]["a2av"]["median_layer_ms"] / r["systems"][n]["median_layer_ms"])
                                   for r in raw]))) for n in names}
    lines += ["", "Geometric-mean speedup over a2av across the configurations: "
              + ", ".join(f"{n} {gm[n]:.2f}x" for n in names) + "."]
    return lines


def _sources(raw: list[dict]) -> str:
    return ", ".join(sorted({(r.get("traces") or {}).get("eval", "?") for r in raw}))


def header(where: str, iters: int, traces: str) -> list[str]:
    return [
        "# Runtime wall-clock per MoE layer (gloo, local processes)",
        "",
        f"{where}. {iters} timed iterations after 3 warm-up; median over iterations of the slowest rank; "
        "systems interleaved per iteration. H=1024, FFN=64 (communication-heavy shapes that fit on a CPU), fp32, "
        f"{traces}. `speedup` = a2av time / system time (same run). NIC / NVLink = measured payload bytes per "
        "iteration, all ranks, both phases (equal to the planner's: `bytes==plan`). `zepp` = zepp placement + "
        "routing + transport with overlap; `zepp-sync` = the same without overlap.",
        "",
        "Loopback TCP: inter-node and intra-node bytes cost the same here, so times measure the executor "
        "(stages, messages, planning, Python, copies) more than the network savings the NIC column shows.",
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer configurations and iterations")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--out", default=str(RESULTS / "runtime_bench"))
    ap.add_argument("--render", default=None, help="only re-render OUT.md from this JSON (with --where)")
    ap.add_argument("--where", default=None, help="where the JSON was measured (for --render)")
    add_traces_option(ap)
    args = ap.parse_args()
    out = Path(args.out)
    if args.render:
        raw = json.loads(Path(args.render).read_text())
        it = len(next(iter(raw[0]["systems"].values()))["layer_ms"])
        src = _sources(raw)
        lines = header(args.where or "Measured elsewhere", it, f"batches from {src}") + table(raw)
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return
    iters = args.iters or (5 if args.quick else 10)
    raw = []
    for c in configs(args.quick, find_traces(args.traces, required=False)):
        cfg = default_config()
        cfg.update(c, systems=SYSTEMS, iters=iters, warmup=3, check=True, interleave=True, timeout=300)
        load0 = os.getloadavg()[0]
        t0 = time.time()
        rep = spawn_local(WORKER, cfg)
        rep["wall_s"] = time.time() - t0
        rep["loadavg_before"] = load0
        raw.append(rep)
        print(f"done {c['model']} {c['nodes']}x{c['gpus_per_node']} {c['budget_mb']} MB in {rep['wall_s']:.0f} s",
              flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    loads = ", ".join(f"{r['loadavg_before']:.1f}" for r in raw)
    where = (f"Generated by `python benchmarks/runtime/runtime_bench.py{' --quick' if args.quick else ''}` on "
             f"{platform.node()} ({os.cpu_count()} cores, 1-minute load average before each configuration: {loads}), "
             f"{time.strftime('%Y-%m-%d %H:%M')}")
    src = _sources(raw)
    lines = header(where, iters, f"batches from {src}") + table(raw)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
