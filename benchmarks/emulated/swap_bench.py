"""Swaps that hide in the runtime, measured on the emulated cluster.

    python benchmarks/emulated/swap_bench.py [--reps 3] [--iters 16] [--hidden 256] [--ffn 512] [--tokens 256]
                                    [--rounds 5] [--hidden-ffn 1024] [--hidden-tokens 64]

One emulated cluster (``zepp.emulate``, 2 nodes x 2 ranks, NICs at ``--rate`` Mbit/s, the
intra-node "NVLink" veths unshaped), Kimi-K2's shape (384 experts, top-8) with a hidden size
and FFN the CPU can carry, K2 ids from the recorded traces under the ``--schedule`` drift
schedule (``zepp.traces.schedules``; default ``rotating``: the placement's history holds the
first topics, the batches drift through the others). Per repetition, two runs, each with its
systems interleaved iteration by iteration:

- ``compare``: ``zepp-overlap`` and ``zepp-swap`` (hidden copies), checked against the
  reference. Per system the median over timed iterations of the slowest rank's layer time
  (swap planning and copies inside the window), the swaps per step and their weight bytes, the
  bytes they sent across nodes (the runtime's own per-destination count: must be 0), and each
  system's NIC bytes from the interface counters against the planner's payload (a weight byte
  on a NIC would show as a ratio above ``zepp-overlap``'s) and its NVLink bytes.
- ``hidden``: ``zepp-swap`` alone with ``swap_measure = --rounds`` (``zepp.runtime.swap_steps``):
  after every timed step that swapped, ``--rounds`` rounds of three replays of that step, each
  between barriers: ``again`` (the pre-swap weights restored, the same copies hidden behind the
  step once more), ``control`` (weights in place, nothing in flight) and ``alone`` (the same
  copies alone and blocking). ``added = again - control`` (median over rounds, the slowest
  rank's times) is what the copies added to the step, against ``alone``. This run has its own
  ``--hidden-ffn`` (default 1024) and ``--hidden-tokens`` (default 64): bigger weights per slot
  and less compute per step than ``compare``, so the copies are large against the step's noise
  on a loaded machine (the figure is a ratio of two times of the same copies). The planning of swaps
  (``plan_swaps`` on the last batch's loads, inside every zepp-swap step, swap or not) is
  reported beside it.

The load average (``os.getloadavg()``) is recorded before and after every run: on a loaded
machine the times are the ranks' share of it, and the paired differences carry that noise.
Writes ``<out>.json`` and ``<out>.md`` (``--out``, default ``benchmarks/results/swap_bench``).
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
from zepp.emulate.launcher import run_emulated  # noqa: E402
from zepp.emulate.topology import EmulatedCluster, availability  # noqa: E402
from zepp.runtime.worker import default_config  # noqa: E402

SYSTEMS = ["zepp-overlap", "zepp-swap"]


def _cfg(args, systems: list[str], measure: bool) -> dict:
    cfg = default_config()
    ffn, tokens = (args.hidden_ffn, args.hidden_tokens) if measure else (args.ffn, args.tokens)
    cfg.update(nodes=2, gpus_per_node=2, model="k2", hidden=args.hidden, ffn=ffn, tokens=tokens,
               systems=systems, iters=args.iters, warmup=args.warmup, check=not measure, timeout=120.0,
               interleave=True, relaxation=args.relaxation, schedule=args.schedule, seed=args.seed,
               swap_copies="hidden", swap_measure=args.rounds if measure else 0,
               history=f"{args.traces}/k2/pool.txt", trace=f"{args.traces}/k2/eval.txt")
    return cfg


def _run(cl, cfg: dict, rate: float) -> tuple[dict, dict]:
    load = {"before": os.getloadavg()}
    t0 = time.monotonic()
    rep = run_emulated(cfg, rate, cluster=cl)
    load.update(after=os.getloadavg(), seconds=time.monotonic() - t0)
    return rep, load


def _compare_row(rep: dict, load: dict) -> dict:
    """The compare run's figures per system."""
    row = {"load": load, "systems": {}}
    for name in SYSTEMS:
        s, em = rep["systems"][name], rep["emulate"]["systems"][name]
        b = s["bytes_per_iter"]
        planned_nic = np.mean(np.add(b["planned_dispatch_nic"], b["planned_combine_nic"]))
        planned_nvl = np.mean(np.add(b["planned_dispatch_nvlink"], b["planned_combine_nvlink"]))
        sw = s.get("swaps") or {}
        row["systems"][name] = {
            "median_layer_ms": s["median_layer_ms"], "layer_ms": s["layer_ms"], "correct": s["correct"],
            "bytes_match": s["bytes_match"], "nic_tx_bytes": float(np.sum(em["nic_tx"])),
            "planned_nic_bytes": float(planned_nic), "metadata_nic_bytes": em["metadata_nic"],
            "nic_over_planned": float(np.sum(em["nic_tx"]) / (planned_nic + em["metadata_nic"])),
            "nvlink_tx_bytes": float(np.sum(em["nvlink_tx"])), "planned_nvlink_bytes": float(planned_nvl),
            "swaps_per_step": sw.get("per_step"), "swap_bytes_per_step": sw.get("bytes_per_step"),
            "swap_cross_node_bytes": int(sum(sw.get("cross_node_bytes_per_step") or [0])),
            "swap_exposed_ms": sw.get("exposed_ms"), "swap_plan_ms": sw.get("plan_ms"),
            "in_flight_after_step": sw.get("in_flight_after_step")}
    return row


