"""Refit the built-in synthetic traces to the real ones and rewrite their parameter files.

    python benchmarks/fit/fit_synth.py [--traces ../shared/traces] [--types 8] [--models k2,qwen]

Writes ``src/zepp/data/synth_<model>.json`` (the shipped parameters) and
``benchmarks/results/fit_synth.{md,json}`` (the statistics of real and synthetic traces side by
side: synthetic over three seeds, mean and spread). The fit is deterministic (``--seed``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import DATA, RESULTS, ROOT, add_traces_option, find_traces  # noqa: E402

from zepp.model import model_preset  # noqa: E402
from zepp.traces.synthetic import save_params, synthetic_traces  # noqa: E402
from zepp.traces.synthetic_fit import fit_synth  # noqa: E402
from zepp.traces.trace_stats import trace_statistics  # noqa: E402
from zepp.traces import load_model_traces  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_traces_option(ap)
    ap.add_argument("--models", default="k2,qwen")
    ap.add_argument("--types", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-mb", type=float, default=16, help="budget whose tokens per GPU the statistics use")
    ap.add_argument("--out-dir", default=str(DATA))
    ap.add_argument("--results", default=str(RESULTS / "fit_synth"))
    args = ap.parse_args()
    traces = find_traces(args.traces)

    report: dict[str, dict] = {}
    lines = ["# Synthetic vs real traces", "",
             f"`python benchmarks/fit/fit_synth.py --types {args.types} --seed {args.seed}`; statistics at "
             f"{args.budget_mb:g} MB per GPU, 4 GPUs per node, home placement (expert e on node e // (E/N)). "
             "Synthetic: mean over seeds 0-2 (and the max - min spread).", ""]
    for model in args.models.split(","):
        spec = model_preset(model)
        pool, ev = load_model_traces(traces, model)
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
