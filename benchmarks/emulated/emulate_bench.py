"""Measured speedups on the emulated cluster, and the simulator against them.

    python benchmarks/emulated/emulate_bench.py [--rates 1000,500] [--iters 8] [--shapes 2x2,4x2] [--models k2,qwen]

For 2 nodes x 2 ranks and 4 nodes x 2 ranks at NIC rates 1000 Mbit/s (the emulator's default)
and 500 Mbit/s (one emulated cluster per rate and shape, ``zepp.emulate``),
K2 and Qwen ids from the recorded traces (``--traces``, found by ``benchmarks/paths.py``;
history = ``pool.txt``, batches from ``eval.txt``),
the runtime (``zepp run --emulate`` path: ``zepp.emulate.launcher.run_emulated``) runs a2av, eplb,
relay, zepp-overlap, zepp-sync, zepp-a2av and zepp-direct interleaved iteration by iteration (so every
system sees the same machine load), checked against the reference. Shrunk layer (``--hidden``
1024, ``--ffn`` 16, fp32: 4 KB rows, little compute) so the NIC, not the 2 CPU cores, is what
the systems differ in. Per cell: median over iterations of the slowest rank's layer time, NIC
bytes from the interface counters next to the planner's.

Then the simulator (``zepp.emulate.simcheck``: the simulator's layer builder with the gloo
executor's record, ``zepp.emulate.glooexec``): links and expert compute calibrated on each
cluster, two free parameters (per-call CPU overhead, CPU cost per byte) fitted on the a2av cells
only, every system simulated on the same batches. Writes ``<out>.{md,json}`` (``--out``, default
``benchmarks/results/emulate_bench``), with ``<out>.notes.md`` appended to the ``.md`` where it
exists. The published runs are ``emulate_bench_quiet.*`` and ``emulate_bench_loaded.*``
(``benchmarks/README.md``).

``--resim FILE.json`` re-runs only the simulator on saved measurements; ``--before FILE.json``
adds the simulated figures saved in that file (an earlier model) next to the new ones, cell by
cell when both files hold the same measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.emulate.topology import EmulatedCluster, availability  # noqa: E402
from zepp.emulate.launcher import run_emulated  # noqa: E402
from zepp.emulate.simcheck import calibrate, fit_free_parameters, simulate_system, worker_plans  # noqa: E402
from zepp.emulate.glooexec import gloo_mechanics  # noqa: E402
from zepp.runtime.systems import SYSTEMS  # noqa: E402
from zepp.runtime.worker import default_config  # noqa: E402

MODELS = {"k2": "k2", "qwen": "qwen3"}
SYSTEM_NAMES = ["a2av", "eplb", "relay", "zepp-overlap", "zepp-sync", "zepp-a2av", "zepp-direct"]
ZEPP_VARIANTS = ["zepp-overlap", "zepp-sync", "zepp-a2av", "zepp-direct"]
# results written before the registry named the overlap variant "zepp-overlap" call it "zepp"
LEGACY_NAMES = {"zepp": "zepp-overlap"}
OTHERS = ["a2av", "eplb", "relay"]
OUT = str(RESULTS)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1000,500", help="NIC rates (Mbit/s) to run, comma list")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default="2x2,4x2")
    ap.add_argument("--models", default="k2,qwen")
    ap.add_argument("--out", default=os.path.join(OUT, "emulate_bench"))
    ap.add_argument("--resim", default=None, help="re-run only the simulator on this saved JSON")
    ap.add_argument("--before", default=None, help="a results JSON whose simulated figures to show as 'before'")
    ap.add_argument("--prefix", default="zbench", help="name prefix of the emulated clusters' namespaces")
    add_traces_option(ap)
    args = ap.parse_args()
    if args.resim:
        return resimulate(args.resim, args)
    args.traces = str(find_traces(args.traces))
    ok, reason = availability()
    if not ok:
        print(f"emulate_bench: {reason}", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    cells, cals = [], {}
    for rate, shape in [(float(r), s) for r in args.rates.split(",") for s in args.shapes.split(",")]:
        N, L = (int(v) for v in shape.split("x"))
        key = f"{shape}@{rate:g}"
        with EmulatedCluster(N, L, rate_mbit=rate, prefix=args.prefix) as cl:
            t0 = time.monotonic()
            cal = calibrate(cl, args.hidden, args.ffn,
                            link_kwargs={"sizes": (65536, 1 << 20, 4 << 20), "reps": 4, "trials": 2})
            cal["seconds"] = time.monotonic() - t0
            cals[key] = cal
            f = cal["cluster_fields"]
            print(f"[{key}] calibrated in {cal['seconds']:.0f}s: NIC {f['nic_bw'] / 1e6:.0f} MB/s "
                  f"{f['nic_msg_cost'] * 1e6:.0f} us, NVLink {f['nvlink_bw'] / 1e6:.0f} MB/s "
                  f"{f['nvlink_msg_cost'] * 1e6:.0f} us, compute {cal['compute']}", flush=True)
            for model in args.models.split(","):
                cfg = default_config()
                cfg.update(nodes=N, gpus_per_node=L, model=model, hidden=args.hidden, ffn=args.ffn,
                           tokens=args.tokens, systems=SYSTEM_NAMES, iters=args.iters, warmup=args.warmup,
                           check=True, timeout=60.0, interleave=True,
                           history=f"{args.traces}/{MODELS[model]}/pool.txt",
                           trace=f"{args.traces}/{MODELS[model]}/eval.txt")
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                rep = run_emulated(cfg, rate, cluster=cl)
                cell = {"key": key, "rate_mbit": rate, "shape": shape, "nodes": N, "gpus_per_node": L, "model": model, "tokens": args.tokens,
                        "hidden": args.hidden, "ffn": args.ffn, "seconds": time.monotonic() - t0,
                        "load_before": load0, "load_after": os.getloadavg()[0], "cfg": cfg, "report": rep}
                cells.append(cell)
                print(f"[{key} {model}] {cell['seconds']:.0f}s load {load0:.1f}->{cell['load_after']:.1f}: "
                      + ", ".join(f"{s} {rep['systems'][s]['median_layer_ms']:.0f}ms" for s in SYSTEM_NAMES),
                      flush=True)
    t_run = time.monotonic() - t_start
    fit = simulate_cells(cells, cals)
    write(args, cells, cals, fit, t_run, time.monotonic() - t_start)
    return 0


def simulate_cells(cells: list[dict], cals: dict) -> dict:
    """Fit the two free parameters on the a2av cells only, then simulate every system of every
    cell (``cell["sim_ms"]``). Returns the fit."""
    for c in cells:
        wp = worker_plans(c["cfg"])
        c["plans"], c["spec"] = wp["plans"], wp["spec"]
    a2av_cases = [{"plans": c["plans"]["a2av"], "spec": c["spec"], "key": c["key"],
                   "plan_s": c["report"]["systems"]["a2av"]["median_plan_ms"] / 1e3,
                   "measured_s": c["report"]["systems"]["a2av"]["median_layer_ms"] / 1e3} for c in cells]
    fit = fit_free_parameters(a2av_cases, lambda k: cals[k])
    print(f"fit on a2av: {fit}", flush=True)
    params = {k: fit[k] for k in ("stage_overhead", "cpu_per_byte", "bw_scale")}
    for c in cells:
        c["sim_ms"] = {}
        for s in SYSTEM_NAMES:
            c["sim_ms"][s] = 1e3 * simulate_system(
                c["plans"][s], c["spec"], cals[c["key"]], gloo_mechanics(SYSTEMS[s]),
                c["report"]["systems"][s]["median_plan_ms"] / 1e3, params)
        del c["plans"], c["spec"]
    return fit


def resimulate(path: str, args) -> int:
    """``--resim FILE.json``: the simulator part again on saved measurements (no cluster needed)."""
    with open(path) as f:
        saved = json.load(f)
    a = argparse.Namespace(**{**vars(args), **saved["args"]})
    a.out, a.before = args.out, args.before
    cells = [_renamed(row["cell"]) for row in saved["rows"]]
    a.traces = os.path.dirname(os.path.dirname(cells[0]["cfg"]["history"]))  # where the measured ids came from
    fit = simulate_cells(cells, saved["calibration"])
    write(a, cells, saved["calibration"], fit, saved["seconds"]["runs"], saved["seconds"]["total"])
    return 0


def _renamed(cell: dict) -> dict:
    """A saved cell with ``LEGACY_NAMES`` replaced (the same system under its registry name)."""
    ren = lambda names: [LEGACY_NAMES.get(n, n) for n in names]  # noqa: E731
    ren_d = lambda d: {LEGACY_NAMES.get(k, k): v for k, v in d.items()}  # noqa: E731
    if not any(n in LEGACY_NAMES for n in cell["cfg"]["systems"]):
        return cell
    out = dict(cell, cfg=dict(cell["cfg"], systems=ren(cell["cfg"]["systems"])),
               report=dict(cell["report"], systems=ren_d(cell["report"]["systems"])))
    out["report"]["emulate"] = dict(cell["report"]["emulate"], systems=ren_d(cell["report"]["emulate"]["systems"]))
    return out


def _before(path: str | None) -> dict:
    """``{(key, model): {system: sim ms}}`` and the measured ms from a results JSON (``--before``)."""
    if not path:
        return {}
    with open(path) as f:
        saved = json.load(f)
    return {(r["key"], r["model"]): {"sim_ms": {LEGACY_NAMES.get(k, k): v for k, v in r["sim_ms"].items()},
                                     "measured_ms": {LEGACY_NAMES.get(k, k): v for k, v in r["measured_ms"].items()}}
            for r in saved["rows"]}


def _before_after(args, rows: list[dict], errs: dict) -> list[str]:
    """Median abs error per system of ``--before``'s simulated figures and of this run's."""
    before = _before(args.before)
    if not before:
        return []
    same = all((r["key"], r["model"]) in before and all(
        abs(before[(r["key"], r["model"])]["measured_ms"][s] - r["measured_ms"][s]) < 1e-9 for s in SYSTEM_NAMES)
        for r in rows)
    out = ["## The simulator before and after (median abs error per system)", "",
           f"Before: the simulated figures saved in `{os.path.basename(args.before)}`, against "
           + ("the same measurements." if same else "that file's own measurements (another run)."), "",
           "| model | " + " | ".join(SYSTEM_NAMES) + " |", "|---|" + "---|" * len(SYSTEM_NAMES)]
    b_err = {s: [v["sim_ms"][s] / v["measured_ms"][s] - 1 for v in before.values() if s in v["sim_ms"]]
             for s in SYSTEM_NAMES}
    out.append("| before | " + " | ".join(f"{np.median(np.abs(b_err[s])):.1%}" if b_err[s] else "-"
                                          for s in SYSTEM_NAMES) + " |")
    out.append("| after | " + " | ".join(f"{np.median(np.abs(errs[s])):.1%}" for s in SYSTEM_NAMES) + " |")
    if same:
        d = [abs(r["sim_ms"][s] / before[(r["key"], r["model"])]["sim_ms"][s] - 1) for r in rows for s in SYSTEM_NAMES
             if s in before[(r["key"], r["model"])]["sim_ms"]]
        out += ["", f"Largest change of a simulated cell, after vs before: {max(d):.2%}."]
    return out + [""]


def write(args, cells, cals, fit, t_run, t_total) -> None:
    rows = []
    md = [f"# Emulated cluster: measured layer latency and the simulator ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Machine: {os.cpu_count()} CPU cores, shared with other workers; load average (1 min) during the runs "
          f"{min(c['load_before'] for c in cells):.1f}-{max(c['load_after'] for c in cells):.1f}. "
          f"NIC {args.rates} Mbit/s per direction (tbf; one cluster per rate and shape), NVLink = unshaped veth. Layer: H={args.hidden}, "
          f"FFN={args.ffn}, fp32 (rows of {4 * args.hidden} B), {args.tokens} tokens per rank, top-8, "
          f"ids from {args.traces} (placement history pool.txt, batches eval.txt). "
          f"{args.iters} timed iterations after {args.warmup} warm-up, systems interleaved per iteration; "
          "per cell the median over iterations of the slowest rank's layer time (ms). Every cell was checked "
          "against the single-process reference (fp32, rel. err <= 1e-5) and its measured bytes against the "
          f"planner's. Wall time: runs {t_run:.0f} s, total {t_total:.0f} s.", "",
          "`zepp` (best) is the best of Zepp's variants (overlap `zepp-overlap`, blocking `zepp-sync`, Zepp placement "
          "and routing over plain all-to-all-v `zepp-a2av`, and `zepp-direct`: `zepp-sync` whose pre-reduced "
          "combine rows cross the NIC straight to the owner, one collective stage fewer), as the paper's "
          "\"Zepp\" is the best of its variants.",
          "", "## Measured latency per layer (ms)", "",
          "| NIC Mbit/s | nodes x ranks | model | " + " | ".join(SYSTEM_NAMES)
          + " | zepp (best) | speedup vs a2av | vs fastest other |", "|---|---|---|" + "---|" * (len(SYSTEM_NAMES) + 3)]
    for c in cells:
        m = {s: c["report"]["systems"][s]["median_layer_ms"] for s in SYSTEM_NAMES}
        best_z = min(ZEPP_VARIANTS, key=lambda s: m[s])
        best_o = min(OTHERS, key=lambda s: m[s])
        row = {"key": c["key"], "rate_mbit": c["rate_mbit"], "shape": c["shape"], "model": c["model"], "measured_ms": m, "zepp_best": best_z,
               "zepp_best_ms": m[best_z], "speedup_vs_a2av": m["a2av"] / m[best_z],
               "fastest_other": best_o, "speedup_vs_fastest_other": m[best_o] / m[best_z],
               "correct": {s: c["report"]["systems"][s]["correct"] for s in SYSTEM_NAMES},
               "bytes_match": {s: c["report"]["systems"][s]["bytes_match"] for s in SYSTEM_NAMES},
               "layer_ms_all": {s: c["report"]["systems"][s]["layer_ms"] for s in SYSTEM_NAMES},
               "plan_ms": {s: c["report"]["systems"][s]["median_plan_ms"] for s in SYSTEM_NAMES},
               "nic": c["report"]["emulate"]["systems"], "sim_ms": c["sim_ms"],
               "load": [c["load_before"], c["load_after"]], "seconds": c["seconds"],
               "cell": {k: v for k, v in c.items() if k not in ("sim_ms", "plans")}}
        rows.append(row)
        md.append(f"| {c['rate_mbit']:g} | {c['shape']} | {c['model']} | " + " | ".join(f"{m[s]:.1f}" for s in SYSTEM_NAMES)
                  + f" | {m[best_z]:.1f} ({best_z}) | {row['speedup_vs_a2av']:.2f}x | "
                  f"{row['speedup_vs_fastest_other']:.2f}x (vs {best_o}) |")
    sp = [r["speedup_vs_a2av"] for r in rows]
    so = [r["speedup_vs_fastest_other"] for r in rows]
    md += ["", f"Geometric mean: {np.exp(np.mean(np.log(sp))):.2f}x over a2av, {np.exp(np.mean(np.log(so))):.2f}x "
               "over the fastest other system (goal: >= 1.5x over a2av).", "",
           "## Bytes per NIC per iteration (KB): interface counters vs planner", "",
           "Counters are wire bytes (Ethernet/IP/TCP headers, ACKs, one barrier and the id/weight all-gather "
           "included); planned = the planner's dispatch + combine payload. Busiest NIC (send side) and the sum "
           "over NICs.", "",
           "| NIC Mbit/s | nodes x ranks | model | system | busiest NIC measured | busiest planned | "
           "all NICs measured | all planned (+ metadata) | measured / planned |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for s in SYSTEM_NAMES:
            e = r["nic"][s]
            tx, pn = np.array(e["nic_tx"]), np.array(e["planned_nic"])
            allp = pn.sum() + e["metadata_nic"]
            md.append(f"| {r['rate_mbit']:g} | {r['shape']} | {r['model']} | {s} | {tx.max() / 1024:.0f} | {pn.max() / 1024:.0f} | "
                      f"{tx.sum() / 1024:.0f} | {pn.sum() / 1024:.0f} (+{e['metadata_nic'] / 1024:.0f}) | "
                      f"{tx.sum() / allp:.3f} |")
    md += ["", "## Simulated against measured (ms, relative error = sim / measured - 1)", "",
           "Calibration per cluster (links: `zepp.emulate.linkcal`, gloo send/recv; compute: the runtime's "
           "grouped GELU MLP timed in all ranks at once, least squares `t = c_group * groups + c_row * rows`):", ""]
    for key, cal in cals.items():
        f, comp = cal["cluster_fields"], cal["compute"]
        md.append(f"- {key}: NIC {f['nic_bw'] / 1e6:.0f} MB/s, {f['nic_msg_cost'] * 1e6:.0f} us/message; "
                  f"NVLink veth {f['nvlink_bw'] / 1e6:.0f} MB/s, {f['nvlink_msg_cost'] * 1e6:.0f} us/message; "
                  f"GEMM up {comp['up'][0] * 1e6:.1f} us/group + {comp['up'][1] * 1e6:.2f} us/row, down "
                  f"{comp['down'][0] * 1e6:.1f} us/group + {comp['down'][1] * 1e6:.2f} us/row "
                  f"(fit rel. RMS {comp['rel_rms']['up']:.0%}/{comp['rel_rms']['down']:.0%})")
    md += ["", f"Free parameters, fitted on the a2av cells only: per-stage overhead {fit['stage_overhead'] * 1e3:.2f} "
               f"ms per all_to_all per rank, CPU cost {fit['cpu_per_byte'] * 1e9:.2f} ns per byte sent + received "
               "per rank (times the ranks per core); link rates as calibrated (no scale). Planning "
               "time per system is an input (the worker's measured median plan ms of that cell), not predicted.", "",
           "| NIC Mbit/s | nodes x ranks | model | " + " | ".join(SYSTEM_NAMES) + " |",
           "|---|---|---|" + "---|" * len(SYSTEM_NAMES)]
    errs = {s: [] for s in SYSTEM_NAMES}
    for r in rows:
        cells_txt = []
        for s in SYSTEM_NAMES:
            e = r["sim_ms"][s] / r["measured_ms"][s] - 1
            errs[s].append(e)
            flag = " **" if abs(e) > 0.25 else ""
            cells_txt.append(f"{r['sim_ms'][s]:.1f} / {r['measured_ms'][s]:.1f} ({e:+.0%}){flag}")
        md.append(f"| {r['rate_mbit']:g} | {r['shape']} | {r['model']} | " + " | ".join(cells_txt) + " |")
    md.append("| median abs error | | | " + " | ".join(f"{np.median(np.abs(errs[s])):.0%}" for s in SYSTEM_NAMES)
              + " |")
    md += ["", "Cells marked ** disagree by more than 25%; reasons: see the notes below.", ""]
    md += _before_after(args, rows, errs)
    with open(args.out + ".json", "w") as f:
        json.dump({"args": vars(args), "rows": rows, "calibration": cals, "fit": fit,
                   "seconds": {"runs": t_run, "total": t_total}}, f, indent=1, default=float)
    notes = args.out + ".notes.md"
    if os.path.exists(notes):
        with open(notes) as f:
            md += [f.read()]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