def _hidden_row(rep: dict, load: dict) -> dict:
    """The hidden run's figures of the steps that swapped."""
    sw = rep["systems"]["zepp-swap"]["swaps"]
    steps = [i for i, c in enumerate(sw["per_step"]) if c]
    pick = lambda key: [sw[key][i] for i in steps]  # noqa: E731
    return {"load": load, "swap_steps": steps, "swaps_per_step": sw["per_step"],
            "swap_bytes_per_step": sw["bytes_per_step"],
            "step_ms": [rep["systems"]["zepp-swap"]["layer_ms"][i] for i in steps],
            "control_ms": pick("control_ms"), "alone_ms": pick("alone_ms"), "added_ms": pick("added_ms_per_step"),
            "plan_ms": pick("plan_ms"), "plan_ms_every_step": sw["plan_ms"], "exposed_ms": pick("exposed_ms"),
            "replay_same": sw["replay_same"], "cross_node_bytes": int(sum(sw["cross_node_bytes_per_step"]))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="replay rounds per swapped step (swap_measure)")
    ap.add_argument("--hidden-ffn", type=int, default=1024, help="FFN of the hidden-copies run")
    ap.add_argument("--hidden-tokens", type=int, default=64, help="tokens per rank of the hidden-copies run")
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--relaxation", type=float, default=0.1)
    ap.add_argument("--schedule", default="rotating")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--prefix", default="zswap", help="name prefix of the emulated cluster's namespaces")
    ap.add_argument("--out", default=os.path.join(str(RESULTS), "swap_bench"))
    ap.add_argument("--render", default=None, help="only re-render <out>.md from this saved JSON")
    add_traces_option(ap)
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            out = json.load(f)
        out["summary"] = summarize(out["compare"], out["hidden"])
        with open(args.out + ".md", "w") as f:
            f.write(markdown(out))
        return 0
    args.traces = str(find_traces(args.traces))
    ok, reason = availability()
    if not ok:
        print(f"swap_bench: {reason}", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    compare, hidden, schedule = [], [], None
    with EmulatedCluster(2, 2, rate_mbit=args.rate, prefix=args.prefix) as cl:
        for rep_i in range(args.reps):
            rep, load = _run(cl, _cfg(args, SYSTEMS, False), args.rate)
            schedule = rep["traces"].get("schedule")
            compare.append(_compare_row(rep, load))
            c = compare[-1]["systems"]
            print(f"[rep {rep_i}] compare {load['seconds']:.0f}s load {load['before'][0]:.1f}: "
                  + ", ".join(f"{n} {c[n]['median_layer_ms']:.1f} ms" for n in SYSTEMS)
                  + f", swaps {sum(c['zepp-swap']['swaps_per_step'])}", flush=True)
            rep, load = _run(cl, _cfg(args, ["zepp-swap"], True), args.rate)
            hidden.append(_hidden_row(rep, load))
            h = hidden[-1]
            print(f"[rep {rep_i}] hidden {load['seconds']:.0f}s: added {h['added_ms']} alone {h['alone_ms']}",
                  flush=True)
    out = {"args": vars(args), "schedule": schedule, "compare": compare, "hidden": hidden,
           "summary": summarize(compare, hidden), "seconds": time.monotonic() - t_start}
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(out))
    print(markdown(out))
    return 0


