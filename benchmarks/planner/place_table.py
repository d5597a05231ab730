"""What Zepp's placement buys an engine, at 2, 4 and 8 nodes of 8 GPUs (issue 10's table).

For each trace and node count: EPLB's placement (the engines' default) and Zepp's, both with
one redundant expert per GPU in total (``R`` = GPU count), planned on the history window; then
batches sampled from the held-out window are routed five ways per engine:

- ``eplb``: the engine's own replica choice over EPLB (SGLang ``sglang-static`` and
  ``sglang-dynamic``, vLLM ``vllm-hash``, TensorRT-LLM ``replica-rr``);
- ``zepp-place``: the same replica choice over Zepp's placement (what ``zepp place`` buys with
  no change to the engine);
- ``zepp-table``: the engine's own dispatch over Zepp's placement and Zepp's table in the engine's
  form (SGLang static and vLLM only: what ``zepp place``'s two files buy with ``zepp.engines``);
- ``zepp-route``: Zepp's routing over Zepp's placement, on the engine's transport;
- ``zepp-full``: Zepp's routing and transport.

The engine transport is DeepEP-style relay dispatch with in-node reduced combine
(``relay``/``reduce``). Figures per batch (mean of ``--iters``), dispatch + combine: the busiest
NIC's bytes and the busiest GPU's GEMM rows.

Traces: the recorded ones (``--traces``, found by ``benchmarks/paths.py``; K2 and Qwen3-235B,
MoE layer 5: history ``pool.txt``, held out ``eval.txt``) and a synthetic multi-layer trace
(``zepp.traces.synthetic.synthetic_history``: DeepSeek-V3 from the K2 skew profile, the first
``--layers`` MoE layers, history = pool window, held out = eval window); for multi-layer traces
the figures are sums over the layers.

    python benchmarks/planner/place_table.py [--iters 3] [--budget-mb 4] [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.cluster import cluster_preset  # noqa: E402
from zepp.planner.flows import build_flows  # noqa: E402
from zepp.traces import history_from_traces  # noqa: E402
from zepp.interop.buys import simulated_ms  # noqa: E402
from zepp.interop.layers import plan_layers  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.interop.engine_tables import table_routing  # noqa: E402
from zepp.planner.routing import ROUTINGS, demand_per_gpu, route  # noqa: E402
from zepp.traces import load_model_traces  # noqa: E402

ENGINES = {"sglang": "sglang-static", "sglang-dyn": "sglang-dynamic", "vllm": "vllm-hash", "trtllm": "replica-rr"}
TABLE_FORMAT = {"sglang": "sglang", "vllm": "vllm"}  # engines whose dispatch takes Zepp's table (zepp.engines)
CONFIGS = ("eplb", "zepp-place", "zepp-table", "zepp-route", "zepp-full")
NODES = (2, 4, 8)
L = 8


def _fig(batches, placement, routing, dispatch, combine, row_bytes, rel, table=None):
    nic, rows = [], []
    for b in batches:
        r = route(routing, b, placement, relaxation=rel, table=table)
        st = build_flows(r, dispatch, row_bytes, combine).stats()
        nic.append(st.busiest_nic_bytes)
        rows.append(int(r.rows_per_rank().max()))
    return float(np.mean(nic)), float(np.mean(rows))


def workloads(traces: Path, layers: int, seed: int):
    for model, name in (("k2", "K2 (real, layer 5)"), ("qwen", "Qwen3-235B (real, layer 5)")):
        pool, ev = load_model_traces(traces, model)
        yield name, model, history_from_traces([pool], (5,), str(pool.source)), \
            history_from_traces([ev], (5,), str(ev.source))
    from zepp.traces.synthetic import synthetic_history

    spec = model_preset("deepseek-v3")
    sel = spec.moe_layers[:layers]
    yield (f"DeepSeek-V3 (synthetic, K2 profile, {layers} layers)", "deepseek-v3",
           synthetic_history("deepseek-v3", "k2", seed, "pool", sel), synthetic_history("deepseek-v3", "k2", seed, "eval", sel))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--budget-mb", type=float, default=4.0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "place_table"))
    ap.add_argument("--replot", default=None, help="only redraw the PNG from this results JSON")
    add_traces_option(ap)
    args = ap.parse_args()
    if args.replot:
        replot(args.replot)
        return
    traces = find_traces(args.traces)
    t0 = time.time()
    rows = []
    for name, model, hist, held in workloads(traces, args.layers, args.seed):
        spec = model_preset(model)
        tokens = spec.tokens_for_budget(args.budget_mb)
        for nodes in NODES:
            ranks = nodes * L
            rel = 0.5 if nodes >= 16 else 0.25
            zp, _ = plan_layers(hist, spec, nodes, L, ranks, "zepp")
            ep, _ = plan_layers(hist, spec, nodes, L, ranks, "eplb")
            acc = {(e, c): np.zeros(2) for e in ENGINES for c in CONFIGS}
            sim = {}
            for i, layer in enumerate(held.layers):
                batches = held.batches(i, ranks, tokens, args.iters, args.seed)
                zpl, epl = zp.placement(layer), ep.placement(layer)
                demand = demand_per_gpu(hist.node_demand(i, nodes, L)[0], L)
                tables = {e: (table_routing(f, tokens), ROUTINGS[table_routing(f, tokens)].build_table(zpl, demand, rel, L))
                          for e, f in TABLE_FORMAT.items()}
                shared = {"zepp-route": _fig(batches, zpl, "zepp", "relay", "reduce", spec.row_bytes, rel),
                          "zepp-full": _fig(batches, zpl, "zepp", "zepp", "reduce", spec.row_bytes, rel)}
                if i == 0:  # simulated layer time: SGLang static's rows, first layer, first batch
                    cluster = cluster_preset("h100-8", nodes)
                    st, stable = tables["sglang"]
                    for c, (pl, kind, rt, d, t) in {"eplb": (epl, "eplb", ENGINES["sglang"], "relay", None),
                                                    "zepp-place": (zpl, "zepp", ENGINES["sglang"], "relay", None),
                                                    "zepp-table": (zpl, "zepp", st, "relay", stable),
                                                    "zepp-route": (zpl, "zepp", "zepp", "relay", None),
                                                    "zepp-full": (zpl, "zepp", "zepp", "zepp", None)}.items():
                        r = route(rt, batches[0], pl, relaxation=rel, table=t)
                        sim[c] = simulated_ms(cluster, spec, kind, rt, d, "reduce", build_flows(r, d, spec.row_bytes,
                                                                                                "reduce"))
                for e, rt in ENGINES.items():
                    acc[(e, "eplb")] += _fig(batches, epl, rt, "relay", "reduce", spec.row_bytes, rel)
                    acc[(e, "zepp-place")] += _fig(batches, zpl, rt, "relay", "reduce", spec.row_bytes, rel)
                    acc[(e, "zepp-table")] += (_fig(batches, zpl, *tables[e][:1], "relay", "reduce", spec.row_bytes,
                                                    rel, tables[e][1]) if e in tables else np.nan)
                    acc[(e, "zepp-route")] += shared["zepp-route"]
                    acc[(e, "zepp-full")] += shared["zepp-full"]
            for e in ENGINES:
                rows.append({"trace": name, "model": model, "nodes": nodes, "gpus": ranks, "engine": e,
                             "routing": ENGINES[e], "table": table_routing(TABLE_FORMAT[e], tokens)
                             if e in TABLE_FORMAT else None, "layers": len(held.layers), "tokens_per_gpu": tokens,
                             **{f"{c}_nic_bytes": acc[(e, c)][0] for c in CONFIGS},
                             **{f"{c}_gpu_rows": acc[(e, c)][1] for c in CONFIGS},
                             **({f"{c}_sim_ms": sim[c] for c in CONFIGS} if e == "sglang" else {})})
            r = rows[-len(ENGINES)]
            print(f"{name:<45} {nodes} nodes  sglang NIC x eplb: " + " ".join(
                f"{c} {r[f'{c}_nic_bytes'] / r['eplb_nic_bytes']:.2f}" for c in CONFIGS) + f"  ({time.time() - t0:.0f} s)",
                flush=True)
    meta = {"iters": args.iters, "budget_mb": args.budget_mb, "gpus_per_node": L, "redundant": "one per GPU",
            "transport": "relay/reduce (engines), zepp/reduce (zepp-full)", "seconds": round(time.time() - t0, 1),
            "when": time.strftime("%Y-%m-%d %H:%M")}
    meta["simulated"] = ("SGLang static rows only (zepp-table: SGLang's dispatch over Zepp's table): zepp.sim on h100-8 (DeepEP's published network figures, zepp.sim.calibrate.network_of), "
                         "first layer, first batch, no overlap for any configuration")
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    write_md(rows, meta, Path(args.out + ".md"))
    plot(rows, Path(args.out + ".png"))
    print("wrote", args.out + ".md", args.out + ".json", args.out + ".png")


def replot(json_path: str) -> None:
    """Redraw the figure from a results JSON (``python benchmarks/planner/place_table.py --replot FILE``)."""
    d = json.loads(Path(json_path).read_text())
    plot(d["rows"], Path(json_path).with_suffix(".png"))
    print("wrote", Path(json_path).with_suffix(".png"))


def write_md(rows, meta, path: Path) -> None:
    mib = 2.0 ** 20
    out = ["# What Zepp's placement buys an engine (zepp place), 2-8 nodes of 8 GPUs", "",
           f"`python benchmarks/planner/place_table.py` ({meta['when']}, {meta['seconds']} s). Per batch of "
           f"{meta['budget_mb']:g} MiB per GPU, mean of {meta['iters']} batches from the held-out window, dispatch + "
           f"combine, {meta['transport']}; redundant experts: {meta['redundant']}. Multi-layer rows sum the layers.",
           "", "Columns: `eplb` = the engine's replica choice over EPLB's placement (today); `zepp-place` = the same "
           "choice over the file `zepp place` writes; `zepp-table` = the engine's own dispatch over that file and "
           "Zepp's table (SGLang static, vLLM; `zepp.engines`); `zepp-route` = Zepp's routing over it (engine "
           "transport); `zepp-full` = Zepp's routing and transport. `x` = ratio to `eplb` (below 1 is better).", "",
           "| trace | nodes | engine (routing) | busiest NIC MiB: eplb | zepp-place | zepp-table | zepp-route | "
           "zepp-full | busiest GPU rows: eplb | zepp-place | zepp-table | zepp-route | zepp-full |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    cell = lambda v, b, f: "-" if v != v else f"{f(v)} ({v / b:.2f}x)"  # noqa: E731
    for r in rows:
        nb, gb = r["eplb_nic_bytes"], r["eplb_gpu_rows"]
        nic = [f"{nb / mib:.1f}"] + [cell(r[f"{c}_nic_bytes"], nb, lambda v: f"{v / mib:.1f}") for c in CONFIGS[1:]]
        gpu = [f"{gb:.0f}"] + [cell(r[f"{c}_gpu_rows"], gb, lambda v: f"{v:.0f}") for c in CONFIGS[1:]]
        out.append(f"| {r['trace']} | {r['nodes']} | {r['engine']} ({r['routing']}) | " + " | ".join(nic + gpu) + " |")
    out += ["", f"Simulated layer time ({meta.get('simulated', '')}):", "",
            "| trace | nodes | eplb ms | zepp-place | zepp-table | zepp-route | zepp-full |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "eplb_sim_ms" in r:
            b = r["eplb_sim_ms"]
            out.append(f"| {r['trace']} | {r['nodes']} | {b:.3f} | " + " | ".join(
                f"{r[f'{c}_sim_ms']:.3f} ({r[f'{c}_sim_ms'] / b:.2f}x)" for c in CONFIGS[1:]) + " |")
    path.write_text("\n".join(out) + "\n")


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig, axes = plt.subplots(2, len(traces), figsize=(5.6 * len(traces), 8.2), squeeze=False)
    colors = {"eplb": "#8c8c8c", "zepp-place": "#6baed6", "zepp-table": "#4292c6", "zepp-route": "#2171b5",
              "zepp-full": "#08306b"}
    labels = {"eplb": "engine routing, EPLB placement", "zepp-place": "engine routing, Zepp placement",
              "zepp-table": "engine dispatch, Zepp placement + table", "zepp-route": "Zepp routing, engine transport",
              "zepp-full": "Zepp routing and transport"}
    engines = list(ENGINES)
    for j, t in enumerate(traces):
        for i, (metric, title) in enumerate((("nic_bytes", "busiest NIC"), ("gpu_rows", "busiest GPU rows"))):
            ax = axes[i][j]
            sub = [r for r in rows if r["trace"] == t]
            groups = [(n, e) for n in NODES for e in engines]
            x = np.arange(len(groups), dtype=float) + np.repeat(np.arange(len(NODES)) * 0.8, len(engines))
            w = 0.16
            for k, c in enumerate(CONFIGS):
                vals = []
                for n, e in groups:
                    r = next(r for r in sub if r["nodes"] == n and r["engine"] == e)
                    vals.append(r[f"{c}_{metric}"] / r[f"eplb_{metric}"])
                ax.bar(x + (k - 2) * w, vals, w, color=colors[c], label=labels[c] if (i, j) == (0, 0) else None)
            ax.axhline(1.0, color="k", lw=0.8)
            short = {"sglang": "SGLang static", "sglang-dyn": "SGLang dynamic", "vllm": "vLLM", "trtllm": "TRT-LLM"}
            ax.set_xticks(x, [short[e] for _, e in groups], fontsize=7.5, rotation=40, ha="right")
            for g, n in enumerate(NODES):
                ax.text(x[g * len(engines):(g + 1) * len(engines)].mean(), 1.27, f"{n} nodes x 8 GPUs",
                        ha="center", fontsize=9)
            ax.set_ylabel(f"{title}\n(ratio to the engine on EPLB)", fontsize=9)
            ax.set_title(f"{t}: {title}", fontsize=10)
            ax.set_ylim(0.6, 1.32)
            ax.grid(axis="y", lw=0.3, alpha=0.6)
    fig.legend(loc="lower center", ncol=5, fontsize=9, frameon=False)
    fig.suptitle("Busiest NIC bytes and busiest GPU rows per batch, held-out window (below 1: better than the "
                 "engine's own EPLB)", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
