"""The torch planner on a GPU: the device half of ``plan_speed_torch.py --device cuda``.

Per configuration (default: the issue's K2, 16 nodes x 4 GPUs, 16 MB; ``--nodes``, ``--budgets``,
``--models`` as on the CPU) it times Zepp's plan (routing ``zepp``, volumes and hop tables of
``zepp`` / ``reduce``) through ``plan_batch``: eagerly with host reads (``sync=True``), eagerly
without them (``sync=False, sweeps=1``) and as a CUDA-graph replay of the latter (captured once
for the batch shape), each checked against the numpy planner; then each part's graph time
(``route:zepp``, ``flows:<dispatch>/<combine>``, ``hops:...``: the names of
``zepp/data/planner_cost.json``) and, with ``--profile``, the kernels and costliest operations of
one call per part. A configuration that fails records why and the others still run. Writes
``<out>_cuda.{json,md}``; with ``--data`` it adds the run to that data file's ``device_records``
(where a device record replaces the simulator's op-mix model: see ``zepp.sim.planner_times``).

    python benchmarks/planner/plan_speed_torch.py --device cuda --nodes 4,8,16,32 --budgets 1,4,16,64 \
        --traces DIR --profile --out benchmarks/results/plan_speed_torch_h200
"""

from __future__ import annotations

import datetime
import json
import statistics
from pathlib import Path

import torch

from plan_speed_torch import GPUS_PER_NODE, OTHER_PAIRS, Config, _numpy_plan, _same, configurations
from zepp.planner import Stages, plan_batch
from zepp.planner.torch import build_flows as t_build_flows
from zepp.planner.torch import route as t_route


def _failure(e: Exception) -> str:
    """What a configuration's failure records: the exception's type and message, cut to 400 characters."""
    return f"{type(e).__name__}: {e}"[:400]


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


def _device_row(dev, cfg: Config, repeats: int, profile: bool) -> dict:
    """One configuration's times on ``dev`` (see the module docstring); a failure is recorded in
    the row (``eager_error``, ``graph_error``, ``profile_error``) instead of raised."""
    model, spec, nodes, mb, placement, relaxation, batch = (cfg.model, cfg.spec, cfg.nodes, cfg.mb, cfg.placement,
                                                            cfg.relaxation, cfg.batch)
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
        return dict(row, eager_error=_failure(e))
    try:
        graph, out = captured(lambda: eager(None, 1))  # inside capture the default is sync=False
        graph.replay()
        torch.cuda.synchronize()
        row["graph_ms"] = cuda_ms(graph.replay, repeats)
        row["graph_unplaced"] = int(out.routing.unplaced)
        row["graph_equal"] = row["graph_unplaced"] == 0 and _same(ref, out)
        row["parts_ms"] = _graph_parts(ids, placement, relaxation, spec.row_bytes, repeats)
    except Exception as e:  # record why capture failed, keep the eager figures
        row["graph_error"] = _failure(e)
    if profile:
        try:
            row["profile"] = _profile_parts(ids, placement, relaxation, spec.row_bytes)
        except Exception as e:  # the profiler's own failure: keep the timings
            row["profile_error"] = _failure(e)
    return row


def device_main(args) -> None:
    """Device planning times (see the module docstring): eager, capture-safe eager, CUDA graph."""
    dev = torch.device(args.device)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for cfg in configurations(args, dev, nodes="16", budgets="16", models="k2"):
        rows.append(_device_row(dev, cfg, max(args.repeats, 10), args.profile))
        print(json.dumps(rows[-1]), flush=True)
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
