"""Fit the simulator's free network parameters on the measured a2av latencies (PAPER.md section 4).

    python benchmarks/fit/calibrate.py fit a100 [ROUNDS [CHECK_BATCHES]]  # -> benchmarks/results/calibration_a100.json
    python benchmarks/fit/calibrate.py fit h100     # -> benchmarks/results/calibration_h100.json
    python benchmarks/fit/calibrate.py report       # -> benchmarks/results/calibration.{json,md}

Only the a2av column (Fig. 9) and Fig. 10's a2av weak-scaling numbers are used, on the real
traces (``--traces``; by default ``../shared/traces``, see ``benchmarks/paths.py``). Each cell
is simulated on ``FIT_BATCHES`` batches (median); the final check re-simulates every cell on
``CHECK_BATCHES`` (default 10). Copy the fitted values into ``zepp.sim.calibrate.FITTED``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402

from zepp.sim.calibrate import FITTED, HARDWARE, calibrated, fit_a2av, fit_cells  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.sim.run import Config, run_system  # noqa: E402
from zepp.traces import load_model_traces, node_demand, sample_batches  # noqa: E402

OUT = RESULTS
FIT_BATCHES = 2
_traces: dict = {}


def _cfg(traces: Path, preset, nodes, model, mb, net, batches, seed=0):
    if model not in _traces:
        _traces[model] = load_model_traces(traces, model)
    pool, ev = _traces[model]
    cl, net = calibrated(preset, nodes, net)
    spec = model_preset(model)
    b = sample_batches(ev, cl.ranks, spec.tokens_for_budget(mb), batches, seed)
    return Config(cl, spec, net, node_demand(pool, nodes, cl.gpus_per_node), b, warmup=0)


def fit(traces: Path, preset: str, rounds: int = 3, check_batches: int = 10) -> None:
    cells = fit_cells(preset)
    t0 = time.time()

    def sim(cell, net):
        n, m, mb, _ = cell
        return run_system("a2av", _cfg(traces, preset, n, m, mb, net, FIT_BATCHES if n * mb <= 256 else 1)).median

    res = fit_a2av(preset, cells, sim, start=FITTED[preset], rounds=rounds)
    net = res.pop("net")
    # final check on more batches per cell
    final = []
    for c in cells:
        lat = run_system("a2av", _cfg(traces, preset, c[0], c[1], c[2], net, check_batches if c[0] * c[2] <= 256 else max(1, check_batches // 3))).median * 1e3
        final.append(dict(nodes=c[0], model=c[1], budget_mb=c[2], measured_ms=c[3], simulated_ms=lat,
                          rel_error=lat / c[3] - 1))
    err = np.array([f["rel_error"] for f in final])
    out = dict(preset=preset, hardware=HARDWARE, fitted=dict(put_c0=net.put_c0, put_c1=net.put_c1, nic_eff=net.nic_eff),
               fixed=dict(proxy_inflight=net.proxy_inflight, signal=net.signal), fit=res, check=final, check_batches=check_batches,
               check_median_abs_rel_error=float(np.median(np.abs(err))),
               check_rms_rel_error=float(np.sqrt(np.mean(err ** 2))), wall_s=time.time() - t0)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"calibration_{preset}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out["fitted"]), "median |err|", out["check_median_abs_rel_error"])


def report() -> None:
    parts = {p: json.loads((OUT / f"calibration_{p}.json").read_text()) for p in ("a100", "h100")
             if (OUT / f"calibration_{p}.json").exists()}
    (OUT / "calibration.json").write_text(json.dumps(parts, indent=1))
    lines = ["# Simulator calibration", "",
             "Free parameters fitted on the measured `a2av` latencies only (PAPER.md section 4, Fig. 9 and Fig. 10);",
             "everything else is a hardware figure as given (see `zepp/calibrate.py`).", ""]
    for p, d in parts.items():
        f = d["fitted"]
        lines += [f"## {p}", "",
                  f"- `put_c0` = {f['put_c0'] * 1e6:.1f} us, `put_c1` = {f['put_c1'] * 1e6:.3f} us per rank "
                  f"(a cross-node put costs {f['put_c0'] * 1e3 + 16 * f['put_c1'] * 1e3:.3f} ms at 16 ranks, "
                  f"{f['put_c0'] * 1e3 + 64 * f['put_c1'] * 1e3:.3f} ms at 64, {f['put_c0'] * 1e3 + 128 * f['put_c1'] * 1e3:.3f} ms at 128)",
                  f"- `nic_eff` = {f['nic_eff']:.3f} (bulk puts at {25 * f['nic_eff']:.1f} of 25 GB/s)",
                  f"- fit: {len(d['check'])} cells; check on {d['check_batches']} batches per cell (a third of that for the "
                  f"cells of 32+ node-MB x 8): median |rel error| "
                  f"{d['check_median_abs_rel_error'] * 100:.1f}%, rms {d['check_rms_rel_error'] * 100:.1f}%", "",
                  "| nodes | model | MB | measured ms | simulated ms | error |", "| --- | --- | --- | --- | --- | --- |"]
        for c in d["check"]:
            lines.append(f"| {c['nodes']} | {c['model']} | {c['budget_mb']:g} | {c['measured_ms']:.2f} | "
                         f"{c['simulated_ms']:.2f} | {c['rel_error'] * 100:+.1f}% |")
        lines.append("")
    (OUT / "calibration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("fit", "report"))
    ap.add_argument("preset", nargs="?", help="fit: the cluster preset (a100, h100)")
    ap.add_argument("rounds", nargs="?", type=int, default=3, help="fit: rounds of the fit (default 3)")
    ap.add_argument("check_batches", nargs="?", type=int, default=10, help="fit: batches per cell in the final check (default 10)")
    add_traces_option(ap)
    args = ap.parse_args()
    if args.mode == "report":
        report()
        return
    if not args.preset:
        ap.error("fit needs a preset (a100 or h100)")
    fit(find_traces(args.traces), args.preset, args.rounds, args.check_batches)


if __name__ == "__main__":
    main()