def summarize(compare: list[dict], hidden: list[dict]) -> dict:
    """Medians over repetitions (compare) and over every swap step of every repetition (hidden)."""
    med = {n: float(np.median([c["systems"][n]["median_layer_ms"] for c in compare])) for n in SYSTEMS}
    steps = lambda k: [v for h in hidden for v in h[k]]  # noqa: E731
    added, alone, plan = steps("added_ms"), steps("alone_ms"), steps("plan_ms_every_step")
    exposed, control = steps("exposed_ms"), steps("control_ms")
    m = lambda v: float(np.median(v)) if v else None  # noqa: E731
    q = lambda v: [float(x) for x in np.percentile(v, [25, 75])] if v else None  # noqa: E731
    return {"median_layer_ms": med, "swap_over_overlap": med["zepp-swap"] / med["zepp-overlap"],
            "swap_not_slower_per_rep": [c["systems"]["zepp-swap"]["median_layer_ms"]
                                        <= c["systems"]["zepp-overlap"]["median_layer_ms"] for c in compare],
            "swaps_total": int(sum(sum(c["systems"]["zepp-swap"]["swaps_per_step"]) for c in compare)),
            "swap_bytes_total": int(sum(sum(c["systems"]["zepp-swap"]["swap_bytes_per_step"]) for c in compare)),
            "cross_node_swap_bytes": int(sum(c["systems"]["zepp-swap"]["swap_cross_node_bytes"] for c in compare)
                                         + sum(h["cross_node_bytes"] for h in hidden)),
            "swap_steps_measured": len(added), "added_ms_median": m(added), "alone_ms_median": m(alone),
            "plan_ms_median": m(plan), "added_over_alone": None if not alone else m(added) / m(alone),
            "added_ms_quartiles": q(added), "control_ms_median": m(control),
            "exposed_ms_median": m(exposed), "exposed_over_alone": None if not alone else m(exposed) / m(alone),
            "replay_same": all(h["replay_same"] for h in hidden)}


def _nv(row: dict) -> float:
    """NVLink veth tx bytes per iteration beyond the planner's payload, MB (headers, the
    barrier, the metadata all-gather's own-node part and, for zepp-swap, the weight copies)."""
    return (row["nvlink_tx_bytes"] - row["planned_nvlink_bytes"]) / 2**20


def _q(v) -> str:
    return "-" if not v else f"{v[0]:.1f} to {v[1]:.1f}"


