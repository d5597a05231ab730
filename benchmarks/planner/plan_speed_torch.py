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

On a GPU (``--device cuda``) the device half, ``plan_speed_device.py``, times the device planner
(eager, capture-safe, CUDA-graph replay; its docstring says what and how):

    python benchmarks/planner/plan_speed_torch.py --device cuda --nodes 4,8,16,32 --budgets 1,4,16,64 --profile
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
from dataclasses import dataclass
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


@dataclass
class Config:
    """One configuration: ``batch [R, T, k]`` of ``model`` on ``nodes`` x ``GPUS_PER_NODE`` at ``mb``
    MB per GPU, Zepp's ``placement`` (its device tables built: ``prep_s`` seconds), the traces'
    ``source``."""

    model: str
    spec: object
    nodes: int
    mb: int
    placement: object
    relaxation: float
    batch: np.ndarray
    source: str
    prep_s: float


def configurations(args, device, nodes="4,8,16,32", budgets="1,4,16,64", models="k2,qwen"):
    """The ``Config`` of each model x nodes x budget of ``args`` (its ``nodes`` / ``budgets`` /
    ``models``, else the defaults given), the placement's tables on ``device`` once per cluster."""
    for model in (args.models or models).split(","):
        spec = model_preset(model)
        if args.traces:
            pool, evaluation = load_model_traces(args.traces, model)
            source = f"recorded: {os.path.relpath(args.traces, ROOT)}"
        else:
            from zepp.traces.synthetic import synthetic_traces

            pool, evaluation = synthetic_traces(model, seed=0)
            source = "built-in synthetic traces (zepp.traces.synthetic)"
        for nodes_ in _ints(args.nodes or nodes):
            ranks = nodes_ * GPUS_PER_NODE
            placement = make_placement("zepp", node_demand(pool, nodes_, GPUS_PER_NODE), spec.num_experts, ranks,
                                       GPUS_PER_NODE)
            t0 = time.perf_counter()
            device_placement(placement, device)
            prep = time.perf_counter() - t0
            for mb in _ints(args.budgets or budgets):
                batch = sample_batches(evaluation, ranks, spec.tokens_for_budget(mb), 1, seed=nodes_ * 1000 + mb)[0]
                yield Config(model, spec, nodes_, mb, placement, 0.5 if nodes_ >= 16 else 0.25, batch, source, prep)


def _timed_modes(cfg: Config, ids, modes, repeats: int):
    """``(times {mode: [(route s, flows s)]}, plans equal, the torch routing)``: ``repeats`` rounds
    of every mode, interleaved (numpy then torch, then the reverse, ...)."""
    times = {m: [] for m, _ in modes}
    same, routing_t = True, None
    for rep in range(repeats):
        plans = {}
        for m, sync in (modes if rep % 2 == 0 else modes[::-1]):
            if m == "numpy":
                t, plans[m] = _numpy_plan(cfg.batch, cfg.placement, cfg.relaxation, cfg.spec.row_bytes)
            else:
                t, plans[m] = _torch_plan(ids, cfg.placement, cfg.relaxation, cfg.spec.row_bytes, sync)
            times[m].append(t)
        if rep == 0:
            same = all(_same(plans["numpy"], plans[m]) for m, _ in modes if m != "numpy")
            routing_t = plans["torch"].routing
    return times, same, routing_t


def _other_flows_ms(routing_t, row_bytes: int, repeats: int) -> dict:
    """The other transport pairs of the planning-cost model, torch only (for the data file):
    median ms of each pair's volumes."""
    other = {}
    for pair in OTHER_PAIRS:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            p = t_build_flows(routing_t, pair[0], row_bytes, pair[1])
            p.volumes.dispatch.rows.sum().item()
            ts.append(time.perf_counter() - t0)
        other[f"flows:{pair[0]}/{pair[1]}"] = statistics.median(ts) * 1e3
    return other


