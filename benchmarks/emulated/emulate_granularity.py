"""Zepp's per-batch granularity on the emulated cluster, against the fixed extremes.

    python benchmarks/emulated/emulate_granularity.py [--shapes 2x2,4x2] [--tokens 128,512] [--iters 8]

Per shape one emulated cluster (``zepp.emulate``, prefix ``zgr``, NIC ``--rate`` Mbit/s), its
links and expert compute calibrated (``zepp.emulate.simcheck.calibrate``); the cost figures of
``zepp.planner.overlap.granularity`` for this executor come from that calibration only:

- ``nic_bw`` / ``nvlink_bw``: the measured link rates; ``nvlink_msg_cost`` the measured NVLink
  (veth) message latency; ``nic_msg_cost`` (the fixed cost of one more wave or group): the
  measured NIC message latency plus one empty ``all_to_all_single`` over all ranks, since the
  runtime posts every combine wave as one collective;
- GEMM: the fitted ``t = c_group * groups + c_row * rows`` of the runtime's grouped MLP, as
  ``hbm_bw = H * F * 4 / c_group`` (one weight read per active expert) and ``peak_flops = 2 H F /
  c_row`` with a flat efficiency curve (the model takes the max of the two; the fit adds them);
- ``overlap`` (``Figures.overlap``, the fraction of transfer time a rank computes through): a
  rank's share of the machine's cores, ``min(1, cores / ranks)``: gloo's TCP copies through veth
  run on the same cores as the GEMMs (``--overlap`` overrides it; 1 is the GPU assumption).

Then ``zepp-overlap`` (fixed: one group per arrival event, one wave per node), ``zepp-auto``
(the choice) and ``zepp-sync`` (one GEMM per phase, blocking collectives) run interleaved
iteration by iteration (``interleave``), K2 ids from the recorded traces (``--traces``, found by
``benchmarks/paths.py``), checked against the reference. Writes
``benchmarks/results/emulate_granularity.{md,json}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.emulate.launcher import run_emulated  # noqa: E402
from zepp.emulate.simcheck import calibrate  # noqa: E402
from zepp.emulate.topology import EmulatedCluster, availability  # noqa: E402
from zepp.runtime.worker import default_config  # noqa: E402

OUT = str(RESULTS)
SYSTEMS = ["zepp-overlap", "zepp-auto", "zepp-sync"]


def cost_cluster(cal: dict, nodes: int, L: int, hidden: int, ffn: int, overlap: float) -> dict:
    """``zepp.cluster.Cluster`` fields for ``zepp.planner.overlap.granularity`` from an emulated-cluster calibration."""
    f, comp = cal["cluster_fields"], cal["compute"]
    c_group = max((comp["up"][0] + comp["down"][0]) / 2, 1e-9)
    c_row = max((comp["up"][1] + comp["down"][1]) / 2, 1e-12)
    return dict(name="emulated", nodes=nodes, gpus_per_node=L, nic_bw=f["nic_bw"], nvlink_bw=f["nvlink_bw"],
                nic_msg_cost=f["nic_msg_cost"] + cal["a2a_empty_s"], nvlink_msg_cost=f["nvlink_msg_cost"],
                hbm_bw=hidden * ffn * 4 / c_group, peak_flops=2.0 * hidden * ffn / c_row, gemm_eff_max=1.0,
                gemm_rows_half=1e-9, kernel_launch=0.0, overlap=overlap)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2x2,4x2")
    ap.add_argument("--tokens", default="128,512")
    ap.add_argument("--rate", type=float, default=1000.0, help="NIC Mbit/s")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(OUT, "emulate_granularity"))
    ap.add_argument("--overlap", type=float, default=None, help="Figures.overlap (default: min(1, cores / ranks))")
    add_traces_option(ap)
    args = ap.parse_args()
    args.traces = str(find_traces(args.traces))
    ok, reason = availability()
    if not ok:
        print(f"emulate_granularity: {reason}", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    cells = []
    for shape in args.shapes.split(","):
        N, L = (int(v) for v in shape.split("x"))
        with EmulatedCluster(N, L, rate_mbit=args.rate, prefix="zgr") as cl:
            t0 = time.monotonic()
            cal = calibrate(cl, args.hidden, args.ffn, points=[[64, 8], [256, 8], [512, 32], [1024, 32], [2048, 32]],
                            link_kwargs={"sizes": (65536, 1 << 20), "reps": 3, "trials": 2})
            overlap = min(1.0, (os.cpu_count() or 1) / (N * L)) if args.overlap is None else args.overlap
            fig = cost_cluster(cal, N, L, args.hidden, args.ffn, overlap)
            print(f"[{shape}] calibrated in {time.monotonic() - t0:.0f}s: {fig}", flush=True)
            for T in (int(t) for t in args.tokens.split(",")):
                cfg = default_config()
                cfg.update(nodes=N, gpus_per_node=L, model="k2", hidden=args.hidden, ffn=args.ffn, tokens=T,
                           systems=SYSTEMS, iters=args.iters, warmup=args.warmup, check=True, timeout=120.0,
                           interleave=True, cost_cluster=fig,
                           history=f"{args.traces}/k2/pool.txt", trace=f"{args.traces}/k2/eval.txt")
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                rep = run_emulated(cfg, args.rate, cluster=cl)
                sysr = rep["systems"]
                cell = dict(shape=shape, nodes=N, gpus_per_node=L, tokens=T, seconds=time.monotonic() - t0,
                            load=[load0, os.getloadavg()[0]], cost_cluster=fig,
                            calibration={k: cal[k] for k in ("cluster_fields", "a2a_empty_s", "compute")},
                            median_ms={s: sysr[s]["median_layer_ms"] for s in SYSTEMS},
                            layer_ms={s: sysr[s]["layer_ms"] for s in SYSTEMS},
                            correct={s: sysr[s]["correct"] for s in SYSTEMS},
                            granularity=sysr["zepp-auto"]["granularity"],
                            granularity_same_on_all_ranks=sysr["zepp-auto"]["granularity_same_on_all_ranks"])
                cells.append(cell)
                print(f"[{shape} T={T}] {cell['seconds']:.0f}s: " + ", ".join(
                    f"{s} {cell['median_ms'][s]:.1f}ms" for s in SYSTEMS) + f" chose {Counter(map(tuple, cell['granularity']))}",
                      flush=True)
    write(args, cells, time.monotonic() - t_start)
    return 0


def write(args, cells: list[dict], seconds: float) -> None:
    md = [f"# Zepp's granularity on the emulated cluster ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"`python benchmarks/emulated/emulate_granularity.py --shapes {args.shapes} --tokens {args.tokens} --iters "
          f"{args.iters}`; NIC {args.rate:g} Mbit/s per direction, NVLink = unshaped veth; K2 ids (top-8, 384 experts) "
          f"from ../shared/traces/k2, layer H={args.hidden}, FFN={args.ffn}, fp32. {os.cpu_count()} CPU cores shared "
          "with other work (load average per cell below). Systems interleaved iteration by iteration; per cell the "
          "median over timed iterations of the slowest rank's layer time. Every output checked against the "
          f"single-process reference. Wall time {seconds:.0f} s.", "",
          "`zepp-overlap`: fixed granularity (GEMM 1 per arrival event, one combine wave per node); `zepp-auto`: "
          "groups and waves chosen per batch by `zepp.planner.overlap.granularity` with cost figures from this cluster's "
          "calibration (see the script's docstring); `zepp-sync`: one GEMM per phase, blocking collectives.", "",
          "| nodes x ranks | tokens/rank | zepp-overlap ms | zepp-auto ms | zepp-sync ms | auto / overlap | "
          "auto / sync | chosen (groups/waves: batches) | same on all ranks | correct | load |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        m = c["median_ms"]
        chosen = ", ".join(f"{g}g/{w}w: {n}" for (g, w), n in sorted(Counter(map(tuple, c["granularity"])).items()))
        md.append(f"| {c['shape']} | {c['tokens']} | {m['zepp-overlap']:.1f} | {m['zepp-auto']:.1f} | "
                  f"{m['zepp-sync']:.1f} | {m['zepp-auto'] / m['zepp-overlap']:.2f} | {m['zepp-auto'] / m['zepp-sync']:.2f} | "
                  f"{chosen} | {'yes' if c['granularity_same_on_all_ranks'] else 'NO'} | "
                  f"{'yes' if all(c['correct'].values()) else 'NO'} | {c['load'][0]:.1f}-{c['load'][1]:.1f} |")
    md += ["", "Cost figures per shape (from the calibration):", ""]
    seen = set()
    for c in cells:
        if c["shape"] in seen:
            continue
        seen.add(c["shape"])
        f = c["cost_cluster"]
        md.append(f"- {c['shape']}: NIC {f['nic_bw'] / 1e6:.0f} MB/s, per wave/group {f['nic_msg_cost'] * 1e3:.2f} ms; "
                  f"veth {f['nvlink_bw'] / 1e6:.0f} MB/s; weight read per active expert "
                  f"{args.hidden * args.ffn * 4 / f['hbm_bw'] * 1e6:.0f} us, per row "
                  f"{2 * args.hidden * args.ffn / f['peak_flops'] * 1e6:.1f} us; overlap {f['overlap']:.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".md", "w") as fh:
        fh.write("\n".join(md) + "\n")
    with open(args.out + ".json", "w") as fh:
        json.dump({"args": vars(args), "seconds": seconds, "cells": cells}, fh, indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
