"""Record how many planner "op-mix rounds" each part of Zepp's planner costs, for the
simulator's deterministic planning-cost model (``zepp.sim.planning_cost``).

    python benchmarks/fit/planner_cost.py [--out FILE]   # writes src/zepp/data/planner_cost.json

``flows:<dispatch>/<combine>`` is a plan's flows as the planner decides them (``FlowPlan.volumes``,
from the routing's counts); ``hops:<dispatch>/<combine>`` the per-row hop tables an executor runs
(``FlowPlan.hop_tables``), built only where one reads them.

The planner is a sequence of whole-array passes over a batch's entries (sorts, histograms,
gathers, prefix sums, binary searches, masks). A fixed mix of those passes (``opmix``) is timed
with numpy on one core next to each planner part, in the same process and moment, at the entry
counts of the paper's table (K2 and Qwen, 4-16 nodes, 1-16 MB); the ratio ``part / mix`` is how
many rounds of the mix the part costs. Load from other processes slows both alike, so the ratio
is stable where the time is per-entry work (above ~100k entries; below it Python overhead of
the numpy calls dominates, which a GPU port does not pay). The recorded count per part is the
median ratio over the sizes with at least ``MIN_ENTRIES`` entries. The simulator multiplies it
by the mix's GPU time at the batch's size (``gpu_opmix`` in the same file: measured on an H200,
benchmarks/results/calibration_planner_gpu_pipelined.json). No wall-clock reaches a simulated
result: the file is data, written once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import DATA, RESULTS  # noqa: E402

from zepp.planner.flows import build_flows  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.planner.placement import make_placement  # noqa: E402
from zepp.planner.routing import route  # noqa: E402
from zepp.planner.adaptation.swaps import plan_swaps  # noqa: E402
from zepp.traces.synthetic import synthetic_traces  # noqa: E402
from zepp.traces import node_demand, sample_batches  # noqa: E402

MIN_ENTRIES = 100_000
OUT = DATA / "planner_cost.json"
PIPELINED = RESULTS / "calibration_planner_gpu_pipelined.json"
FLOWS = (("a2av", "a2av"), ("relay", "dedup"), ("zepp", "reduce"), ("zepp", "reduce-direct"))


def opmix(entries: int, seed: int = 0):
    """The op mix at ``entries`` (as benchmarks/fit/calibrate_planner_gpu.py times it on the GPU)."""
    rng = np.random.default_rng(seed)
    n = max(int(entries), 16)
    key = rng.integers(0, n * 8, n)
    small = rng.integers(0, 4096, n)
    idx = rng.permutation(n)
    srt = np.sort(key)
    ops = (lambda: np.argsort(key, kind="stable"), lambda: np.bincount(small, minlength=4096), lambda: key[idx],
           lambda: np.cumsum(small), lambda: np.searchsorted(srt, key), lambda: np.where(key > n, key, small))

    def run():
        for f in ops:
            f()
    return run


def best(f, repeats: int) -> float:
    out = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t)
    return out


def main(out: Path = OUT) -> None:
    rows = []
    for model in ("k2", "qwen"):
        spec = model_preset(model)
        pool, ev = synthetic_traces(model, 0)
        for nodes in (4, 8, 16):
            R, L = nodes * 4, 4
            pl = make_placement("zepp", node_demand(pool, nodes, L), spec.num_experts, R, L)
            C = 0.5 if nodes >= 16 else 0.25
            for mb in (1.0, 4.0, 16.0):
                batch = sample_batches(ev, R, spec.tokens_for_budget(mb), 1, 0)[0]
                n = int(batch.size)
                mix = opmix(n)
                routing = route("zepp", batch, pl, C)
                parts = {"route:zepp": lambda: route("zepp", batch, pl, C),
                         "swap": lambda: plan_swaps(pl, routing.slot_loads(), C)}
                for d, c in FLOWS:  # the plan's flows (volumes), and the hop tables an executor runs apart
                    parts[f"flows:{d}/{c}"] = lambda d=d, c=c: build_flows(routing, d, spec.row_bytes, c).volumes
                    parts[f"hops:{d}/{c}"] = lambda d=d, c=c: build_flows(routing, d, spec.row_bytes, c).hop_tables
                ratios = {}
                for name, f in parts.items():  # interleave the mix with every part
                    t_mix = best(mix, 5)
                    t_part = best(f, 3)
                    ratios[name] = t_part / (t_mix + best(mix, 5)) * 2
                rows.append({"model": model, "nodes": nodes, "budget_mb": mb, "entries": n, "rounds": ratios})
                print(model, nodes, mb, n, {k: round(v, 2) for k, v in ratios.items()}, flush=True)
    big = [r for r in rows if r["entries"] >= MIN_ENTRIES]
    rounds = {k: statistics.median(r["rounds"][k] for r in big) for k in rows[0]["rounds"]}
    gpu = json.loads(PIPELINED.read_text())
    data = {
        "about": "Planner cost model of zepp.sim.planning_cost (written by benchmarks/fit/planner_cost.py; see its docstring).",
        "rounds": rounds,
        "rounds_source": {"measured": datetime.date.today().isoformat(), "host": platform.node(),
                          "processor": platform.processor() or platform.machine(),
                          "rule": f"median of part/opmix over configurations with >= {MIN_ENTRIES} entries",
                          "per_configuration": rows},
        "gpu_opmix": {str(k): v["mix"] for k, v in gpu["sizes"].items()},
        "gpu_opmix_source": {"device": gpu.get("device", "NVIDIA H200"), "hbm_bw": 4.8e12,
                             "file": "benchmarks/results/calibration_planner_gpu_pipelined.json",
                             "how": "the op mix queued back to back with one host synchronisation per batch of mixes"},
    }
    out.write_text(json.dumps(data, indent=1) + "\n")
    print("rounds", {k: round(v, 3) for k, v in rounds.items()}, "->", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help="the file to write (default: the package's data file)")
    main(Path(ap.parse_args().out))  # --help, before any work
