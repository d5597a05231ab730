"""Compare two ``zepp bench --json`` results cell by cell and list every change above 1%.

    python benchmarks/bench_compare.py OLD.json NEW.json > benchmarks/results/bench_refactor_diff.md

Used to check the one-table / FlowPlan-simulator refactor: the full default table must be
unchanged within 1% except where a fixed bug or the planning-cost model moved it; the reason
column says which change explains each system's moves (the same reason for every cell of it).
"""

from __future__ import annotations

import json
import sys

REASONS = {
    "epic": "EPIC now routes as PAPER.md section 7 says (replica source mod count, `fixed`; was SGLang-style "
            "locality) and combines with its own hierarchical pre-reduced combine (reduce-direct over the relay "
            "gateways; was Zepp's NIC-split combine)",
    "zepp": "Zepp's planning cost is the deterministic model (op-mix rounds x recorded H200 cost), not this "
            "CPU's wall-clock; zepp-swap's swaps come from the previous batch, as in the runtime",
    "zepp-a2av": "planning-cost model (see zepp)",
    "zepp-overlap": "planning-cost model (see zepp)",
    "zepp-swap": "planning-cost model; swaps from the previous batch's loads (as the runtime)",
    "eplb": "EPLB's fp32 route-weight call: transfers below one engine quantum hold no bandwidth",
    "moonep": "MoonEP's fp32 weight call: transfers below one engine quantum hold no bandwidth",
    "a2av": "sub-quantum NVLink messages end exactly (no early start inside an event window)",
}


def key(r):
    return (r["cluster"], r["nodes"], r["model"], float(r["budget_mb"]))


def main(old_path: str, new_path: str) -> None:
    old = {key(r): r for r in json.load(open(old_path))["rows"]}
    new = {key(r): r for r in json.load(open(new_path))["rows"]}
    systems = [s for s in next(iter(new.values()))["latency_ms"] if s in next(iter(old.values()))["latency_ms"]]
    print(f"# Simulated table before and after the refactor\n\nOld: `{old_path}`; new: `{new_path}`. "
          "Cells that moved by more than 1% (simulated ms per layer):\n")
    print("| nodes | model | MB | system | old ms | new ms | change | reason |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    moved, total = {}, 0
    for k in sorted(new):
        if k not in old:
            continue
        for s in systems:
            a, b = old[k]["latency_ms"][s], new[k]["latency_ms"][s]
            total += 1
            if abs(b / a - 1) > 0.01:
                moved[s] = moved.get(s, 0) + 1
                print(f"| {k[1]} | {k[2]} | {k[3]:g} | {s} | {a:.2f} | {b:.2f} | {b / a - 1:+.1%} | "
                      f"{REASONS.get(s, 'unexplained')} |")
    print(f"\n{sum(moved.values())} of {total} cells moved by more than 1%: "
          + ", ".join(f"{s} {n}" for s, n in sorted(moved.items())) + ".")
    og, ng = json.load(open(old_path)).get("geomean_speedup"), json.load(open(new_path)).get("geomean_speedup")
    print(f"\nGeomean speedup of zepp over the fastest simulated baseline: {og:.3f}x before, {ng:.3f}x after.")


if __name__ == "__main__":
    main(*sys.argv[1:3])
