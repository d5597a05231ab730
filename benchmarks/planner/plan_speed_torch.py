"""Planning speed of the torch planner on the CPU against the numpy planner, as ratios from one run.

Per configuration (nodes x 4 GPUs, K2 and Qwen3-235B, MB per GPU), one batch sampled from the
recorded traces (``--traces``, found by ``benchmarks/paths.py``; the built-in synthetic traces
when absent) is planned with Zepp's pipeline (placement ``zepp``, routing ``zepp``, dispatch
``zepp``, combine ``reduce``) by both planners, ``--repeats`` times, interleaved (numpy then
torch, then torch then numpy, ...), one thread each. Reported: median routing and flows times of
each planner and the ratio torch / numpy (above 1: torch slower). Every configuration also
checks that both planners' ``slot`` and hop tables are equal (the benchmark fails otherwise).
The torch planner runs in its default mode on the CPU (``sync=True``: early exits and exact-size
tables); ``--capture-safe`` adds the ``sync=False`` mode (no host read; the mode a CUDA graph
captures) for the smaller configurations.

    nice python benchmarks/planner/plan_speed_torch.py [--traces ../shared/traces] [--repeats 3]
        [--nodes 4,8,16,32] [--budgets 1,4,16,64] [--models k2,qwen] [--out benchmarks/results/plan_speed_torch]

Writes ``<out>.json`` and ``<out>.md``.

On a GPU (``--device cuda``; not run yet: no GPU was lent when this was written) it times, per
configuration (default: the issue's K2, 16 nodes x 4 GPUs, 16 MB), the device planner eagerly
(``sync=True``), eagerly without host reads (``sync=False, sweeps=1``) and as a CUDA-graph replay
of the same (captured once for the batch shape), checks the replayed plan against the numpy
planner, and writes ``<out>_cuda.{json,md}``; with ``--data`` it adds the figures to the data
file's ``device_records``:

    python benchmarks/planner/plan_speed_torch.py --device cuda --nodes 16 --budgets 16 --models k2 \
        --data src/zepp/data/planner_torch_times.json
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, ROOT, add_traces_option, find_traces  # noqa: E402
from zepp.planner.flows import build_flows  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.planner.placement import make_placement  # noqa: E402
from zepp.planner.routing import route  # noqa: E402
from zepp.planner.torch import build_flows as t_build_flows  # noqa: E402
from zepp.planner.torch import device_placement  # noqa: E402
from zepp.planner.torch import route as t_route  # noqa: E402
from zepp.traces import load_model_traces, node_demand, sample_batches  # noqa: E402

COLS = ("stage", "src", "dst", "owner", "token", "msg", "entry")
OTHER_PAIRS = (("a2av", "a2av"), ("relay", "dedup"), ("zepp", "reduce-direct"))
GPUS_PER_NODE = 4


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _numpy_plan(batch, placement, relaxation, row_bytes):
    """Routing, then the flows the planner decides (``FlowPlan.volumes``); the hop tables an
    executor runs are built outside the timing (for the equality check)."""
    t0 = time.perf_counter()
    r = route("zepp", batch, placement, relaxation)
    t1 = time.perf_counter()
    p = build_flows(r, "zepp", row_bytes, "reduce")
    p.volumes
    t2 = time.perf_counter()
    return (t1 - t0, t2 - t1), p


def _torch_plan(ids, placement, relaxation, row_bytes, sync):
    t0 = time.perf_counter()
    r = t_route("zepp", ids, placement, relaxation, sync=sync)
    t1 = time.perf_counter()
    p = t_build_flows(r, "zepp", row_bytes, "reduce", sync=sync)
    p.volumes.dispatch.rows.sum().item()  # the volumes are complete (no-op on the CPU; a sync on a device)
    t2 = time.perf_counter()
    return (t1 - t0, t2 - t1), p


def _same(numpy_plan, torch_plan) -> bool:
    tp = torch_plan.to_numpy()
    if not np.array_equal(tp.routing.slot, numpy_plan.routing.slot):
        return False
    return all(np.array_equal(getattr(getattr(tp, ph), c), getattr(getattr(numpy_plan, ph), c))
               for ph in ("dispatch", "combine") for c in COLS)


def _write_data(path: str, info: dict) -> None:
    """The data file of measured torch planning times (schema in its ``about``)."""
    record = dict(
        device="cpu", device_name=info["machine"], platform=info["platform"], threads=1, cuda_graph=False,
        mode="sync=True (host reads allowed, early exits, exact-size tables)", torch=info["torch"],
        measured_at=info["measured_at"], where="the project's shared 2-core development VM (loaded by other work)",
        load_average_end=info["load_average_end"], statistic=f"median of {info['repeats']} interleaved runs",
        traces=info["traces"], written_by="benchmarks/planner/plan_speed_torch.py --data",
        rows=[dict(model=r["model"], nodes=r["nodes"], gpus_per_node=GPUS_PER_NODE, budget_mb=r["mb"],
                   entries=r["entries"], relaxation=r["relaxation"],
                   parts_ms={"route:zepp": round(r["torch_route_ms"], 3),
                             "flows:zepp/reduce": round(r["torch_flows_ms"], 3),
                             **{k: round(v, 3) for k, v in r["torch_other_flows_ms"].items()}},
                   numpy_ms={"route:zepp": round(r["numpy_route_ms"], 3),
                             "flows:zepp/reduce": round(r["numpy_flows_ms"], 3)})
              for r in info["rows"]])
    data = dict(
        about=("Measured planning times of the torch planner (zepp.planner.torch), per part with the part "
               "names of zepp/data/planner_cost.json ('route:zepp', 'flows:<dispatch>/<combine>'), "
               "milliseconds per batch for the whole cluster's plan (every rank computes the same plan). One"
               " record per device and mode; 'cuda_graph' says whether the times are CUDA-graph replays. A "
               "device (GPU) record here replaces the op-mix conversion of zepp.sim.planning_cost for the "
               "same parts in every simulation; this file holds none on purpose (zepp.sim.planner_times says"
               " why): the H200 run is benchmarks/results/plan_speed_torch_h200_cuda.json, charged on "
               "request. CPU records are not device figures."),
        records=[record],
        device_records=[],
    )
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_traces_option(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nodes", default=None, help="nodes of 4 GPUs (default 4,8,16,32; on a device 16)")
    parser.add_argument("--budgets", default=None, help="MB per GPU (default 1,4,16,64; on a device 16)")
    parser.add_argument("--models", default=None, help="k2, qwen (default k2,qwen; on a device k2)")
    parser.add_argument("--capture-safe", action="store_true",
                        help="also time sync=False (no host reads) on configurations up to 1M entries")
    parser.add_argument("--out", default=str(RESULTS / "plan_speed_torch"))
    parser.add_argument("--data", default=None,
                        help="also write the measured torch planning times as a data file "
                             "(src/zepp/data/planner_torch_times.json)")
    parser.add_argument("--device", default="cpu", help="cpu (numpy vs torch-CPU) or cuda (device planning times)")
    parser.add_argument("--profile", action="store_true",
                        help="on a device: also profile each part's capture-safe call once (kernels launched, "
                             "device time, the costliest operations)")
    args = parser.parse_args()
    args.traces = find_traces(args.traces, required=False)
    if args.device != "cpu":
        return device_main(args)
    args.nodes, args.budgets, args.models = args.nodes or "4,8,16,32", args.budgets or "1,4,16,64", args.models or "k2,qwen"
    torch.set_num_threads(1)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    source = {}
    for model in args.models.split(","):
        spec = model_preset(model)
        if args.traces:
            pool, evaluation = load_model_traces(args.traces, model)
            source[model] = f"recorded: {os.path.relpath(args.traces, ROOT)}"
        else:
            from zepp.traces.synthetic import synthetic_traces

            pool, evaluation = synthetic_traces(model, seed=0)
            source[model] = "built-in synthetic traces (zepp.traces.synthetic)"
        for nodes in _ints(args.nodes):
            ranks = nodes * GPUS_PER_NODE
            placement = make_placement("zepp", node_demand(pool, nodes, GPUS_PER_NODE), spec.num_experts, ranks,
                                       GPUS_PER_NODE)
            t0 = time.perf_counter()
            device_placement(placement, "cpu")
            prep = time.perf_counter() - t0
            relaxation = 0.5 if nodes >= 16 else 0.25
            for mb in _ints(args.budgets):
                tokens = spec.tokens_for_budget(mb)
                batch = sample_batches(evaluation, ranks, tokens, 1, seed=nodes * 1000 + mb)[0]
                ids = torch.as_tensor(batch)
                modes = [("numpy", None), ("torch", True)]
                if args.capture_safe and batch.size <= 1 << 20:
                    modes.append(("torch-capture-safe", False))
                times = {m: [] for m, _ in modes}
                same = True
                for rep in range(args.repeats):
                    order = modes if rep % 2 == 0 else modes[::-1]
                    plans = {}
                    for m, sync in order:
                        if m == "numpy":
                            t, plans[m] = _numpy_plan(batch, placement, relaxation, spec.row_bytes)
                        else:
                            t, plans[m] = _torch_plan(ids, placement, relaxation, spec.row_bytes, sync)
                        times[m].append(t)
                    if rep == 0:
                        same = all(_same(plans["numpy"], plans[m]) for m, _ in modes if m != "numpy")
                        routing_t = plans["torch"].routing
                    del plans
                # The other transport pairs of the planning-cost model, torch only (for the data file).
                other = {}
                for pair in OTHER_PAIRS:
                    ts = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        p = t_build_flows(routing_t, pair[0], spec.row_bytes, pair[1])
                        p.volumes.dispatch.rows.sum().item()
                        ts.append(time.perf_counter() - t0)
                    other[f"flows:{pair[0]}/{pair[1]}"] = statistics.median(ts) * 1e3
                del routing_t
                med = {m: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
                       for m, ts in times.items()}
                row = dict(model=model, nodes=nodes, ranks=ranks, mb=mb, tokens_per_gpu=tokens, entries=int(batch.size),
                           relaxation=relaxation, equal=same, placement_tables_ms=prep * 1e3,
                           numpy_route_ms=med["numpy"][0] * 1e3, numpy_flows_ms=med["numpy"][1] * 1e3,
                           torch_route_ms=med["torch"][0] * 1e3, torch_flows_ms=med["torch"][1] * 1e3)
                row["torch_other_flows_ms"] = other
                row["numpy_ms"] = row["numpy_route_ms"] + row["numpy_flows_ms"]
                row["torch_ms"] = row["torch_route_ms"] + row["torch_flows_ms"]
                row["ratio"] = row["torch_ms"] / row["numpy_ms"]
                if "torch-capture-safe" in med:
                    row["capture_safe_ms"] = sum(med["torch-capture-safe"]) * 1e3
                    row["capture_safe_ratio"] = row["capture_safe_ms"] / row["numpy_ms"]
                rows.append(row)
                print(f"{model:5s} {nodes:3d}x{GPUS_PER_NODE} {mb:3d} MB {batch.size:>9,} entries  numpy "
                      f"{row['numpy_ms']:8.1f} ms  torch {row['torch_ms']:8.1f} ms  ratio {row['ratio']:.2f}"
                      + (f"  capture-safe {row['capture_safe_ratio']:.2f}" if "capture_safe_ratio" in row else "")
                      + ("" if same else "  NOT EQUAL"), flush=True)
    ratios = [r["ratio"] for r in rows]
    info = dict(
        what="Zepp planning (routing zepp + flows zepp/reduce), numpy planner vs torch planner on the CPU",
        measured_at=started.isoformat(timespec="seconds"), machine=platform.processor() or platform.machine(),
        platform=platform.platform(), cpus=os.cpu_count(), threads=1, torch=torch.__version__,
        numpy=np.__version__, repeats=args.repeats, load_average_end=os.getloadavg(), traces=source,
        geomean_ratio=float(np.exp(np.mean(np.log(ratios)))) if ratios else None, rows=rows)
    Path(args.out + ".json").write_text(json.dumps(info, indent=1))
    lines = [
        "# Planning speed: torch planner on the CPU vs the numpy planner",
        "",
        f"Measured {info['measured_at']} on {info['cpus']} CPUs ({info['platform']}), one thread, torch "
        f"{info['torch']}, numpy {info['numpy']}; load average at the end "
        f"{info['load_average_end'][0]:.1f} (the machine is shared). Zepp's pipeline (placement, routing "
        "`zepp`, dispatch `zepp`, combine `reduce`), one batch per row, median of "
        f"{args.repeats} interleaved runs. Traces: " + "; ".join(f"{m}: {s}" for m, s in source.items()) + ".",
        "Every row's torch plan was checked equal to the numpy plan (slot and every hop column).",
        "",
        "| model | nodes | MB/GPU | entries | numpy route ms | numpy flows ms | torch route ms | torch flows ms | "
        "torch / numpy |" + (" capture-safe / numpy |" if args.capture_safe else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if args.capture_safe else ""),
    ]
    for r in rows:
        cs = ""
        if args.capture_safe:
            cs = f" {r['capture_safe_ratio']:.2f} |" if "capture_safe_ratio" in r else " - |"
        lines.append(f"| {r['model']} | {r['nodes']}x{GPUS_PER_NODE} | {r['mb']} | {r['entries']:,} | "
                     f"{r['numpy_route_ms']:.1f} | {r['numpy_flows_ms']:.1f} | {r['torch_route_ms']:.1f} | "
                     f"{r['torch_flows_ms']:.1f} | {r['ratio']:.2f} |" + cs + ("" if r["equal"] else " NOT EQUAL"))
    if ratios:
        lines += ["", f"Geometric mean of torch / numpy: {info['geomean_ratio']:.2f}."]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.data:
        _write_data(args.data, info)
    if not all(r["equal"] for r in rows):
        raise SystemExit("torch and numpy plans differ")


def cuda_ms(fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` between CUDA events."""
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def captured(fn):
    """``(graph, output)`` of ``fn`` captured in a CUDA graph (after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _graph_parts(ids, placement, relaxation, row_bytes, repeats) -> dict:
    """Graph-replay milliseconds per part, named as in ``zepp/data/planner_cost.json``: the routing
    (``sweeps=1``) in one graph, the flows of each transport pair in one graph each (fed by the
    captured routing's output)."""
    g_route, routing = captured(lambda: t_route("zepp", ids, placement, relaxation, sweeps=1))
    parts = {"route:zepp": cuda_ms(g_route.replay, repeats)}
    for d, c in (("zepp", "reduce"),) + OTHER_PAIRS:  # the plan's volumes, and the hop tables an executor runs
        g, _ = captured(lambda: t_build_flows(routing, d, row_bytes, c).volumes)
        parts[f"flows:{d}/{c}"] = cuda_ms(g.replay, repeats)
        g, _ = captured(lambda: t_build_flows(routing, d, row_bytes, c).hop_tables)
        parts[f"hops:{d}/{c}"] = cuda_ms(g.replay, repeats)
    return parts


def _profile_parts(ids, placement, relaxation, row_bytes, top: int = 8) -> dict:
    """Per part (routing ``zepp``; volumes and hop tables of ``zepp/reduce``), one profiled
    capture-safe call after a warm-up: the kernels it launches, their summed device time, and
    the ``top`` operations by self device time (name, calls, ms)."""
    from torch.profiler import ProfilerActivity, profile

    routing = t_route("zepp", ids, placement, relaxation, sync=False, sweeps=1)
    calls = {"route:zepp": lambda: t_route("zepp", ids, placement, relaxation, sync=False, sweeps=1),
             "flows:zepp/reduce": lambda: t_build_flows(routing, "zepp", row_bytes, "reduce", sync=False).volumes,
             "hops:zepp/reduce": lambda: t_build_flows(routing, "zepp", row_bytes, "reduce", sync=False).hop_tables}
    out = {}
    for part, fn in calls.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
        device_us = sum(getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0) for e in kernels)

        def self_us(e):
            return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)

        ops = sorted((e for e in prof.key_averages() if self_us(e) > 0), key=self_us, reverse=True)[:top]
        out[part] = dict(kernels=len(kernels), kernel_ms=device_us / 1e3,
                         top=[(e.key[:60], int(e.count), round(self_us(e) / 1e3, 3)) for e in ops])
    return out


