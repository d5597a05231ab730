"""The paper's ablation (section 6.5) and case study (6.6) on the recorded traces.

Writes ``benchmarks/results/ablation.{json,md,png}``: ``zepp ablation``'s six arms (K2, 4 nodes x
4 A100, 64 MB per GPU, 32 batches per schedule) under the ``in-history``, ``rotating`` and
``unseen`` schedules, with the topics' statistics; and ``ablation_case_study.png``: ``zepp timeline
--schedule unseen --compare zepp-overlap,zepp-swap --budget-mb 64`` (its printed lines go into the markdown).

    python benchmarks/simulated/ablation.py [--traces DIR] [--iters 32] [--budget-mb 64] [--schedules ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402

from zepp.sim import ablation as abl
from zepp.sim.plots import ablation_bars
from zepp.traces.topics import format_statistics, model_topics


def _case_study(traces: str, out: str, budget_mb: float) -> str:
    # the ablation's configuration (K2, 4x4 A100, its budget): the batch size where swaps pay
    cmd = [sys.executable, "-m", "zepp.cli", "timeline", "--schedule", "unseen", "--compare",
           "zepp-overlap,zepp-swap", "--budget-mb", f"{budget_mb:g}", "--traces", traces, "--out", out]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    def local(text: str) -> str:  # the paths as the repository names them
        return text.replace(str(RESULTS), "benchmarks/results").replace(traces, "../shared/traces")

    shown = local(" ".join(["zepp"] + cmd[3:]))
    return f"`{shown}`\n\n```\n{local(done.stdout.strip())}\n```"


def _markdown(res: dict, topics_text: str, case: str, load: tuple) -> str:
    cfg = res["config"]
    swaps = {s: {a: sum(d["arms"][a]["swapped_slots"]) for a in ("swap", "swap1")} for s, d in res["detail"].items()}
    lines = [
        "# Ablation: COMET to Zepp, under drifting demand (simulated)",
        "",
        f"`python benchmarks/simulated/ablation.py` = `zepp ablation --model {cfg['model']} --nodes {cfg['nodes']} --budget-mb "
        f"{cfg['budget_mb']:g} --traces ../shared/traces --iters {cfg['iters']} --schedules "
        f"{','.join(res['schedules'])}`; cluster {cfg['cluster']}, {cfg['gpus_per_node']} GPUs per node; "
        f"mean layer time over the schedule's {cfg['iters']} batches (all timed), ms, and the speedup over comet. "
        f"{res['cpu_s']:.0f} s CPU in all (load average before/after: {load[0]:.1f} / {load[1]:.1f}).",
        "", abl.format_table(res), "", "Arms:", ""]
    lines += [f"- `{a}`: {m}" for a, m in res["arms"].items()]
    lines += ["", "What each step buys:", "", "```", abl.closing_note(res), "```", "",
              "## Where each arm's time goes", "", abl.format_paths(res), "",
              "Swapped slots over the schedule: " + "; ".join(
                  f"{s}: swap {v['swap']}, swap1 {v['swap1']}" for s, v in swaps.items()) + ".", "",
              "Schedules (each batch draws from one topic's eval rows; topic changes every period):", ""]
    lines += [f"- {s}: {d['topic_mix']['describe']}" for s, d in res["detail"].items()]
    lines += ["", "## Topics (k-means on per-prompt expert histograms, `zepp.traces.topics`)", "", "```", topics_text,
              "```", "", "## Case study", "", case, "", "Figure: `ablation_case_study.png`.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_traces_option(ap)
    ap.add_argument("--iters", type=int, default=32)
    ap.add_argument("--budget-mb", type=float, default=64.0)
    ap.add_argument("--schedules", default="in-history,rotating,unseen")
    args = ap.parse_args()
    traces = str(find_traces(args.traces))
    load0 = os.getloadavg()[0]
    t0 = time.time()
    res = abl.run_ablation("k2", 4, 4, args.budget_mb, "a100", traces, tuple(args.schedules.split(",")), args.iters,
                           on_schedule=lambda s, d: print(f"{s}: {d['cpu_s']:.0f} s CPU", file=sys.stderr))
    res["wall_s"] = round(time.time() - t0, 1)
    res["config"]["traces"] = "../shared/traces"
    (RESULTS / "ablation.json").write_text(json.dumps(res, indent=1) + "\n")
    ablation_bars(res, str(RESULTS / "ablation.png"), title=f"k2, 4x4 a100, {args.budget_mb:g} MB, recorded traces")
    case = _case_study(traces, str(RESULTS / "ablation_case_study.png"), args.budget_mb)
    topics = format_statistics(model_topics("k2", traces)).replace(traces, "../shared/traces")
    text = _markdown(res, topics, case, (load0, os.getloadavg()[0]))
    (RESULTS / "ablation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
