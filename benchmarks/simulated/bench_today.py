"""Today's clusters: Zepp on DeepEP's kernels against SGLang + DeepEP + EPLB and vLLM + EPLB.

Per configuration (cluster, nodes, model, tokens per GPU) the simulator (``zepp.sim.run``) runs
``sglang-deepep`` and ``vllm-eplb`` (each the DeepEP mode its batch size picks: low-latency
kernels up to 256 tokens per GPU, normal kernels above; ``zepp.registry``) and Zepp's variants
on the same kernels (``zepp-deepep-*``), and reports Zepp's best variant against each, with
every system's own physical floor (``zepp.sim.run.own_floor``: busiest NIC's bytes at the NIC
rate, busiest GPU's FLOPs at peak, its expert-weight reads at HBM rate) and the configuration's
floor (the smallest of them).

Network figures: DeepEP's published ones (``zepp.sim.calibrate.PUBLISHED``, PAPER.md section 5),
nothing fitted. Traces: the recorded ones for K2 and Qwen (``--traces``, found by
``benchmarks/paths.py``; the built-in synthetic ones where absent, and each row records which),
built-in synthetic traces for DeepSeek-V3 (no recorded trace exists). The grid is sized to this
machine (2 shared CPU cores): the simulator builds a layer from the plan's counts (``zepp.sim.cell_flows``), so
its cost grows with the messages and tasks (ranks squared for the low-latency kernels' per-pair messages) more
than with the tokens, and 16K tokens per GPU run up to 32 nodes of 8; ``GRID`` lists what runs and
``NOT_RUN`` what does not and why. Deterministic: the same
arguments give the same file.

    PYTHONPATH=src python benchmarks/simulated/bench_today.py --traces ../shared/traces
writes ``benchmarks/results/bench_today.{md,json,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from bench_today_figure import plot  # noqa: E402
from zepp import registry  # noqa: E402
from zepp.sim.calibrate import calibrated, network_of  # noqa: E402
from zepp.errors import ZeppInputError  # noqa: E402
from zepp.sim.planner_times import charged_records, read_device_run  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.sim.run import Config, Shared, run_system  # noqa: E402
from zepp.traces import node_demand, sample_batches  # noqa: E402

# today's engines, each switching DeepEP's kernels by batch size; sglang-lp where the registry has it
BASELINES = tuple(b for b in ("sglang-deepep", "vllm-eplb", "sglang-lp") if b in registry.SYSTEMS)
# Zepp's variants (zepp-deepep's own list in the registry): on decode-sized batches every one but
# those on the normal kernels' overlap mechanics; on prefill-sized ones the normal-kernel variants
# (with and without overlap, and the LP-balanced one). Leaving variants out can only slow Zepp.
PREFILL_ZEPP = tuple(v for v in ("zepp-deepep-normal", "zepp-deepep-overlap", "zepp-deepep-lp")
                     if v in registry.SYSTEMS["zepp-deepep"].best_of)
DECODE_ZEPP = tuple(v for v in registry.SYSTEMS["zepp-deepep"].best_of
                    if v not in ("zepp-deepep-overlap", "zepp-deepep-lp"))

# (cluster, nodes, gpus per node, model, tokens per GPU)
GRID = (
    # decode-sized batches, h200-8 at 2-32 nodes
    *[("h200-8", n, 8, m, t) for m in ("deepseek-v3", "k2", "qwen") for n in (2, 8, 32) for t in (64, 256)
      if not (m != "deepseek-v3" and n == 32)],
    *[("h200-8", n, 8, m, 128) for m in ("deepseek-v3", "k2", "qwen") for n in (4, 16)],
    # prefill-sized batches, h200-8 (4-8M routed entries per batch at 16-32 nodes)
    *[("h200-8", n, 8, m, 4096) for m in ("deepseek-v3", "k2", "qwen") for n in (2, 4, 8, 16)],
    ("h200-8", 32, 8, "deepseek-v3", 4096),
    *[("h200-8", 2, 8, m, 16384) for m in ("deepseek-v3", "k2", "qwen")],
    ("h200-8", 4, 8, "deepseek-v3", 16384),
    *[("h200-8", 16, 8, m, 16384) for m in ("deepseek-v3", "k2", "qwen")],
    ("h200-8", 32, 8, "deepseek-v3", 16384),
    # GB200 NVL72: 64 of the rack's 72 GPUs run EP (the experts must divide the GPUs)
    *[("gb200-nvl72", n, 64, "deepseek-v3", 128) for n in (1, 2)],
    *[("gb200-nvl72", n, 64, "deepseek-v3", 4096) for n in (1, 2)],
)
CAVEATS = (
    "DeepEP's normal kernels are modelled without their chunked pipelining: a forwarded message leaves a "
    "gateway when all its rows have arrived, so at 4K tokens per GPU the simulated normal-mode dispatch reaches "
    "24-32 GB/s of RDMA per rank at EP 16-64 against DeepEP's published 43-58 GB/s (tests/sim/test_sim_today.py, a strict "
    "xfail). The baselines' prefill communication is therefore too slow, which flatters Zepp's overlap variant: "
    "without overlap (zepp-deepep-normal, in the JSON) Zepp is 0.99-1.19x sglang-deepep on h200-8 prefill "
    "(1.52x at 8 nodes, Qwen) and 0.88-1.19x vllm-eplb.",
)
NOT_RUN = (
    "k2 and qwen at 32 nodes of 8: their 384 and 128 experts do not divide over 256 GPUs (16 nodes is their largest)",
    "16K tokens per GPU at 8 nodes (the 2, 4, 16 and 32 node rows bracket it)",
    "gb200-nvl72 at 72 GPUs per rack: 256/384/128 experts do not divide over 72 GPUs (64 run EP)",
)


def traces_for(model: str, traces_dir: str | None, seed: int):
    """``(pool, eval, source)``: recorded traces where ``traces_dir`` has the model, else built-in
    synthetic ones."""
    from zepp.model import trace_dirs
    from zepp.traces.synthetic import synthetic_traces
    from zepp.traces import load_model_traces

    if traces_dir and any((Path(traces_dir) / d / "eval.txt").is_file() for d in trace_dirs(model)):
        pool, ev = load_model_traces(traces_dir, model)
        return pool, ev, "recorded"
    pool, ev = synthetic_traces(model, seed)
    return pool, ev, "synthetic"


def config(cluster: str, nodes: int, gpn: int, model: str, tokens: int, traces_dir, seed: int, iters: int):
    cl, net = calibrated(cluster, nodes, gpus_per_node=gpn)
    spec = model_preset(model)
    pool, ev, source = traces_for(model, traces_dir, seed)
    hist = node_demand(pool, cl.nodes, cl.gpus_per_node)
    batches = sample_batches(ev, cl.ranks, tokens, iters, seed)
    return Config(cl, spec, net, hist, batches, warmup=0), source


def run_config(point, traces_dir, seed: int) -> dict:
    cluster, nodes, gpn, model, tokens = point
    decode = tokens <= registry.SYSTEMS["sglang-deepep"].switch_tokens
    iters = 3 if decode else 1
    t0 = time.process_time()
    cfg, source = config(cluster, nodes, gpn, model, tokens, traces_dir, seed, iters)
    shared = Shared()
    out = {}
    for name in BASELINES + (DECODE_ZEPP if decode else PREFILL_ZEPP):
        res = run_system(name, cfg, shared=shared)
        out[name] = dict(median_ms=res.median * 1e3, floor_ms=float(np.median(res.lower_bound)) * 1e3,
                         planning_ms=float(np.median(res.planning)) * 1e3, variant=res.variant)
    zepp = [v for v in (DECODE_ZEPP if decode else PREFILL_ZEPP)]
    best = min(zepp, key=lambda v: out[v]["median_ms"])
    out["zepp-deepep"] = dict(out[best], variant=best)
    z = out["zepp-deepep"]["median_ms"]
    fastest = min(BASELINES, key=lambda b: out[b]["median_ms"])
    row = dict(cluster=cluster, nodes=nodes, gpus_per_node=gpn, model=model, tokens_per_gpu=tokens,
               regime="decode" if decode else "prefill", traces=source, iters=iters, systems=out,
               speedup_vs_sglang=out["sglang-deepep"]["median_ms"] / z,
               speedup_vs_vllm=out["vllm-eplb"]["median_ms"] / z,
               fastest_baseline=fastest, speedup_vs_fastest=out[fastest]["median_ms"] / z,
               floor_ms=min(v["floor_ms"] for v in out.values()))
    if "sglang-lp" in out:
        row["speedup_vs_lp"] = out["sglang-lp"]["median_ms"] / z
    # CPU seconds of this configuration (this process; the simulator starts no child process)
    row["cpu_s"] = time.process_time() - t0
    row["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return row


DIAGNOSE = (("gb200-nvl72", 2, 64, "deepseek-v3", 4096),)  # two racks at prefill: why the systems differ
DIAGNOSE_SYSTEMS = tuple(n for n in ("sglang-deepep", "vllm-eplb", "sglang-lp", "zepp-deepep-overlap", "zepp-deepep-lp")
                         if n in registry.SYSTEMS)


def diagnose(point, traces_dir, seed: int) -> dict:
    """Per system of one configuration's first batch: the busiest GPU's rows over the mean, the
    busiest GPU's GEMM seconds, when the dispatch ends and the layer's latency (ms)."""
    from zepp.sim.run import simulate_plan

    cfg, _ = config(*point, traces_dir, seed, 1)
    shared = Shared()
    R = cfg.cluster.ranks
    out = {}
    for name in DIAGNOSE_SYSTEMS:
        s = registry.system(registry.pick_variant(name, point[4], {}) if registry.SYSTEMS[name].best_of else name)
        plan = shared.plan(s, cfg, 0)
        slot = plan.routing.slot.ravel()
        rows = np.bincount(slot[slot >= 0] // plan.routing.placement.slots_per_rank, minlength=R)
        tl, _, _ = simulate_plan(cfg, s, plan, keep=True)
        kind = np.array(tl.kind)
        gemm = np.bincount(tl.rank[kind == "gemm"], weights=(tl.end - tl.start)[kind == "gemm"], minlength=R)
        out[s.name] = dict(busiest_gpu_rows_over_mean=float(rows.max() / rows.mean()),
                           busiest_gpu_gemm_ms=float(gemm.max() * 1e3),
                           dispatch_end_ms=float(tl.end[kind == "dispatch"].max() * 1e3), latency_ms=tl.latency * 1e3)
    return dict(point=list(point), systems=out)


def fastest_of(r: dict) -> str:
    """The row's fastest baseline (rows written before ``fastest_baseline`` existed: of sglang / vllm)."""
    return r.get("fastest_baseline") or min(("sglang-deepep", "vllm-eplb"), key=lambda b: r["systems"][b]["median_ms"])