def _cpu_row(cfg: Config, repeats: int, capture_safe: bool) -> dict:
    """One configuration's row: numpy and torch (and the capture-safe form) timed, plans compared."""
    batch = cfg.batch
    modes = [("numpy", None), ("torch", True)]
    if capture_safe and batch.size <= 1 << 20:
        modes.append(("torch-capture-safe", False))
    times, same, routing_t = _timed_modes(cfg, torch.as_tensor(batch), modes, repeats)
    other = _other_flows_ms(routing_t, cfg.spec.row_bytes, repeats)
    med = {m: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for m, ts in times.items()}
    ranks = cfg.nodes * GPUS_PER_NODE
    row = dict(model=cfg.model, nodes=cfg.nodes, ranks=ranks, mb=cfg.mb, tokens_per_gpu=cfg.spec.tokens_for_budget(cfg.mb),
               entries=int(batch.size), relaxation=cfg.relaxation, equal=same, placement_tables_ms=cfg.prep_s * 1e3,
               numpy_route_ms=med["numpy"][0] * 1e3, numpy_flows_ms=med["numpy"][1] * 1e3,
               torch_route_ms=med["torch"][0] * 1e3, torch_flows_ms=med["torch"][1] * 1e3)
    row["torch_other_flows_ms"] = other
    row["numpy_ms"] = row["numpy_route_ms"] + row["numpy_flows_ms"]
    row["torch_ms"] = row["torch_route_ms"] + row["torch_flows_ms"]
    row["ratio"] = row["torch_ms"] / row["numpy_ms"]
    if "torch-capture-safe" in med:
        row["capture_safe_ms"] = sum(med["torch-capture-safe"]) * 1e3
        row["capture_safe_ratio"] = row["capture_safe_ms"] / row["numpy_ms"]
    return row


def _cpu_report(info: dict, capture_safe: bool) -> list[str]:
    """The markdown lines of a CPU run."""
    lines = [
        "# Planning speed: torch planner on the CPU vs the numpy planner",
        "",
        f"Measured {info['measured_at']} on {info['cpus']} CPUs ({info['platform']}), one thread, torch "
        f"{info['torch']}, numpy {info['numpy']}; load average at the end "
        f"{info['load_average_end'][0]:.1f} (the machine is shared). Zepp's pipeline (placement, routing "
        "`zepp`, dispatch `zepp`, combine `reduce`), one batch per row, median of "
        f"{info['repeats']} interleaved runs. Traces: " + "; ".join(f"{m}: {s}" for m, s in info["traces"].items()) + ".",
        "Every row's torch plan was checked equal to the numpy plan (slot and every hop column).",
        "",
        "| model | nodes | MB/GPU | entries | numpy route ms | numpy flows ms | torch route ms | torch flows ms | "
        "torch / numpy |" + (" capture-safe / numpy |" if capture_safe else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if capture_safe else ""),
    ]
    for r in info["rows"]:
        cs = ""
        if capture_safe:
            cs = f" {r['capture_safe_ratio']:.2f} |" if "capture_safe_ratio" in r else " - |"
        lines.append(f"| {r['model']} | {r['nodes']}x{GPUS_PER_NODE} | {r['mb']} | {r['entries']:,} | "
                     f"{r['numpy_route_ms']:.1f} | {r['numpy_flows_ms']:.1f} | {r['torch_route_ms']:.1f} | "
                     f"{r['torch_flows_ms']:.1f} | {r['ratio']:.2f} |" + cs + ("" if r["equal"] else " NOT EQUAL"))
    if info["rows"]:
        lines += ["", f"Geometric mean of torch / numpy: {info['geomean_ratio']:.2f}."]
    return lines


def _parser() -> argparse.ArgumentParser:
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
    return parser


def main() -> None:
    args = _parser().parse_args()
    args.traces = find_traces(args.traces, required=False)
    if args.device != "cpu":
        from plan_speed_device import device_main

        return device_main(args)
    torch.set_num_threads(1)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, source = [], {}
    for cfg in configurations(args, "cpu"):
        source[cfg.model] = cfg.source
        row = _cpu_row(cfg, args.repeats, args.capture_safe)
        rows.append(row)
        print(f"{cfg.model:5s} {cfg.nodes:3d}x{GPUS_PER_NODE} {cfg.mb:3d} MB {cfg.batch.size:>9,} entries  numpy "
              f"{row['numpy_ms']:8.1f} ms  torch {row['torch_ms']:8.1f} ms  ratio {row['ratio']:.2f}"
              + (f"  capture-safe {row['capture_safe_ratio']:.2f}" if "capture_safe_ratio" in row else "")
              + ("" if row["equal"] else "  NOT EQUAL"), flush=True)
    ratios = [r["ratio"] for r in rows]
    info = dict(
        what="Zepp planning (routing zepp + flows zepp/reduce), numpy planner vs torch planner on the CPU",
        measured_at=started.isoformat(timespec="seconds"), machine=platform.processor() or platform.machine(),
        platform=platform.platform(), cpus=os.cpu_count(), threads=1, torch=torch.__version__,
        numpy=np.__version__, repeats=args.repeats, load_average_end=os.getloadavg(), traces=source,
        geomean_ratio=float(np.exp(np.mean(np.log(ratios)))) if ratios else None, rows=rows)
    Path(args.out + ".json").write_text(json.dumps(info, indent=1))
    lines = _cpu_report(info, args.capture_safe)
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.data:
        _write_data(args.data, info)
    if not all(r["equal"] for r in rows):
        raise SystemExit("torch and numpy plans differ")


if __name__ == "__main__":
    main()
