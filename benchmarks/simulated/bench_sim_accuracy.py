"""Accuracy and speed of the engine's event coarsening (``zepp.sim.layer.SIM_OPTS``) against the
exact engine (every event, exact max-min levels), on real traces, one batch per configuration.

    python benchmarks/simulated/bench_sim_accuracy.py [CASES] [--traces DIR] > benchmarks/results/bench_sim_accuracy.md

``CASES``: run only the first that many configurations of ``CASES`` (all by default).
"""

import argparse
import sys
import time
from pathlib import Path

import zepp.sim.layer as layer
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import add_traces_option, find_traces  # noqa: E402
from zepp.sim.calibrate import calibrated  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.sim.run import Config, run_system  # noqa: E402
from zepp.traces import load_model_traces, node_demand, sample_batches  # noqa: E402

CASES = [(4, "k2", 16.0), (16, "k2", 16.0), (16, "qwen", 4.0)]
SYS = ["a2av", "eplb", "moonep", "comet", "epic", "zepp-overlap"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="?", type=int, default=len(CASES), help="how many of CASES to run")
    add_traces_option(ap)
    args = ap.parse_args()
    traces = find_traces(args.traces)
    print("| nodes | model | MB | system | exact ms | coarse ms | rel diff | exact s | coarse s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    coarse = dict(layer.SIM_OPTS)
    for n, m, mb in CASES[: args.cases]:
        pool, ev = load_model_traces(traces, m)
        cl, net = calibrated("a100", n)
        spec = model_preset(m)
        cfg = Config(cl, spec, net, node_demand(pool, n, 4),
                     sample_batches(ev, cl.ranks, spec.tokens_for_budget(mb), 1, 0), warmup=0)
        for s in SYS:
            out = []
            for opts in ({"rel_quantum": 0.0, "rate_tol": 1e-9}, coarse):
                cfg.sim_opts = opts
                t = time.time()
                r = run_system(s, cfg)
                out.append((r.median * 1e3, time.time() - t))
            (e, te), (c, tc) = out
            print(f"| {n} | {m} | {mb:g} | {s} | {e:.3f} | {c:.3f} | {(c / e - 1) * 100:+.2f}% | {te:.1f} | {tc:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
