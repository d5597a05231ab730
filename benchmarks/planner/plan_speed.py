"""Planning speed: routing and flows at 16 nodes x 4 GPUs, K2, 16 MB per GPU, beside one np.bincount.

About 600k entries (64 ranks x 1168 tokens x top-8). A plan is the routing (every entry's
replica) and the flows' volumes (rows per stage, source, destination, message and owner node,
``FlowPlan.volumes``); the per-row hop tables an executor runs are timed apart (``hops``). Every
measurement is interleaved with one ``np.bincount`` over the same entries (the floor), all on one
thread (numpy's and torch's own threads pinned to 1), ``--repeats`` rounds, each round in a
rotated order; reported: the median and the minimum of each, in CPU milliseconds of this process
(``time.process_time``: the machine is shared, so wall time mostly measures the other work), the
wall-clock median beside them, and the load average at the start and the end.

Sections: the numpy planner per (placement, routing, transports); Zepp's plan step by step
(demand, water-fill, assignment, vacate pass, token counts, dispatch and combine volumes); the
torch planner on the CPU (``sync=True``, and the capture-safe ``sync=False, sweeps=1``) against
numpy, plans checked equal. ``--device cuda`` times the torch planner on a GPU instead (eager,
capture-safe, and a CUDA-graph replay of routing + volumes, checked against numpy) and writes
``<out>_cuda.{json,md}``.

    python benchmarks/planner/plan_speed.py [--traces ../shared/traces] [--repeats 7] [--out PREFIX]
    python benchmarks/planner/plan_speed.py --device cuda          # when a GPU is lent

Writes ``benchmarks/results/plan_speed.{json,md}`` (or ``--out PREFIX``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.planner.flows import build_flows  # noqa: E402
from zepp.planner.placement import make_placement  # noqa: E402
from zepp.planner.routing import route  # noqa: E402
from zepp.traces import load_model_traces, node_demand, sample_batches  # noqa: E402

PIPELINES = (("home", "home", "a2av", None), ("home", "home", "relay", None), ("eplb", "replica-rr", "a2av", None),
             ("zepp", "zepp", "a2av", None), ("zepp", "zepp", "zepp", "reduce"))


class Clock:
    """Interleaved timings: ``run(rounds)`` measures every registered job once per round (order
    rotated each round) and keeps CPU and wall seconds per job."""

    def __init__(self):
        self.jobs: dict[str, object] = {}
        self.cpu: dict[str, list] = {}
        self.wall: dict[str, list] = {}

    def add(self, name: str, fn) -> None:
        self.jobs[name] = fn
        self.cpu[name], self.wall[name] = [], []

    def run(self, rounds: int) -> None:
        names = list(self.jobs)
        for i in range(rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                w, c = time.perf_counter(), time.process_time()
                self.jobs[name]()
                self.cpu[name].append(time.process_time() - c)
                self.wall[name].append(time.perf_counter() - w)

    def ms(self, name: str) -> dict:
        c, w = self.cpu[name], self.wall[name]
        return dict(cpu_ms=statistics.median(c) * 1e3, cpu_min_ms=min(c) * 1e3, wall_ms=statistics.median(w) * 1e3)


def load(args):
    spec = model_preset("k2")
    nodes, L = args.nodes, 4
    traces = find_traces(args.traces, required=False)
    if traces:
        pool, evaluation = load_model_traces(traces, "k2")
    else:
        from zepp.traces.synthetic import synthetic_traces
        pool, evaluation = synthetic_traces("k2", seed=0)
    batch = sample_batches(evaluation, nodes * L, spec.tokens_for_budget(16), 1, 0)[0]
    return spec, nodes, L, pool, batch, str(evaluation.source)


def plan(batch, placement, routing, dispatch, combine, relaxation, row_bytes):
    """A plan: the routing and the flows' volumes (what the planner decides)."""
    p = build_flows(route(routing, batch, placement, relaxation), dispatch, row_bytes, combine)
    p.volumes
    return p


def numpy_rows(clock: Clock, batch, spec, nodes, L, pool, relaxation) -> list[dict]:
    """The numpy planner per pipeline: routing, volumes, hop tables (timed apart), validation."""
    hist = node_demand(pool, nodes, L)
    rows = []
    for pname, rname, d, c in PIPELINES:
        pl = make_placement(pname, hist, spec.num_experts, nodes * L, L)
        r = route(rname, batch, pl, relaxation)
        tag = f"{pname}/{rname}/{d}"
        clock.add(tag + ":routing", lambda pl=pl, rname=rname: route(rname, batch, pl, relaxation))
        clock.add(tag + ":volumes", lambda r=r, d=d, c=c: build_flows(r, d, spec.row_bytes, c).volumes)
        clock.add(tag + ":hops", lambda r=r, d=d, c=c: build_flows(r, d, spec.row_bytes, c).hop_tables)
        p = build_flows(r, d, spec.row_bytes, c)
        t0 = time.process_time()
        p.validate()
        rows.append(dict(placement=pname, routing=rname, transport=p.transport, tag=tag,
                         validate_ms=(time.process_time() - t0) * 1e3, hops=p.dispatch.size + p.combine.size,
                         cells=p.volumes.dispatch.size + p.volumes.combine.size))
    return rows


