"""Zepp's per-batch granularity in the paper's table: per row Zepp's best variant against the
fastest simulated baseline, before (``zepp`` = best of zepp-a2av / zepp-overlap / zepp-swap) and
after (``zepp-auto`` joins the variants), with the granularity ``zepp-auto`` chose.

    python benchmarks/simulated/granularity_report.py

Reads JSON only, the two runs of the granularity work (branch ``h-gran``, commits 28322d2 and
60dfcb8), so the table stays the one it published while ``bench_{synth,real}.json`` move on:

- the baselines and Zepp's earlier variants (zepp-a2av, zepp-overlap, zepp-swap) from
  ``benchmarks/results/granularity_bench_{synth,real}.json`` (``zepp bench [--traces
  ../shared/traces]`` on that branch; its baseline and earlier-variant cells are bit-identical to
  ``bench_{synth,real}.json`` as they stood then, at d948de1);
- ``zepp-auto``'s latency, chosen granularity and planning time from
  ``benchmarks/results/granularity_{synth,real}_auto.detail.json`` (``zepp bench [--traces
  ../shared/traces] --systems zepp-auto`` on that branch, the same seed, iterations and traces).

Writes ``benchmarks/results/granularity.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS as RES  # noqa: E402
from zepp import registry  # noqa: E402

BEFORE_VARIANTS = ("zepp-a2av", "zepp-overlap", "zepp-swap")


def _key(r: dict) -> tuple:
    return (r["cluster"], r["nodes"], r["gpus_per_node"], r["model"], float(r["budget_mb"]))


def _geo(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def table(kind: str) -> tuple[list[dict], list[str]]:
    base = {_key(r): r for r in json.loads((RES / f"granularity_bench_{kind}.json").read_text())["rows"]}
    arows = json.loads((RES / f"granularity_{kind}_auto.detail.json").read_text())
    out = []
    for a in arows:
        b = base[_key(a)]
        bl = {s: v for s, v in b["latency_ms"].items() if s in registry.PAPER_BASELINES}
        fastest = min(bl, key=bl.get)
        lat = dict(b["latency_ms"], **{"zepp-auto": a["latency_ms"]["zepp-auto"]})
        before = min(BEFORE_VARIANTS, key=lambda v: lat[v])
        after = min(BEFORE_VARIANTS + ("zepp-auto",), key=lambda v: lat[v])
        gran = [tuple(g) for g in a["detail"]["zepp-auto"]["granularity"]]
        chosen = ", ".join(f"{g}g/{w}w x{n}" for (g, w), n in Counter(gran).most_common())
        out.append(dict(cluster=a["cluster"], nodes=a["nodes"], gpus_per_node=a["gpus_per_node"], model=a["model"],
                        budget_mb=a["budget_mb"], fastest_baseline=fastest, fastest_baseline_ms=bl[fastest],
                        before_variant=before, before_ms=lat[before], after_variant=after, after_ms=lat[after],
                        zepp_overlap_ms=lat["zepp-overlap"], zepp_auto_ms=lat["zepp-auto"],
                        zepp_auto_planning_ms=a["detail"]["zepp-auto"]["planning_ms"],
                        speedup_before=bl[fastest] / lat[before], speedup_after=bl[fastest] / lat[after],
                        auto_vs_overlap=lat["zepp-overlap"] / lat["zepp-auto"], granularity=gran, chosen=chosen))
    lines = ["| nodes | model | MB | fastest baseline | ms | Zepp before (variant) | x | Zepp after (variant) | x "
             "| zepp-overlap ms | zepp-auto ms | overlap / auto | zepp-auto chose (groups/waves x batches) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in out:
        lines.append(f"| {r['nodes']}x{r['gpus_per_node']} | {r['model']} | {r['budget_mb']:g} | {r['fastest_baseline']} | "
                     f"{r['fastest_baseline_ms']:.2f} | {r['before_ms']:.2f} ({r['before_variant']}) | "
                     f"{r['speedup_before']:.2f}x | {r['after_ms']:.2f} ({r['after_variant']}) | "
                     f"{r['speedup_after']:.2f}x | {r['zepp_overlap_ms']:.2f} | {r['zepp_auto_ms']:.2f} | "
                     f"{r['auto_vs_overlap']:.2f}x | {r['chosen']} |")
    return out, lines


def main() -> None:
    md = ["# Zepp's per-batch granularity in the paper's table (simulated)", "",
          "Produced by `python benchmarks/simulated/granularity_report.py` from `granularity_bench_{synth,real}.json` "
          "(baselines and zepp-a2av / zepp-overlap / zepp-swap: `zepp bench` on branch h-gran, bit-identical to "
          "`bench_{synth,real}.json` as they stood then) and `granularity_{synth,real}_auto.detail.json` "
          "(`zepp bench [--traces ../shared/traces] --systems zepp-auto` on that branch: 10 timed + 5 warm-up "
          "iterations, seed 0, a100 preset, network calibrated on a2av). "
          "ms = median simulated layer latency, max over ranks. *Before*: Zepp = best of "
          "zepp-a2av / zepp-overlap / zepp-swap (the committed definition); *after*: zepp-auto joins the "
          "variants (zepp-auto = zepp-overlap's mechanics with the groups and waves `zepp.planner.overlap.granularity.choose` "
          "picks per batch, its planning cost charged: `zepp+granularity`). x = fastest baseline / Zepp.", ""]
    summary = {}
    for kind, title in (("synth", "built-in synthetic traces (`zepp bench` default)"),
                        ("real", "recorded traces (`--traces ../shared/traces`)")):
        if not (RES / f"granularity_{kind}_auto.detail.json").is_file():
            continue
        rows, lines = table(kind)
        gb, ga = _geo([r["speedup_before"] for r in rows]), _geo([r["speedup_after"] for r in rows])
        lose_b = sum(r["speedup_before"] < 1 for r in rows)
        lose_a = sum(r["speedup_after"] < 1 for r in rows)
        worst = min(rows, key=lambda r: r["speedup_after"])
        auto_wins = sum(r["zepp_auto_ms"] < r["fastest_baseline_ms"] for r in rows)
        auto_le_overlap = sum(r["zepp_auto_ms"] <= r["zepp_overlap_ms"] for r in rows)
        g_auto = _geo([r["fastest_baseline_ms"] / r["zepp_auto_ms"] for r in rows])
        summary[kind] = dict(rows=rows, geomean_before=gb, geomean_after=ga, rows_lost_before=lose_b,
                             rows_lost_after=lose_a)
        md += [f"## {title}", "", *lines, "",
               f"**Geomean over the fastest baseline: {gb:.2f}x before, {ga:.2f}x after.** Rows Zepp loses: "
               f"{lose_b} before, {lose_a} after; smallest after: {worst['speedup_after']:.2f}x "
               f"({worst['nodes']} nodes {worst['model']} {worst['budget_mb']:g} MB vs {worst['fastest_baseline']}). "
               f"zepp-auto alone: beats the fastest baseline in {auto_wins}/{len(rows)} rows (geomean {g_auto:.2f}x), "
               f"at most zepp-overlap's latency in {auto_le_overlap}/{len(rows)}.", ""]
        summary[kind].update(auto_alone_wins=auto_wins, auto_alone_geomean=g_auto, auto_le_overlap=auto_le_overlap)
    (RES / "granularity.md").write_text("\n".join(md) + "\n")
    (RES / "granularity.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