def markdown(out: dict) -> str:
    a, s = out["args"], out["summary"]
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["# Swaps that hide in the runtime (emulated cluster)", "",
             f"`python benchmarks/emulated/swap_bench.py` ({out['seconds']:.0f} s): 2 nodes x 2 ranks, "
             f"NIC {a['rate']:g} Mbit/s, "
             f"K2 shape (384 experts, top-8) with H={a['hidden']}, FFN={a['ffn']}, {a['tokens']} tokens per rank, "
             f"fp32, relaxation {a['relaxation']}, {a['iters']} timed iterations (+{a['warmup']} warm-up), "
             f"{a['reps']} repetitions; {(out['schedule'] or {}).get('describe', a['schedule'])}.", "",
             "## zepp-swap against zepp-overlap (interleaved per iteration)", "",
             "| rep | load 1-min (before/after) | zepp-overlap ms | zepp-swap ms | swap/overlap | swaps | swap MB | "
             "swap bytes across nodes | NIC tx / planned, overlap | NIC tx / planned, swap | "
             "NVLink tx - planned MB/it, overlap | NVLink tx - planned MB/it, swap | in flight after a step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, c in enumerate(out["compare"]):
        o, w = c["systems"]["zepp-overlap"], c["systems"]["zepp-swap"]
        lines.append(f"| {i} | {c['load']['before'][0]:.1f}/{c['load']['after'][0]:.1f} | {o['median_layer_ms']:.1f} | "
                     f"{w['median_layer_ms']:.1f} | {w['median_layer_ms'] / o['median_layer_ms']:.3f} | "
                     f"{sum(w['swaps_per_step'])} | {sum(w['swap_bytes_per_step']) / 2**20:.2f} | "
                     f"{w['swap_cross_node_bytes']} | {o['nic_over_planned']:.3f} | {w['nic_over_planned']:.3f} | "
                     f"{_nv(o):.3f} | {_nv(w):.3f} | {w['in_flight_after_step']} |")
    lines += ["", f"Median over repetitions: zepp-overlap {s['median_layer_ms']['zepp-overlap']:.1f} ms, zepp-swap "
              f"{s['median_layer_ms']['zepp-swap']:.1f} ms (ratio {s['swap_over_overlap']:.3f}); zepp-swap no slower "
              f"in repetitions: {s['swap_not_slower_per_rep']}. Swaps: {s['swaps_total']} slots, "
              f"{s['swap_bytes_total'] / 2**20:.2f} MB, {s['cross_node_swap_bytes']} bytes across nodes.", "",
              "## Hidden copies: what a swap adds to its step against the same copies alone", "",
              f"Own run: FFN={a.get('hidden_ffn', a['ffn'])}, {a.get('hidden_tokens', a['tokens'])} tokens per rank, "
              f"{a.get('rounds', 1)} rounds of replays per swapped step; per step the median over rounds.", "",
              "| rep | load 1-min | swap steps | slots | step ms | control ms | added ms | planning ms | "
              "exposed ms (post+wait) | alone ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    r = lambda v: ", ".join(f"{x:.1f}" for x in v)  # noqa: E731
    for i, h in enumerate(out["hidden"]):
        lines.append(f"| {i} | {h['load']['before'][0]:.1f}/{h['load']['after'][0]:.1f} | {h['swap_steps']} | "
                     f"{[h['swaps_per_step'][j] for j in h['swap_steps']]} | {r(h['step_ms'])} | "
                     f"{r(h['control_ms'])} | "
                     f"{r(h['added_ms'])} | {r(h['plan_ms'])} | {r(h['exposed_ms'])} | {r(h['alone_ms'])} |")
    lines += ["", f"Over {s['swap_steps_measured']} swap steps: the copies added {f(s['added_ms_median'])} ms median "
              f"to their step (again - control; quartiles {_q(s['added_ms_quartiles'])} ms, against a "
              f"{f(s['control_ms_median'])} ms control step), the same copies alone and blocking took "
              f"{f(s['alone_ms_median'])} ms: added/alone {f(s['added_over_alone'])}. This thread's own time in the "
              f"swap (posting + waiting for weights; it leaves out the CPU the transfers take from the step): "
              f"{f(s['exposed_ms_median'])} ms median, {f(s['exposed_over_alone'])} of alone. Planning swaps "
              f"costs {f(s['plan_ms_median'])} ms per zepp-swap step (every step). Replays bit-identical to their "
              f"steps: {s['replay_same']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