def zepp_steps(clock: Clock, batch, pl, relaxation) -> list[str]:
    """Zepp's plan step by step (each step on the previous one's output, computed once)."""
    from zepp.planner.flows import gateway_volumes as gv
    from zepp.planner.flows.token_counts import TokenCounts
    from zepp.planner.routing import zepp_assign as za, zepp_routing as zr, zepp_vacate as zv
    from zepp.planner.routing.zepp_tables import zepp_tables

    tables = zepp_tables(pl)
    keys = za.entry_keys(batch, pl.num_experts)
    demand = keys.demand[:, tables.multi]

    def fill():
        f = zr._WaterFill(demand, pl, relaxation, tables.multi)
        f.run()
        return f

    f = fill()
    filled = zr._Filled(batch, pl, relaxation)
    r = route("zepp", batch, pl, relaxation)
    tc = TokenCounts(r)
    _, gw = gv.zepp_dispatch(tc, True)
    steps = {"demand (entry keys, one count)": lambda: za.entry_keys(batch, pl.num_experts),
             "water-fill (counts)": fill,
             "assignment (one gather)": lambda: za.assign_entries(keys, f.assigned, tables, with_node=True),
             "vacate pass (3 rounds)": lambda: zv.vacate(batch, filled.slot, pl, relaxation, 3, filled.slot_counts,
                                                         filled.node),
             "token counts (merge)": lambda: TokenCounts(r),
             "dispatch volumes (zepp: NIC split)": lambda: gv.zepp_dispatch(tc, True),
             "combine volumes (reduce)": lambda: gv.reduce_combine(tc, gw)}
    for name, fn in steps.items():
        clock.add("step:" + name, fn)
    return list(steps)


def torch_jobs(clock: Clock, batch, pl, relaxation, row_bytes) -> bool:
    """The torch planner on the CPU (sync, capture-safe) for Zepp's plan; returns whether its
    routing and volumes equal numpy's."""
    import torch

    import zepp.planner.torch as tp

    torch.set_num_threads(1)
    ids = torch.as_tensor(batch)
    tp.device_placement(pl, "cpu")

    def run(sync):
        r = tp.route("zepp", ids, pl, relaxation, sync=sync, sweeps=None if sync else 1)
        p = tp.build_flows(r, "zepp", row_bytes, "reduce", sync=sync)
        p.volumes
        return p

    clock.add("torch:sync", lambda: run(True))
    clock.add("torch:capture-safe", lambda: run(False))
    want = plan(batch, pl, "zepp", "zepp", "reduce", relaxation, row_bytes)
    return all(_same_plan(run(s), want) for s in (True, False))


def _same_plan(tplan, want) -> bool:
    if not np.array_equal(tplan.routing.slot.cpu().numpy(), want.routing.slot):
        return False
    for got, ref in zip(tplan.volumes, want.volumes):
        g = got.to_numpy()
        if not all(np.array_equal(getattr(g, f), getattr(ref, f)) for f in ("stage", "src", "dst", "msg",
                                                                           "owner_node", "rows")):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_traces_option(parser)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--out", default=str(RESULTS / "plan_speed"))
    parser.add_argument("--no-torch", action="store_true", help="leave out the torch planner's rows")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the torch planner on a GPU (device_main)")
    args = parser.parse_args()
    spec, nodes, L, pool, batch, source = load(args)
    relaxation = 0.5 if nodes >= 16 else 0.25
    if args.device != "cpu":
        return device_main(args, spec, nodes, L, pool, batch, relaxation)
    flat = (batch.ravel() + 1).astype(np.int32)  # ids + 1: missing entries (-1) count in bin 0
    clock = Clock()
    clock.add("bincount", lambda: np.bincount(flat, minlength=spec.num_experts + 1))
    rows = numpy_rows(clock, batch, spec, nodes, L, pool, relaxation)
    zpl = make_placement("zepp", node_demand(pool, nodes, L), spec.num_experts, nodes * L, L)
    clock.add("zepp plan", lambda: plan(batch, zpl, "zepp", "zepp", "reduce", relaxation, spec.row_bytes))
    steps = zepp_steps(clock, batch, zpl, relaxation)
    equal = None if args.no_torch else torch_jobs(clock, batch, zpl, relaxation, spec.row_bytes)
    load0 = os.getloadavg()
    clock.run(args.repeats)
    info = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(), entries=int(batch.size),
                nodes=nodes, gpus_per_node=L, tokens_per_gpu=int(batch.shape[1]), repeats=args.repeats, traces=source,
                load_average_start=load0, load_average_end=os.getloadavg(), numpy=np.__version__,
                timings={name: clock.ms(name) for name in clock.jobs}, rows=rows, steps=steps, torch_equal=equal)
    Path(args.out + ".json").write_text(json.dumps(info, indent=1))
    Path(args.out + ".md").write_text(report(info))
    print(report(info))


