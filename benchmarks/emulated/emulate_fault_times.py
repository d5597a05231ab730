"""How long a failing rank takes to end a run: the figures the tests used to assert as
wall-clock limits (they now assert only what happened, and this measures how fast).

Cases (each run ``--repeats`` times, median and max reported):

- ``local-die``: ``spawn_local``, rank 1 of 2 exits mid-layer (``fault mode die``), collective
  timeout 30 s: time until ``RankFailure`` (the peer notices the closed connection at once);
- ``local-hang``: rank 0 of 2 hangs mid-layer, collective timeout 4 s, grace 3 s: time until
  ``RankFailure`` (timeout of the peer, then the grace, then the kill);
- ``emulate-nic-down`` (root, network namespaces): the NICs of node 1 of a 2x2 emulated cluster
  go down mid-layer, collective timeout 6 s: time until ``RankFailure``, cluster teardown included.

Writes ``benchmarks/results/emulate_fault_times.{json,md}``. Usage:
``python benchmarks/emulated/emulate_fault_times.py [--repeats 3] [--out benchmarks/results]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS  # noqa: E402
from zepp.errors import RankFailure  # noqa: E402
from zepp.launch.ranks import spawn_local  # noqa: E402
from zepp.runtime.worker import default_config  # noqa: E402

WORKER = "zepp.runtime.worker"  # what every rank runs (as ``zepp run``'s ranks)
LIMIT_S = 300.0  # a local case that has not ended by then is killed and recorded at this time


def _cfg(nodes: int, L: int, timeout: float, fault: dict | None) -> dict:
    cfg = default_config()
    cfg.update(nodes=nodes, gpus_per_node=L, model="olmoe", experts=8, topk=2, hidden=16, ffn=8, tokens=8, iters=3,
               warmup=0, timeout=timeout, check=False, systems=["zepp-overlap"], fault=fault)
    return cfg


def _time(fn) -> float:
    t0 = time.monotonic()
    try:
        fn()
    except RankFailure:
        return time.monotonic() - t0
    raise RuntimeError("the run did not fail")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    cases = {
        # an overall limit of LIMIT_S: a run that never ends is recorded as that, not waited for
        "local-die": lambda: spawn_local(WORKER, _cfg(2, 1, 30.0, {"rank": 1, "system": "zepp-overlap", "iter": 1,
                                                             "mode": "die"}), timeout=LIMIT_S),
        "local-hang": lambda: spawn_local(WORKER, _cfg(2, 1, 4.0, {"rank": 0, "system": "zepp-overlap", "iter": 1,
                                                             "mode": "hang"}), grace=3, timeout=LIMIT_S),
    }
    from zepp.emulate.topology import availability

    if availability()[0]:
        from zepp.emulate.launcher import run_emulated

        cases["emulate-nic-down"] = lambda: run_emulated(_cfg(2, 2, 6.0, None), rate_mbit=1000, prefix="zbf",
                                                         nic_fault=(2, 1))
    res = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "load_avg_start": os.getloadavg()},
           "repeats": args.repeats, "cases": {}}
    for name, fn in cases.items():
        times = [_time(fn) for _ in range(args.repeats)]
        res["cases"][name] = {"seconds": times, "median_s": statistics.median(times), "max_s": max(times)}
        print(f"{name}: median {statistics.median(times):.1f} s, max {max(times):.1f} s", flush=True)
    res["machine"]["load_avg_end"] = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "emulate_fault_times.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = ["# Time for a failing rank to end a run", "",
             f"Measured by `benchmarks/emulated/emulate_fault_times.py` ({args.repeats} repeats; {os.cpu_count()} CPUs, load "
             f"average {res['machine']['load_avg_start'][0]:.1f} at the start, shared machine).", "",
             "| case | median s | max s | what bounds it |", "| --- | --- | --- | --- |"]
    why = {"local-die": "the peer sees the closed connection at once (timeout 30 s not reached)",
           "local-hang": "collective timeout 4 s + grace 3 s + process start",
           "emulate-nic-down": "collective timeout 6 s + cluster build and teardown"}
    for name, c in res["cases"].items():
        lines.append(f"| {name} | {c['median_s']:.1f} | {c['max_s']:.1f} | {why[name]} |")
    with open(os.path.join(args.out, "emulate_fault_times.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
