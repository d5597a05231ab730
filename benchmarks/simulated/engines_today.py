"""Zepp inside the engines (issue 27's goal rows): SGLang and vLLM on DeepEP's kernels with their
own replica choice, the same engines with Zepp's placement file alone, and with Zepp's placement
and Zepp's table in the engine's own form (``sglang-zepp``, ``vllm-zepp``), against Zepp on its
own kernels (``zepp-deepep``, the gap no table closes).

Per configuration (h200-8; decode: 2 and 8 nodes, K2 and Qwen, 0.5 and 2 MB per GPU; prefill: 2
and 4 nodes, 32 MB per GPU; recorded traces) the simulator (``zepp.sim.run``) runs, each at the
DeepEP mode its batch size picks (low-latency kernels up to 256 tokens per GPU):

- ``before``: ``sglang-deepep``, ``sglang-lp`` and ``vllm-eplb`` with the replica choices the
  project modelled before issue 27 (``locality``, ``lp``, ``random``);
- ``after``: the same rows with the engines' own choices (``sglang-static``, ``sglang-lp``,
  ``vllm-hash``);
- ``+zepp-place``: SGLang's static dispatch / vLLM's hash over Zepp's placement (the file alone);
- ``sglang-zepp`` / ``vllm-zepp``: Zepp's placement and Zepp's table (``engine_tables``);
- ``zepp-deepep``: Zepp's best on DeepEP's kernels (``bench_today``'s variants);
- at decode, ``sglang-zepp+dedup`` / ``vllm-zepp+dedup``: the engine with Zepp's files and one
  kernel change, DeepEP's low-latency dispatch sending a token once per destination GPU (its
  outputs summed there) instead of once per entry: the smallest engine change measured here.

Network figures: DeepEP's published ones. Deterministic.

    PYTHONPATH=src python benchmarks/simulated/engines_today.py --traces ../shared/traces
writes ``benchmarks/results/engines_today.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_today's configurations and Zepp's variants
from bench_today import DECODE_ZEPP, PREFILL_ZEPP, config  # noqa: E402
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp import registry  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.sim.run import Shared, run_system  # noqa: E402

DECODE = [("h200-8", n, 8, m, mb) for n in (2, 8) for m in ("k2", "qwen") for mb in (0.5, 2.0)]
PREFILL = [("h200-8", n, 8, m, 32.0) for n in (2, 4) for m in ("k2", "qwen")]
ENGINES = {"sglang": ("sglang-deepep", "sglang-zepp"), "vllm": ("vllm-eplb", "vllm-zepp")}
BEFORE = {"sglang-deepep": "locality", "sglang-lp": "lp", "vllm-eplb": "random"}  # the routings before issue 27
GOALS = "sglang-zepp / sglang-deepep: decode every row >= 1.0x, geomean >= 1.05x; prefill every row >= 1.0x; " \
        "vllm-zepp / vllm-eplb: geomean >= 1.15x"


def rows_of(tokens: int) -> dict:
    """The rows a configuration runs (name -> a registry row or a name), each at its DeepEP mode."""
    at = lambda n: registry.SYSTEMS[registry.pick_variant(n, tokens, {})]  # noqa: E731
    rows = {f"{n}@before": replace(at(n), name=f"{n}@before", routing=r) for n, r in BEFORE.items()}
    rows.update({n: n for n in BEFORE})
    for own, zepp in ENGINES.values():
        rows[f"{own}+zepp-place"] = replace(at(own), name=f"{own}+zepp-place", placement="zepp")
        rows[zepp] = zepp
        if tokens <= registry.SYSTEMS[zepp].switch_tokens:
            rows[f"{zepp}+dedup"] = replace(at(zepp), name=f"{zepp}+dedup", dispatch="dedup", combine="dedup")
    return rows


def run_config(point, traces, seed: int) -> dict:
    cluster, nodes, gpn, model, mb = point
    tokens = model_preset(model).tokens_for_budget(mb)
    decode = tokens <= registry.SYSTEMS["sglang-deepep"].switch_tokens
    t0 = time.process_time()
    cfg, source = config(cluster, nodes, gpn, model, tokens, traces, seed, 5 if decode else 2)
    shared = Shared()
    out = {}
    for name, row in rows_of(tokens).items():
        res = run_system(row, cfg, shared=shared)
        out[name] = dict(median_ms=res.median * 1e3, floor_ms=float(np.median(res.lower_bound)) * 1e3,
                         variant=res.variant or (row if isinstance(row, str) else row.name))
    zepp = DECODE_ZEPP if decode else PREFILL_ZEPP
    for v in zepp:
        res = run_system(v, cfg, shared=shared)
        out[v] = dict(median_ms=res.median * 1e3, floor_ms=float(np.median(res.lower_bound)) * 1e3, variant=v)
    best = min(zepp, key=lambda v: out[v]["median_ms"])
    out["zepp-deepep"] = dict(out[best], variant=best)
    return dict(cluster=cluster, nodes=nodes, gpus_per_node=gpn, model=model, budget_mb=mb, tokens_per_gpu=tokens,
                regime="decode" if decode else "prefill", traces=source, systems=out,
                cpu_s=time.process_time() - t0)


def ratio(r: dict, a: str, b: str) -> float:
    """How much faster ``b`` runs than ``a`` on row ``r`` (``a``'s time over ``b``'s)."""
    return r["systems"][a]["median_ms"] / r["systems"][b]["median_ms"]


def geomean(xs) -> float:
    return float(np.exp(np.mean(np.log(list(xs)))))


def summary(rows: list[dict]) -> list[str]:
    out = []
    for reg in ("decode", "prefill"):
        sel = [r for r in rows if r["regime"] == reg]
        if not sel:
            continue
        for eng, (own, zepp) in ENGINES.items():
            rs = [ratio(r, own, zepp) for r in sel]
            fix = [ratio(r, f"{own}@before", own) for r in sel]
            place = [ratio(r, own, f"{own}+zepp-place") for r in sel]
            gap = [ratio(r, zepp, "zepp-deepep") for r in sel]
            dedup = [ratio(r, own, f"{zepp}+dedup") for r in sel if f"{zepp}+dedup" in r["systems"]]
            out.append(f"- {reg}, {eng}: {zepp} over {own} geomean {geomean(rs):.3f}x (rows {min(rs):.3f}-"
                       f"{max(rs):.3f}x; {sum(x < 1 for x in rs)} below 1.0x); the placement file alone "
                       f"{geomean(place):.3f}x; the replica-choice fix moves {own}'s time by "
                       f"{1 / geomean(fix):.3f}x (after over before); zepp-deepep over {zepp} {geomean(gap):.3f}x "
                       f"(the gap merge, split and overlap leave)"
                       + (f"; with the low-latency dispatch once per destination GPU ({zepp}+dedup) "
                          f"{geomean(dedup):.3f}x over {own}" if dedup else ""))
    every = {eng: geomean(ratio(r, own, zepp) for r in rows) for eng, (own, zepp) in ENGINES.items()}
    out.append(f"- every row: sglang-zepp over sglang-deepep {every['sglang']:.3f}x, vllm-zepp over vllm-eplb "
               f"{every['vllm']:.3f}x")
    return out


def write(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "engines_today.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    cols = ["sglang-deepep@before", "sglang-deepep", "sglang-deepep+zepp-place", "sglang-zepp", "sglang-lp@before",
            "sglang-lp", "vllm-eplb@before", "vllm-eplb", "vllm-eplb+zepp-place", "vllm-zepp", "zepp-deepep"]
    head = ["nodes", "model", "MB/GPU", "tokens/GPU", *[c + " ms" for c in cols], "sglang-zepp x", "vllm-zepp x",
            "zepp-deepep variant"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        s = r["systems"]
        lines.append("| " + " | ".join([f"{r['nodes']}x{r['gpus_per_node']}", r["model"], f"{r['budget_mb']:g}",
                                        str(r["tokens_per_gpu"]), *[f"{s[c]['median_ms']:.3f}" for c in cols],
                                        f"{ratio(r, 'sglang-deepep', 'sglang-zepp'):.3f}",
                                        f"{ratio(r, 'vllm-eplb', 'vllm-zepp'):.3f}",
                                        s["zepp-deepep"]["variant"]]) + " |")
    text = ["# Zepp inside SGLang and vLLM: the engines' kernels and replica choice, Zepp's placement and tables", "",
            "Simulated MoE layer latency (ms, median), `benchmarks/simulated/engines_today.py`, h200-8, DeepEP's "
            "published network figures, recorded traces. `@before`: the replica choice modelled before issue 27 "
            "(SGLang static as `locality`, vLLM as `random`, lp over every copy); without it: the engines' own "
            "(`sglang-static`, `sglang-lp` over SGLang's candidate lists, `vllm-hash`). `+zepp-place`: the engine's "
            "own choice over Zepp's placement file. `sglang-zepp` / `vllm-zepp`: Zepp's placement and Zepp's table "
            "through the engine's own dispatch. `x`: the engine's time over the engine with Zepp's files.", "",
            f"Goals: {GOALS}.", "", *summary(rows), "", *lines, "",
            f"CPU {meta['cpu_s']:.0f} s, wall {meta['wall_s']:.0f} s, load average at the end {meta['loadavg']}, "
            f"seed {meta['seed']}."]
    (out / "engines_today.md").write_text("\n".join(text) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="Zepp inside SGLang and vLLM, issue 27's goal rows")
    ap.add_argument("--regime", choices=("decode", "prefill", "both"), default="both")
    ap.add_argument("--out", default=str(RESULTS), help="folder of engines_today.{md,json}")
    ap.add_argument("--seed", type=int, default=0)
    add_traces_option(ap)
    args = ap.parse_args()
    traces = str(find_traces(args.traces))
    grid = {"decode": DECODE, "prefill": PREFILL, "both": DECODE + PREFILL}[args.regime]
    t0, w0 = time.process_time(), time.perf_counter()
    rows = []
    for p in grid:
        rows.append(run_config(p, traces, args.seed))
        r = rows[-1]
        print(f"{p}: sglang-zepp {ratio(r, 'sglang-deepep', 'sglang-zepp'):.3f}x, vllm-zepp "
              f"{ratio(r, 'vllm-eplb', 'vllm-zepp'):.3f}x, {r['cpu_s']:.0f} s CPU", flush=True)
        meta = dict(seed=args.seed, traces=os.path.basename(traces.rstrip("/")), cpu_s=time.process_time() - t0,
                    wall_s=time.perf_counter() - w0, loadavg=" ".join(f"{x:.1f}" for x in os.getloadavg()),
                    network="DeepEP published (zepp.sim.calibrate.PUBLISHED)", goals=GOALS)
        write(rows, meta, Path(args.out))


if __name__ == "__main__":
    main()
