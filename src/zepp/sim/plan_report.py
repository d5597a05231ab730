"""``zepp plan``'s report: each system's plans of sampled batches, what they put on the links, their
planning time on this CPU and the first batch's simulated layer time (``zepp.sim.run.simulate_flowplan``).
``plan_table`` is what the command prints and what ``benchmarks/planner/plan_bytes.py`` tabulates."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from zepp import registry
from zepp.model import MoESpec
from zepp.planner.batch import plan_batch
from zepp.planner.placement import make_placement
from zepp.planner.routing import demand_per_gpu
from zepp.traces import Trace, node_demand, sample_batches

__all__ = ["plan_table", "format_table", "COLUMNS", "simulated_ms"]


def simulated_ms(cluster, spec: MoESpec, system: str, plan) -> float | None:
    """The simulated layer time of ``plan`` on ``cluster`` (``zepp.sim.run.simulate_flowplan``;
    ``None`` where the simulator has no network figures for the cluster's preset, fitted or
    published, or does not run the system from one FlowPlan)."""
    from zepp.sim.calibrate import has_network
    from zepp.sim.run import simulate_flowplan

    s = registry.system(system)
    if not has_network(cluster.name) or not s.supports("sim") or s.adaptation_choice.changes_placement or s.plugins:
        return None
    tl, _, _ = simulate_flowplan(plan, cluster, spec, s)
    return tl.latency * 1e3


def _timed_plan(system, batch, placement, row_bytes: int, relaxation: float, table=None):
    """``(FlowPlan, routing s, flows s)`` of one batch (``zepp.planner.plan_batch`` times its two
    steps apart: the table's two columns); ``table``: a table routing's table."""
    t: dict = {}
    plan = plan_batch(batch, placement, system, row_bytes, relaxation, timings=t, table=table)
    return plan, t["routing"], t["flows"]


def _figures(plan, routing_s: float, flows_s: float) -> dict:
    """What one plan puts on the links, and its planning seconds."""
    stats = plan.stats()
    return dict(inter_node_bytes=stats.inter_node_bytes, busiest_nic_bytes=stats.busiest_nic_bytes,
                nvlink_bytes=stats.nvlink_bytes, busiest_gpu_rows=int(stats.rows_computed.max()),
                messages=int(stats.messages.sum()), routing_s=routing_s, flows_s=flows_s)


def plan_table(spec: MoESpec, nodes: int, gpus_per_node: int, budget_mb: float, pool: Trace, evaluation: Trace,
               systems: list[str], iters: int, seed: int, relaxation: float, extra: int,
               validate: bool | str = True, dump: Path | None = None, cluster=None, workload=None) -> list[dict]:
    """Plan ``iters`` sampled batches with each system; one summary dict per system (means over
    iterations of bytes, rows and planning seconds; ``sim_ms``: the first batch simulated on
    ``cluster`` where the simulator can). ``validate``: every plan (``True``), the first batch's
    only (``"first"``) or none (``False``). ``workload``: a ``zepp.traces.DriftWorkload`` whose
    history and batches replace ``pool`` / ``evaluation``'s."""
    ranks = nodes * gpus_per_node
    if workload is None:
        hist = node_demand(pool, nodes, gpus_per_node)
        batches = sample_batches(evaluation, ranks, spec.tokens_for_budget(budget_mb), iters, seed)
    else:
        hist, batches = workload.hist(nodes, gpus_per_node), workload.batches
    rows = []
    for name in systems:
        system = registry.system(name)
        t0 = time.perf_counter()
        placement = make_placement(system.placement, hist, spec.num_experts, ranks, gpus_per_node, extra=extra)
        table = None
        if system.routing_choice.needs_table:  # built once per placement from the history, as the simulator does
            table = system.routing_choice.build_table(placement, demand_per_gpu(hist, gpus_per_node), relaxation,
                                                      gpus_per_node)
        place_s = time.perf_counter() - t0
        per_iter, sim_first = [], None
        for it, batch in enumerate(batches):
            plan, routing_s, flows_s = _timed_plan(system, batch, placement, spec.row_bytes, relaxation, table)
            if validate is True or (validate == "first" and it == 0):
                plan.validate()
            if it == 0 and cluster is not None:
                sim_first = simulated_ms(cluster, spec, name, plan)
            per_iter.append(_figures(plan, routing_s, flows_s))
            if dump is not None:
                _dump(dump / f"{name}_iter{it}.npz", batch, plan, placement)
        row = {key: float(np.mean([d[key] for d in per_iter])) for key in per_iter[0]}
        row["sim_ms"] = sim_first
        row.update(system=name, placement=system.placement, routing=system.routing, dispatch=system.dispatch,
                   combine=system.combine, placement_s=place_s, entries=int(batches[0].size))
        rows.append(row)
    return rows


def _dump(path: Path, batch: np.ndarray, plan, placement) -> None:
    """One plan of ``zepp plan --dump``: the batch's ids, the routing's slots, the placement."""
    from zepp.outputs import replacing

    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, "--dump") as tmp:
        np.savez_compressed(tmp, topk_ids=batch, slot=plan.routing.slot, slot_expert=placement.slot_expert)


COLUMNS = (
    ("inter-node MiB", "bytes crossing any NIC, both phases, mean per batch"),
    ("busiest NIC MiB", "the most loaded NIC direction (send or receive)"),
    ("vs a2av", "busiest NIC bytes relative to a2av's"),
    ("NVLink MiB", "bytes over intra-node links"),
    ("busiest GPU rows", "GEMM rows of the most loaded GPU"),
    ("msgs", "messages, both phases"),
    ("plan ms", "routing + flows on this CPU (numpy), not the simulated GPU planner"),
    ("sim ms", "the first batch's simulated layer time on the chosen cluster"),
)


def format_table(rows: list[dict]) -> str:
    """The plan table; units in the headers (MiB = 2**20 bytes); ``COLUMNS`` says what each means."""
    mib = 2**20
    w = max([len("system")] + [len(r["system"]) for r in rows])
    widths = [max(len(c), 9) for c, _ in COLUMNS]
    head = f"{'system':<{w}} " + " ".join(f"{c:>{n}}" for (c, _), n in zip(COLUMNS, widths))
    base = next((r["busiest_nic_bytes"] for r in rows if r["system"] == "a2av"), None)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = [f"{r['inter_node_bytes'] / mib:.2f}", f"{r['busiest_nic_bytes'] / mib:.3f}",
                 f"{r['busiest_nic_bytes'] / base:.3f}" if base else "-", f"{r['nvlink_bytes'] / mib:.2f}",
                 f"{r['busiest_gpu_rows']:.0f}", f"{r['messages']:.0f}", f"{(r['routing_s'] + r['flows_s']) * 1e3:.1f}",
                 f"{r['sim_ms']:.2f}" if r.get("sim_ms") is not None else "-"]
        lines.append(f"{r['system']:<{w}} " + " ".join(f"{c:>{n}}" for c, n in zip(cells, widths)))
    lines.append("")
    lines.extend(f"  {c}: {m}" for c, m in COLUMNS)
    return "\n".join(lines)
