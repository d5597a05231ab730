"""Refit the built-in synthetic traces to the real ones and rewrite their parameter files.

    python benchmarks/fit_synth.py [--traces ../shared/traces] [--types 8] [--models k2,qwen]

Writes ``src/zepp/data/synth_<model>.json`` (the shipped parameters) and
``benchmarks/results/synth_fit.{md,json}`` (the statistics of real and synthetic traces side by
side: synthetic over three seeds, mean and spread). The fit is deterministic (``--seed``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from zepp.model import model_preset
from zepp.traces.synthetic import fit_synth, save_params, synthetic_traces, trace_statistics
from zepp.traces.sampling import load_model_traces

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    ap.add_argument("--models", default="k2,qwen")
    ap.add_argument("--types", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-mb", type=float, default=16, help="budget whose tokens per GPU the statistics use")
    ap.add_argument("--out-dir", default=str(ROOT / "src" / "zepp" / "data"))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "synth_fit"))
    args = ap.parse_args()

    report: dict[str, dict] = {}
    lines = ["# Synthetic vs real traces", "",
             f"`python benchmarks/fit_synth.py --types {args.types} --seed {args.seed}`; statistics at "
             f"{args.budget_mb:g} MB per GPU, 4 GPUs per node, home placement (expert e on node e // (E/N)). "
             "Synthetic: mean over seeds 0-2 (and the max - min spread).", ""]
    for model in args.models.split(","):
        spec = model_preset(model)
        pool, ev = load_model_traces(args.traces, model)
        t0 = time.perf_counter()
        params = fit_synth(pool, ev, types=args.types, seed=args.seed, model=model)
        fit_s = time.perf_counter() - t0
        out = Path(args.out_dir) / f"synth_{model}.json"
        save_params(params, out)
        tokens = spec.tokens_for_budget(args.budget_mb)
        real = trace_statistics(pool, ev, tokens)
        synth = [trace_statistics(*synthetic_traces(model, s), tokens) for s in range(3)]
        report[model] = {"real": real, "synthetic": synth, "fit_seconds": fit_s, "numbers": params.count(),
                         "file": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)}
        lines += [f"## {model} ({spec.num_experts} experts, top-{spec.top_k}, {tokens} tokens per GPU; "
                  f"{params.count()} fitted numbers, fit {fit_s:.0f} s)", "",
                  "| statistic | real | synthetic | spread | rel. error |", "| --- | --- | --- | --- | --- |"]
        for key, value in real.items():
            vals = np.array([s[key] for s in synth])
            lines.append(f"| {key} | {value:.4f} | {vals.mean():.4f} | {np.ptp(vals):.4f} | "
                         f"{(vals.mean() - value) / value:+.1%} |")
        lines.append("")
        print(f"{model}: fitted in {fit_s:.1f} s, wrote {out}")
    Path(args.results + ".json").write_text(json.dumps(report, indent=1))
    Path(args.results + ".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
