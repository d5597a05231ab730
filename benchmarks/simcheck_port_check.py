"""simcheck's simulated layer before and after it moved onto the shared layer builder.

    python benchmarks/simcheck_port_check.py RESULTS.json [RESULTS.json ...] [--rev a541777]

Up to commit ``a541777`` ``zepp.emulate.simcheck`` built its own task graph of the gloo
executor (``layer_graph``); now it calls ``zepp.sim.layer.build_layer`` with the record of
``zepp.emulate.glooexec``. For every cell and system of each emulate_bench results file this
simulates the same plans with both, at that file's fitted free parameters, and writes the
largest relative difference per system to ``benchmarks/results/simcheck_port_check.md``. The
old module is read from git (``git show REV:src/zepp/emulate/simcheck.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from paths import RESULTS, ROOT
from zepp.emulate import simcheck
from zepp.emulate.glooexec import gloo_mechanics
from zepp.registry import system

LEGACY_NAMES = {"zepp": "zepp-overlap"}


def old_simcheck(rev: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/zepp/emulate/simcheck.py"], check=True,
                         capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("simcheck_old", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.unlink(f.name)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--rev", default="a541777")
    ap.add_argument("--out", default=str(RESULTS / "simcheck_port_check.md"))
    args = ap.parse_args()
    old = old_simcheck(args.rev)
    md = ["# simcheck: its own task graph (before) vs the shared layer builder (after)", "",
          f"Produced by `benchmarks/simcheck_port_check.py` (old model: `{args.rev}:src/zepp/emulate/simcheck.py`). "
          "Same plans, calibration and fitted free parameters; relative difference after / before - 1 of the "
          "simulated layer (median over a cell's timed iterations), largest over the file's cells.", ""]
    for path in args.results:
        with open(path) as f:
            saved = json.load(f)
        params = {k: saved["fit"][k] for k in ("stage_overhead", "cpu_per_byte", "bw_scale")}
        worst: dict = {}
        for row in saved["rows"]:
            c = row["cell"]
            cal = saved["calibration"][c["key"]]
            wp = simcheck.worker_plans(c["cfg"])
            for name in c["cfg"]["systems"]:
                new_name = LEGACY_NAMES.get(name, name)
                s = system(new_name)
                plan_s = c["report"]["systems"][name]["median_plan_ms"] / 1e3
                before = old.simulate_system(wp["plans"][name], cal, s.overlap != "none", plan_s, params)
                after = simcheck.simulate_system(wp["plans"][name], wp["spec"], cal, gloo_mechanics(s), plan_s, params)
                worst[new_name] = max(worst.get(new_name, 0.0), abs(after / before - 1))
            print(f"{os.path.basename(path)} {c['key']} {c['model']} done", flush=True)
        md += [f"## `{os.path.relpath(path, ROOT)}` (fit: {params['stage_overhead'] * 1e3:.2f} ms per call, "
               f"{params['cpu_per_byte'] * 1e9:.2f} ns per byte)", "",
               "| " + " | ".join(worst) + " |", "|" + "---|" * len(worst),
               "| " + " | ".join(f"{v:.4%}" for v in worst.values()) + " |", ""]
        md.append(f"Largest: {max(worst.values()):.4%} (the builder adds the weighted reduce at home, "
                  f"a few microseconds here; the old graph had none).")
        md.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