def device_main(args) -> None:
    """Device planning times (see the module docstring): eager, capture-safe eager, CUDA graph."""
    from zepp.planner import Stages, plan_batch

    dev = torch.device(args.device)
    started = datetime.datetime.now(datetime.timezone.utc)
    nodes_list = _ints(args.nodes or "16")
    budgets = _ints(args.budgets or "16")
    models = (args.models or "k2").split(",")
    repeats = max(args.repeats, 10)
    rows = []
    for model in models:
        spec = model_preset(model)
        if args.traces:
            pool, evaluation = load_model_traces(args.traces, model)
        else:
            from zepp.traces.synthetic import synthetic_traces

            pool, evaluation = synthetic_traces(model, seed=0)
        for nodes in nodes_list:
            ranks = nodes * GPUS_PER_NODE
            placement = make_placement("zepp", node_demand(pool, nodes, GPUS_PER_NODE), spec.num_experts, ranks,
                                       GPUS_PER_NODE)
            device_placement(placement, dev)
            relaxation = 0.5 if nodes >= 16 else 0.25
            for mb in budgets:
                tokens = spec.tokens_for_budget(mb)
                batch = sample_batches(evaluation, ranks, tokens, 1, seed=nodes * 1000 + mb)[0]
                _, ref = _numpy_plan(batch, placement, relaxation, spec.row_bytes)
                ids = torch.as_tensor(batch, device=dev)
                row = dict(model=model, nodes=nodes, mb=mb, entries=int(batch.size), device=torch.cuda.get_device_name(dev))

                def eager(sync, sweeps=None):  # routing, volumes and the hop tables
                    p = plan_batch(ids, placement, Stages("zepp", "zepp", "reduce"), spec.row_bytes, relaxation,
                                   sync=sync, sweeps=sweeps)
                    p.volumes, p.hop_tables
                    return p

                try:
                    for label, fn in (("eager_ms", lambda: eager(True)), ("capture_safe_ms", lambda: eager(False, 1))):
                        fn()
                        row[label] = cuda_ms(fn, repeats)
                    row["eager_equal"] = _same(ref, eager(True))
                except Exception as e:  # record why, go on with the next configuration
                    row["eager_error"] = f"{type(e).__name__}: {e}"[:400]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                try:
                    graph, out = captured(lambda: eager(None, 1))  # inside capture the default is sync=False
                    graph.replay()
                    torch.cuda.synchronize()
                    row["graph_ms"] = cuda_ms(graph.replay, repeats)
                    row["graph_unplaced"] = int(out.routing.unplaced)
                    row["graph_equal"] = row["graph_unplaced"] == 0 and _same(ref, out)
                    row["parts_ms"] = _graph_parts(ids, placement, relaxation, spec.row_bytes, repeats)
                except Exception as e:  # record why capture failed, keep the eager figures
                    row["graph_error"] = f"{type(e).__name__}: {e}"[:400]
                if args.profile:
                    try:
                        row["profile"] = _profile_parts(ids, placement, relaxation, spec.row_bytes)
                    except Exception as e:  # the profiler's own failure: keep the timings
                        row["profile_error"] = f"{type(e).__name__}: {e}"[:400]
                rows.append(row)
                print(json.dumps(row), flush=True)
    props = torch.cuda.get_device_properties(dev)
    clock, bus = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    info = dict(what="device planning times of zepp.planner.torch (routing zepp + flows zepp/reduce)",
                measured_at=started.isoformat(timespec="seconds"), torch=torch.__version__, rows=rows,
                hbm_bw=2 * clock * 1e3 * bus / 8 if clock and bus else None,
                note="eager: sync=True; capture_safe: sync=False, sweeps=1; graph: CUDA-graph replay of capture_safe")
    Path(args.out + "_cuda.json").write_text(json.dumps(info, indent=1))
    lines = device_report(info)
    Path(args.out + "_cuda.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.data:
        from zepp.sim.planner_times import record_from_device_run

        data = json.loads(Path(args.data).read_text())
        data["device_records"].append(record_from_device_run(info))
        Path(args.data).write_text(json.dumps(data, indent=1) + "\n")


def device_report(info: dict) -> list[str]:
    """The markdown lines of a ``--device`` run: per configuration the eager, capture-safe and
    graph-replay times, the graph time of each part, and beside them what the simulator's op-mix
    model (``zepp.sim.planning_cost``: counted rounds times the H200 op mix) charges for the same
    parts at the same entry count."""
    from zepp.sim.planning_cost import cost_data, gpu_opmix_seconds

    d = cost_data()
    bw = float(d["gpu_opmix_source"]["hbm_bw"])
    lines = ["# Device planning times (zepp.planner.torch)", "",
             f"Measured {info['measured_at']}, torch {info['torch']}; medians of CUDA-event timings. "
             "`eager`: `plan_batch(sync=True)` (host reads allowed); `capture-safe`: `sync=False, sweeps=1` run eagerly; "
             "`graph`: a CUDA-graph replay of the capture-safe call. Each covers Zepp's routing, the volumes and the "
             "hop tables of dispatch `zepp` / combine `reduce`. Parts (graph replays): `route` = routing `zepp`, "
             "`flows` = the volumes, `hops` = the per-row hop tables. `op-mix model`: what the simulator charges "
             "for route + flows at the same entry count when no device record exists (counted rounds x the H200 "
             "op mix of `zepp/data/planner_cost.json`). Every plan was checked equal to the numpy planner's.", "",
             "| device | model | nodes | MB | entries | eager ms | capture-safe ms | graph ms | route | flows | hops "
             "| op-mix model route + flows | equal (eager / graph) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in info["rows"]:
        head = f"| {r['device']} | {r['model']} | {r['nodes']}x{GPUS_PER_NODE} | {r['mb']} | {r['entries']:,} | "
        if "eager_error" in r:
            lines.append(head + f"failed: {r['eager_error'][:80]} | - | - | - | - | - | - | - |")
            continue
        g = f"{r['graph_ms']:.2f}" if "graph_ms" in r else "failed: " + r.get("graph_error", "")[:60]
        parts = r.get("parts_ms", {})
        cells = " | ".join(f"{parts[k]:.2f}" if k in parts else "-"
                           for k in ("route:zepp", "flows:zepp/reduce", "hops:zepp/reduce"))
        model = sum(d["rounds"][k] for k in ("route:zepp", "flows:zepp/reduce")) * gpu_opmix_seconds(r["entries"], bw)
        lines.append(head + f"{r['eager_ms']:.2f} | {r['capture_safe_ms']:.2f} | {g} | {cells} | {model * 1e3:.2f} | "
                     f"{r['eager_equal']} / {r.get('graph_equal', '-')} |")
    profiled = [r for r in info["rows"] if "profile" in r]
    if profiled:
        lines += ["", "## Where the device time goes (one profiled capture-safe call per part, eager)", "",
                  "| nodes | MB | entries | part | kernels | kernel ms | costliest operations (calls, self ms) |",
                  "|---|---|---|---|---|---|---|"]
        for r in profiled:
            for part, pr in r["profile"].items():
                top = "; ".join(f"{n} ({c}, {ms:.2f})" for n, c, ms in pr["top"][:5])
                lines.append(f"| {r['nodes']}x{GPUS_PER_NODE} | {r['mb']} | {r['entries']:,} | {part} | {pr['kernels']} | "
                             f"{pr['kernel_ms']:.2f} | {top} |")
    return lines


if __name__ == "__main__":
    main()
