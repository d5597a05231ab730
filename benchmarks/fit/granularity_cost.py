"""Record the op-mix rounds of Zepp's granularity choice (``zepp.planner.overlap.granularity.choose``), the
``granularity`` part of the simulator's planning-cost model (``zepp.sim.planning_cost``).

    python benchmarks/fit/granularity_cost.py    # adds "granularity" to src/zepp/data/planner_cost.json

Same rule as ``benchmarks/fit/planner_cost.py`` (whose op mix and timing it reuses): the choice is
timed with numpy next to the op mix, in the same process and moment, at the paper table's
configurations with at least ``MIN_ENTRIES`` entries; the recorded count is the median ratio
``choice / mix``. Only the ``granularity`` key of ``rounds`` (and its source) is written; the
other parts' records stay as they are.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/fit/: its sibling planner_cost.py

from planner_cost import MIN_ENTRIES, OUT, best, opmix  # noqa: E402

from zepp.cluster import cluster_preset  # noqa: E402
from zepp.planner.flows import build_flows  # noqa: E402
from zepp.planner.overlap.granularity import Figures, choose  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.planner.placement import make_placement  # noqa: E402
from zepp.planner.routing import route  # noqa: E402
from zepp.traces.synthetic import synthetic_traces  # noqa: E402
from zepp.traces import node_demand, sample_batches  # noqa: E402


def main() -> None:
    rows = []
    for model in ("k2", "qwen"):
        spec = model_preset(model)
        pool, ev = synthetic_traces(model, 0)
        for nodes in (4, 8, 16):
            R, L = nodes * 4, 4
            pl = make_placement("zepp", node_demand(pool, nodes, L), spec.num_experts, R, L)
            C = 0.5 if nodes >= 16 else 0.25
            fig = Figures.of(cluster_preset("a100", nodes, L))
            for mb in (1.0, 4.0, 16.0):
                batch = sample_batches(ev, R, spec.tokens_for_budget(mb), 1, 0)[0]
                n = int(batch.size)
                if n < MIN_ENTRIES:
                    continue
                plan = build_flows(route("zepp", batch, pl, C), "zepp", spec.row_bytes, "reduce")
                mix = opmix(n)
                t_mix = best(mix, 5)
                t_part = best(lambda: choose(plan, spec, fig), 3)
                ratio = t_part / (t_mix + best(mix, 5)) * 2
                rows.append({"model": model, "nodes": nodes, "budget_mb": mb, "entries": n, "rounds": ratio})
                print(model, nodes, mb, n, round(ratio, 3), flush=True)
    rounds = statistics.median(r["rounds"] for r in rows)
    data = json.loads(OUT.read_text())
    data["rounds"]["granularity"] = rounds
    data["granularity_source"] = {"measured": datetime.date.today().isoformat(), "host": platform.node(),
                                  "script": "benchmarks/fit/granularity_cost.py",
                                  "rule": f"median of choose/opmix over configurations with >= {MIN_ENTRIES} entries",
                                  "per_configuration": rows}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print("granularity rounds", round(rounds, 3), "->", OUT)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, before any work
    main()
