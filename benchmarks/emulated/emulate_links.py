"""Measure the emulated cluster's links and pick the default NIC rate.

Writes benchmarks/results/emulate_links.json and .md: loopback (two ranks in one namespace)
against the NVLink veth and the shaped NIC at several rates (latency, streaming bandwidth per
message size, all NICs of a node streaming at once), and the time of a 2x2 all-to-all at each rate
next to an effectively unshaped NIC. Needs root. Usage: python benchmarks/emulated/emulate_links.py
[--rates 500,1000,2000] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS  # noqa: E402
from zepp.emulate import EmulatedCluster, availability  # noqa: E402
from zepp.emulate.linkcal import calibrate_links, measure_loopback  # noqa: E402

SIZES = (4096, 65536, 1 << 20, 8 << 20)
INTERLEAVE_SIZES = (1 << 20, 8 << 20)
UNSHAPED_MBIT = 100_000.0  # tbf at 12.5 GB/s: far above what the CPU moves, i.e. no shaping


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="500,1000,2000")
    ap.add_argument("--a2a-bytes", type=int, default=1 << 20, help="bytes per peer in the all-to-all")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved loopback / NVLink veth rounds")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    ok, reason = availability()
    if not ok:
        raise SystemExit(f"emulate_links: {reason}")
    rates = [float(r) for r in args.rates.split(",")]
    res: dict = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                             "load_avg_start": os.getloadavg()}, "sizes": list(SIZES), "rates": {}, "a2a": {}}
    with EmulatedCluster(2, 2, prefix="zbl") as cl:
        res["loopback"] = measure_loopback(cl, SIZES, reps=8, trials=5)
    for rate in rates:
        with EmulatedCluster(2, 2, rate_mbit=rate, prefix="zbl") as cl:
            res["rates"][rate] = calibrate_links(cl, SIZES, reps=8, trials=5).as_dict()
    for rate in rates + [UNSHAPED_MBIT]:
        with EmulatedCluster(2, 2, rate_mbit=rate, prefix="zbl") as cl:
            res["a2a"][rate] = cl.call("zepp.emulate.a2a_jobs:a2a_time",
                                       {"bytes_per_peer": args.a2a_bytes, "iters": 10}, timeout=300)[0]
    # loopback against the NVLink veth, interleaved, since machine load moves both by 2-3x
    res["interleaved"] = {"loopback": [], "nvlink_veth": []}
    for _ in range(args.rounds):
        with EmulatedCluster(2, 2, prefix="zbl") as cl:
            lb = measure_loopback(cl, INTERLEAVE_SIZES, reps=8, trials=3)
            res["interleaved"]["loopback"].append({"latency_s": lb["latency_s"], "bw": lb["bw"]})
            cal = calibrate_links(cl, INTERLEAVE_SIZES, reps=8, trials=3, concurrent=False)
            res["interleaved"]["nvlink_veth"].append({"latency_s": cal.nvlink_latency_s, "bw": cal.nvlink_bw_by_size})
    res["machine"]["load_avg_end"] = os.getloadavg()
    res["a2a_bytes_per_peer"] = args.a2a_bytes
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "emulate_links.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "emulate_links.md"), "w") as f:
        f.write(render(res))
    print(render(res))


def _mb(x: float) -> str:
    return f"{x / 1e6:.1f}"


def render(res: dict) -> str:
    sizes = res["sizes"]
    head = " | ".join(f"{s // 1024} KB" for s in sizes)
    lines = [f"# Emulated cluster links ({time.strftime('%Y-%m-%d')}, {res['machine']['cpus']} CPUs, "
             f"kernel {res['machine']['kernel']}, load avg {res['machine']['load_avg_start'][0]:.2f} -> "
             f"{res['machine']['load_avg_end'][0]:.2f})", "",
             "gloo send/recv between two rank processes; latency = half a 4-byte ping-pong (median); "
             "bandwidth = one-way stream of 8 back-to-back messages, median of 5 trials, MB/s of payload. "
             "2 nodes x 2 ranks, one pair talking at a time; 'NIC, all busy' = both ranks of node 0 streaming "
             "to node 1 at once (per NIC).", "",
             f"| link | latency us | {head} |", "|---|---|" + "---|" * len(sizes)]
    lb = res["loopback"]
    lines.append(f"| loopback (one namespace) | {lb['latency_s'] * 1e6:.0f} | "
                 + " | ".join(_mb(lb["bw"][str(s)] if str(s) in lb["bw"] else lb["bw"][s]) for s in sizes) + " |")
    for rate, cal in res["rates"].items():
        g = lambda t, s: t.get(str(s), t.get(s))  # noqa: E731 - json keys are strings
        lines.append(f"| NVLink veth (cluster of the {float(rate):g} Mbit/s run) | {cal['nvlink_latency_s'] * 1e6:.0f} | "
                     + " | ".join(_mb(g(cal["nvlink_bw_by_size"], s)) for s in sizes) + " |")
        lines.append(f"| NIC {float(rate):g} Mbit/s | {cal['nic_latency_s'] * 1e6:.0f} | "
                     + " | ".join(_mb(g(cal["nic_bw_by_size"], s)) for s in sizes) + " |")
        conc = cal["nic_concurrent_bw_by_size"]
        lines.append(f"| NIC {float(rate):g} Mbit/s, all busy | | "
                     + " | ".join("/".join(_mb(v) for v in g(conc, s)) for s in sizes) + " |")
    lines += ["", f"All-to-all, 2 nodes x 2 ranks, {res['a2a_bytes_per_peer'] // 1024} KB per peer "
              "(slowest rank, median of 10):", "", "| NIC rate | ms per all-to-all | vs unshaped |", "|---|---|---|"]
    base = res["a2a"][str(UNSHAPED_MBIT)] if str(UNSHAPED_MBIT) in res["a2a"] else res["a2a"][UNSHAPED_MBIT]
    for rate, a in res["a2a"].items():
        name = "unshaped" if float(rate) == UNSHAPED_MBIT else f"{float(rate):g} Mbit/s"
        lines.append(f"| {name} | {a['median_s'] * 1e3:.2f} | {a['median_s'] / base['median_s']:.2f}x |")
    il = res.get("interleaved")
    if il:
        lines += ["", "Loopback against the NVLink veth, interleaved (one round = loopback then veth, same cluster); "
                  "MB/s per round:", "", "| link | latency us per round | "
                  + " | ".join(f"{s // 1024} KB" for s in INTERLEAVE_SIZES) + " |", "|---|---|" + "---|" * len(INTERLEAVE_SIZES)]
        for name, runs in (("loopback", il["loopback"]), ("NVLink veth", il["nvlink_veth"])):
            lat = "/".join(f"{r['latency_s'] * 1e6:.0f}" for r in runs)
            cells = ["/".join(_mb(r["bw"].get(str(s), r["bw"].get(s))) for r in runs) for s in INTERLEAVE_SIZES]
            lines.append(f"| {name} | {lat} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
