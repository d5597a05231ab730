"""Zepp at decode and in one NVLink domain (issue 18, items 2 and 3): markdown of `zepp bench --json`
files, per row Zepp's time beside the fastest of the named baseline systems and beside the
fastest of every baseline variant the run simulated.

    python benchmarks/simulated/decode_report.py AFTER.json [--before BEFORE.json] [--title TEXT] > OUT.md

The named systems are the engines as users run them (``sglang-deepep``, ``sglang-lp``,
``vllm-eplb``: each switches to its low-latency kernels at decode sizes); the variants include
their normal-kernel rows, which the engines do not run at those sizes (a stricter comparison).
"""

from __future__ import annotations

import argparse
import json
import math

NAMED = ("sglang-deepep", "sglang-lp", "vllm-eplb")


def rows_of(path: str) -> list[dict]:
    d = json.load(open(path))
    return d["rows"] if isinstance(d, dict) else d


def key(r: dict) -> tuple:
    return r["cluster"], r["nodes"], r["gpus_per_node"], r["model"], r["budget_mb"]


def geomean(x: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in x) / len(x)) if x else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("after")
    ap.add_argument("--before")
    ap.add_argument("--title", default="Zepp on DeepEP's kernels")
    a = ap.parse_args()
    before = {key(r): r for r in rows_of(a.before)} if a.before else {}
    out = [f"# {a.title}", "", f"Source: `{a.after}`" + (f", before: `{a.before}`" if a.before else "") + ".", "",
           "| cluster | nodes | model | MB | zepp-deepep ms (variant) | fastest named system ms | vs named | "
           "fastest baseline variant ms | vs variant | zepp before ms | before vs named |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    vs_named, vs_var, vs_before = [], [], []
    for r in rows_of(a.after):
        lat = {k: v for k, v in r["latency_ms"].items() if v}
        z = lat["zepp-deepep"]
        named = min((lat[m], m) for m in NAMED if m in lat)
        var = min((v, k) for k, v in lat.items() if not k.startswith("zepp"))
        vs_named.append(named[0] / z)
        vs_var.append(var[0] / z)
        b = before.get(key(r))
        if b:
            bl = {k: v for k, v in b["latency_ms"].items() if v}
            bnamed = min(bl[m] for m in NAMED if m in bl)
            vs_before.append(bnamed / bl["zepp-deepep"])
            bcell = f"{bl['zepp-deepep']:.3f} | {bnamed / bl['zepp-deepep']:.2f}x"
        else:
            bcell = "- | -"
        out.append(f"| {r['cluster']} | {r['nodes']}x{r['gpus_per_node']} | {r['model']} | {r['budget_mb']:g} | "
                   f"{z:.3f} ({r['variant'].get('zepp-deepep')}) | {named[0]:.3f} ({named[1]}) | {named[0] / z:.2f}x | "
                   f"{var[0]:.3f} ({var[1]}) | {var[0] / z:.2f}x | {bcell} |")
    out += ["", f"- geomean vs the fastest named system: {geomean(vs_named):.3f}x "
                f"({sum(v < 1 for v in vs_named)} rows lost)",
            f"- geomean vs the fastest baseline variant: {geomean(vs_var):.3f}x ({sum(v < 1 for v in vs_var)} rows lost)"]
    if vs_before:
        out.append(f"- before (the code this branch started from, named systems without sglang-lp): geomean "
                   f"{geomean(vs_before):.3f}x ({sum(v < 1 for v in vs_before)} rows lost)")
    print("\n".join(out))


if __name__ == "__main__":
    main()