def report(info: dict) -> str:
    t = info["timings"]
    floor = t["bincount"]["cpu_ms"]
    ms = lambda name: t[name]["cpu_ms"]  # noqa: E731
    lines = [f"# Planning speed: K2, {info['nodes']} nodes x {info['gpus_per_node']} GPUs, 16 MB/GPU = "
             f"{info['tokens_per_gpu']} tokens, {info['entries']:,} entries", "",
             f"CPU milliseconds of one thread (median of {info['repeats']} interleaved rounds; min and wall-clock "
             f"median in the JSON), load average {info['load_average_start'][0]:.1f} at the start and "
             f"{info['load_average_end'][0]:.1f} at the end on {info['cpus']} CPUs. Batch from {info['traces']}. "
             f"The floor: one `np.bincount` over the same entries, {floor:.2f} ms "
             f"(min {t['bincount']['cpu_min_ms']:.2f}) in the same rounds.", "",
             "| placement | routing | transport | routing ms | flows (volumes) ms | plan ms | plan / bincount | "
             "hop tables ms | validate ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in info["rows"]:
        p = ms(r["tag"] + ":routing") + ms(r["tag"] + ":volumes")
        lines.append(f"| {r['placement']} | {r['routing']} | {r['transport']} | {ms(r['tag'] + ':routing'):.1f} | "
                     f"{ms(r['tag'] + ':volumes'):.1f} | {p:.1f} | {p / floor:.1f}x | {ms(r['tag'] + ':hops'):.1f} | "
                     f"{r['validate_ms']:.0f} |")
    z = t["zepp plan"]
    lines += ["", f"Zepp's plan in one call (routing `zepp`, flows `zepp`/`reduce`): {z['cpu_ms']:.1f} ms "
              f"(min {z['cpu_min_ms']:.1f}), {z['cpu_ms'] / floor:.1f}x the bincount. Step by step:", "",
              "| step | ms |", "|---|---|"]
    lines += [f"| {s} | {ms('step:' + s):.2f} |" for s in info["steps"]]
    if info.get("torch_equal") is not None:
        lines += ["", "The torch planner on the CPU (one thread), Zepp's plan (routing + volumes); plans equal to "
                  f"numpy's: {info['torch_equal']}:", "", "| mode | ms | / numpy |", "|---|---|---|"]
        for mode in ("torch:sync", "torch:capture-safe"):
            lines.append(f"| {mode.split(':')[1]} | {ms(mode):.1f} | {ms(mode) / z['cpu_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def device_main(args, spec, nodes, L, pool, batch, relaxation) -> None:
    """The torch planner on ``args.device``: eager (sync), capture-safe eager (``sync=False,
    sweeps=1``) and a CUDA-graph replay of the capture-safe routing + volumes, each checked
    against the numpy plan; CUDA-event milliseconds, median of ``max(repeats, 10)``."""
    import torch

    import zepp.planner.torch as tp
    from plan_speed_device import captured, cuda_ms  # the same CUDA-event timing and capture

    dev = torch.device(args.device)
    pl = make_placement("zepp", node_demand(pool, nodes, L), spec.num_experts, nodes * L, L)
    tp.device_placement(pl, dev)
    ids = torch.as_tensor(batch, device=dev)
    want = plan(batch, pl, "zepp", "zepp", "reduce", relaxation, spec.row_bytes)

    def run(sync):
        r = tp.route("zepp", ids, pl, relaxation, sync=sync, sweeps=None if sync else 1)
        p = tp.build_flows(r, "zepp", spec.row_bytes, "reduce", sync=sync)
        p.volumes
        return p

    n = max(args.repeats, 10)
    row = dict(device=torch.cuda.get_device_name(dev), entries=int(batch.size), torch=torch.__version__)
    for label, sync in (("eager_ms", True), ("capture_safe_ms", False)):
        run(sync)
        row[label] = cuda_ms(lambda: run(sync), n)
        row[label.replace("_ms", "_equal")] = _same_plan(run(sync), want)
    graph, graphed = captured(lambda: run(False))
    graph.replay()
    torch.cuda.synchronize()
    row["graph_ms"] = cuda_ms(graph.replay, n)
    row["graph_unplaced"] = int(graphed.routing.unplaced)
    row["graph_equal"] = row["graph_unplaced"] == 0 and _same_plan(graphed, want)
    Path(args.out + "_cuda.json").write_text(json.dumps(row, indent=1))
    text = ["# Device planning times (zepp.planner.torch, routing + volumes)", "",
            "| device | entries | eager ms | capture-safe ms | graph ms | equal (eager / capture-safe / graph) |",
            "|---|---|---|---|---|---|",
            f"| {row['device']} | {row['entries']:,} | {row['eager_ms']:.3f} | {row['capture_safe_ms']:.3f} | "
            f"{row['graph_ms']:.3f} | {row['eager_equal']} / {row['capture_safe_equal']} / {row['graph_equal']} |"]
    Path(args.out + "_cuda.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