def speedup_vs_fastest(r: dict) -> float:
    return r["systems"][fastest_of(r)]["median_ms"] / r["systems"]["zepp-deepep"]["median_ms"]


def note(r: dict) -> str:
    """Why Zepp does not beat the row's fastest baseline, read off the row's own figures."""
    s, z = r["systems"][fastest_of(r)], r["systems"]["zepp-deepep"]
    if speedup_vs_fastest(r) >= 1.0:
        return ""
    gap = z["median_ms"] - s["median_ms"]
    parts = []
    if r["nodes"] == 1:
        parts.append("one NVLink domain: no NIC bytes to save")
    if z["planning_ms"] >= 0.3 * gap:
        parts.append(f"Zepp's planner {z['planning_ms'] * 1e3:.0f} us (gap {gap * 1e3:.0f} us)")
    if z["floor_ms"] > 1.02 * s["floor_ms"]:
        parts.append(f"Zepp's plan has the higher floor ({z['floor_ms']:.3f} vs {s['floor_ms']:.3f} ms)")
    if z["variant"] == "zepp-deepep-ll":
        parts.append("low-latency kernels send every entry on its own: Zepp's merge and NIC split do not apply")
    return "; ".join(parts) or "see the JSON row"


def table_lines(rows: list[dict], lp: bool) -> list[str]:
    """The results table, a row per configuration (``lp``: with the ``sglang-lp`` columns)."""
    head = ["cluster", "nodes", "model", "tokens/GPU", "traces", "sglang-deepep ms", "vllm-eplb ms",
            *(["sglang-lp ms"] if lp else []), "zepp-deepep ms (variant)", "vs sglang", "vs vllm",
            *(["vs sglang-lp"] if lp else []), "fastest baseline", "vs fastest", "zepp's planner ms",
            "floor ms sglang / vllm / zepp", "CPU s", "note"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        s, v, z = (r["systems"][k] for k in ("sglang-deepep", "vllm-eplb", "zepp-deepep"))
        mode = s["variant"].rsplit("-", 1)[-1]
        lines.append("| " + " | ".join([
            r["cluster"], f"{r['nodes']}x{r['gpus_per_node']}", r["model"], str(r["tokens_per_gpu"]), r["traces"],
            f"{s['median_ms']:.3f} ({mode})", f"{v['median_ms']:.3f}",
            *([f"{r['systems']['sglang-lp']['median_ms']:.3f}"] if lp else []),
            f"{z['median_ms']:.3f} ({z['variant'].removeprefix('zepp-deepep-')})",
            f"{r['speedup_vs_sglang']:.2f}x", f"{r['speedup_vs_vllm']:.2f}x",
            *([f"{r['speedup_vs_lp']:.2f}x"] if lp else []), fastest_of(r), f"{speedup_vs_fastest(r):.2f}x",
            f"{z['planning_ms']:.3f}", f"{s['floor_ms']:.3f} / {v['floor_ms']:.3f} / {z['floor_ms']:.3f}",
            f"{r['cpu_s']:.1f}", note(r)]) + " |")
    return lines


def summary_lines(rows: list[dict], lp: bool) -> list[str]:
    """The summary bullets: geomean speedups per regime, why Zepp loses where it does, CPU seconds."""
    summary = []
    for reg in ("decode", "prefill"):
        sel = [r for r in rows if r["regime"] == reg]
        if sel:
            g = lambda f: float(np.exp(np.mean([np.log(f(r)) for r in sel])))  # noqa: E731
            summary.append(f"- {reg}: geomean speedup of Zepp's best over the fastest baseline of each row "
                           f"{g(speedup_vs_fastest):.2f}x, over sglang-deepep {g(lambda r: r['speedup_vs_sglang']):.2f}x, "
                           f"over vllm-eplb {g(lambda r: r['speedup_vs_vllm']):.2f}x"
                           + (f", over sglang-lp {g(lambda r: r['speedup_vs_lp']):.2f}x" if lp else "")
                           + f" ({len(sel)} configurations, {sum(speedup_vs_fastest(r) < 1 for r in sel)} where Zepp "
                           f"loses to the fastest baseline)")
    lose = [r for r in rows if speedup_vs_fastest(r) < 1]
    planner = [r for r in lose if r["systems"]["zepp-deepep"]["planning_ms"]
               >= r["systems"]["zepp-deepep"]["median_ms"] - r["systems"][fastest_of(r)]["median_ms"]]
    if lose:
        summary.append(f"- where Zepp loses to the fastest baseline ({len(lose)} rows): in {len(planner)} its planner's "
                       f"simulated time alone exceeds the gap; {sum(r['nodes'] == 1 for r in lose)} are one "
                       f"NVLink domain")
    cpu = [r["cpu_s"] for r in rows]
    summary.append(f"- CPU seconds per configuration (this machine, the process's own CPU time): largest "
                   f"{max(cpu):.1f} s ({sum(c > 60 for c in cpu)} over 60 s), median {float(np.median(cpu)):.1f} s")
    return summary


def write(rows: list[dict], meta: dict, out: Path, figure: bool = True) -> None:
    """The results' JSON and table, and (``figure``) their bar chart."""
    out.mkdir(parents=True, exist_ok=True)
    payload = dict(meta, rows=rows)
    (out / "bench_today.json").write_text(json.dumps(payload, indent=1))
    lp = "sglang-lp" in BASELINES and all("sglang-lp" in r["systems"] for r in rows)
    lines, summary = table_lines(rows, lp), summary_lines(rows, lp)
    text = ["# Today's clusters: Zepp on DeepEP's kernels vs SGLang + DeepEP + EPLB and vLLM + EPLB", "",
            "Simulated MoE layer latency (ms, median of the timed batches), `benchmarks/simulated/bench_today.py`. "
            "Network: DeepEP's published figures (`zepp.sim.mechanics.DEEPEP_NET`, PAPER.md section 5), not fitted. "
            "The baselines (" + ", ".join(BASELINES) + ") run the DeepEP mode the batch size picks (ll: low-latency, "
            "normal); 'fastest baseline' names the fastest of them on the row and 'vs fastest' is Zepp against it; "
            "Zepp's best of " + ", ".join(dict.fromkeys(DECODE_ZEPP)) + " (decode) and "
            + ", ".join(PREFILL_ZEPP) + " (prefill). Floors: each system's own physical lower bound; "
            "the configuration's floor is the smallest. Zepp's planner: "
            + (f"the torch planner's CUDA-graph times measured on a GPU ({meta['planner_times']}), not the op-mix "
               "model" if meta.get("planner_times") else "the op-mix model (`zepp.sim.planning_cost`)") + ".",
            "", *summary, "",
            *lines, "", *diagnosis_lines(meta.get("diagnosis", [])), *caveat_lines(),
            "Not run:", *[f"- {x}" for x in NOT_RUN],
            *[f"- {c} {n}x{g}, {m}, {t} tokens per GPU: in the grid, not finished in this run (see the JSON's "
              "'missing')" for c, n, g, m, t in meta.get("missing", [])], "",
            *([meta["state"], ""] if meta.get("state") else []),
            f"CPU: {meta['cpu_s']:.0f} s in all ({meta['grid']} configurations; "
            f"{meta.get('startup_cpu_s', 0.0):.1f} s of imports before the first), wall {meta.get('wall_s', 0.0):.0f} s, "
            f"load average at the end {meta.get('loadavg', '-')}, seed {meta['seed']}."]
    (out / "bench_today.md").write_text("\n".join(text) + "\n")
    if figure:
        plot(rows, out / "bench_today.png")


def caveat_lines() -> list[str]:
    """``CAVEATS`` while DeepEP's normal kernels are simulated without their chunks (``Mechanics.chunked``)."""
    from zepp.sim.mechanics import mechanics

    if getattr(mechanics("deepep-normal"), "chunked", False):
        return []
    return ["Caveats:", *[f"- {x}" for x in CAVEATS], ""]


def diagnosis_lines(diag: list[dict]) -> list[str]:
    out = []
    for d in diag:
        c, n, gpn, m, t = d["point"]
        out.append(f"Why the systems differ ({c} {n}x{gpn}, {m}, {t} tokens per GPU, first batch): "
                   + "; ".join(f"{k}: busiest GPU {v['busiest_gpu_rows_over_mean']:.2f}x the mean rows, "
                               f"{v['busiest_gpu_gemm_ms']:.2f} ms of GEMM, dispatch ends at {v['dispatch_end_ms']:.2f} ms, "
                               f"layer {v['latency_ms']:.2f} ms" for k, v in d["systems"].items()) + ".")
        out.append("")
    return out


def join_runs(runs: list[dict]) -> tuple[list[dict], dict]:
    """Rows and meta of several ``--only`` runs as one run: rows in ``GRID`` order (each point once),
    CPU seconds summed, wall seconds of the longest (they ran side by side), every load average."""
    by_point = {tuple(r[k] for k in ("cluster", "nodes", "gpus_per_node", "model", "tokens_per_gpu")): r
                for run in runs for r in run["rows"]}
    rows = [by_point[g[:5]] for g in GRID if g[:5] in by_point]
    meta = {k: v for k, v in runs[-1].items() if k != "rows"}
    meta.update(grid=len(rows), cpu_s=sum(r["cpu_s"] for r in rows), wall_s=max(m.get("wall_s", 0.0) for m in runs),
                startup_cpu_s=max(m.get("startup_cpu_s", 0.0) for m in runs), processes=len(runs),
                loadavg=" / ".join(m.get("loadavg", "-") for m in runs))
    return rows, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_traces_option(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--only", default=None, help="comma list of grid indices (timing)")
    ap.add_argument("--from-json", default=None, help="rewrite the .md and .png from a results JSON (no simulation)")
    ap.add_argument("--diagnose-only", action="store_true", help="add the DIAGNOSE figures to --from-json's file")
    ap.add_argument("--planner-times", metavar="FILE", help="charge Zepp's planner a plan_speed_torch.py --device "
                    "cuda run's CUDA-graph part times (its JSON), not the op-mix model")
    ap.add_argument("--join", nargs="+", default=None,
                    help="join the JSONs of --only runs (run side by side) into one, rows in GRID order, and write it")
    args = ap.parse_args()
    traces = find_traces(args.traces, required=False)
    traces = traces and str(traces)
    if args.join:
        rows, meta = join_runs([json.loads(Path(f).read_text()) for f in args.join])
        meta["diagnosis"] = [diagnose(p, traces, args.seed) for p in DIAGNOSE]
        write(rows, meta, Path(args.out))
        return
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        rows = data.pop("rows")
        if args.diagnose_only:
            data["diagnosis"] = [diagnose(p, traces, args.seed) for p in DIAGNOSE]
            Path(args.from_json).write_text(json.dumps(dict(data, rows=rows), indent=1))
        write(rows, data, Path(args.out))
        return
    grid = [GRID[int(i)] for i in args.only.split(",")] if args.only else list(GRID)
    for c, n, gpn, m, _ in grid:
        network_of(c)
        if model_preset(m).num_experts % (n * gpn):
            raise SystemExit(f"grid point {c} {n}x{gpn} {m}: experts do not divide")
    try:  # a bad file is one line before any work
        records = [read_device_run(args.planner_times)] if args.planner_times else None
    except ZeppInputError as e:
        ap.exit(2, f"bench_today: error: --planner-times: {e}\n")
    import torch  # noqa: F401  (EPLB's placement imports it: a one-off cost, kept out of the first row)

    with charged_records(records):
        run_grid(args, grid, traces)


def run_grid(args, grid, traces) -> None:
    """Simulate ``grid``'s configurations one by one, writing the table after each."""
    startup = time.process_time()
    rows = []
    t0 = time.process_time()
    w0 = time.perf_counter()
    out = Path(args.out)
    for i, p in enumerate(grid):
        r = run_config(p, traces, args.seed)
        rows.append(r)
        print(f"[{i + 1}/{len(grid)}] {p}: sglang {r['systems']['sglang-deepep']['median_ms']:.3f} ms, zepp "
              f"{r['systems']['zepp-deepep']['median_ms']:.3f} ms ({r['systems']['zepp-deepep']['variant']}) "
              f"{r['speedup_vs_sglang']:.2f}x, fastest baseline {r['fastest_baseline']} "
              f"{r['speedup_vs_fastest']:.2f}x, {r['cpu_s']:.1f} s CPU", flush=True)
        meta = dict(grid=len(rows), seed=args.seed, traces=traces and os.path.basename(traces.rstrip("/")),
                    cpu_s=time.process_time() - t0, startup_cpu_s=startup, wall_s=time.perf_counter() - w0,
                    loadavg=" ".join(f"{x:.1f}" for x in os.getloadavg()), baselines=list(BASELINES),
                    not_run=list(NOT_RUN),
                    network="DeepEP published (zepp.sim.calibrate.PUBLISHED)", decode_zepp=list(DECODE_ZEPP),
                    prefill_zepp=list(PREFILL_ZEPP), planner_times=args.planner_times)
        write(rows, meta, out, figure=i == len(grid) - 1)  # the table after every row, the chart once
    if not args.only:
        meta["diagnosis"] = [diagnose(p, traces, args.seed) for p in DIAGNOSE]
        write(rows, meta, out)


if __name__ == "__main__":
    main()
