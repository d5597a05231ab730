"""What a placement buys an engine: bytes and rows per layer, Zepp's placement against EPLB's.

For each MoE layer of a :class:`~zepp.interop.history.LayerHistory`, batches are sampled from the
history the placement was planned on and from a held-out part of it (the last rows or time
bins), and planned four or five ways (``CONFIGS``):

- ``eplb``: the engine's own replica choice over EPLB's placement (what the engine does today);
- ``engine+zepp-place``: the same replica choice over Zepp's placement (what the file buys);
- ``engine+zepp-table``: the engine's own dispatch over Zepp's placement and Zepp's table (what
  the placement and table files buy with the engine's plug-in, ``zepp.engines``; SGLang and vLLM);
- ``zepp-route``: Zepp's routing over Zepp's placement, on the engine's transport;
- ``zepp-full``: Zepp's routing and Zepp's transport (merged, NIC-split, pre-reduced).

The engine's transport defaults to DeepEP-style relay dispatch with a combine reduced inside
the node (``relay`` / ``reduce``), which is what wide-EP deployments of SGLang, vLLM and
TensorRT-LLM run across nodes. Figures per batch: the busiest NIC's bytes (either direction,
dispatch + combine), inter-node bytes in total, and the busiest GPU's GEMM rows; averaged over
the sampled batches. With a cluster, the first ``sim_layers`` layers are also simulated
(first batch of each window): every configuration with the
same executor mechanics (``signals``: no overlap), Zepp's routing charged its modelled planning
time (that of the ``zepp``/``reduce`` flows, also for ``zepp-route``), the engine's replica
choice none; the network figures are the preset's (``zepp.sim.run.simulate_flowplan``: fitted
for ``a100`` / ``h100``, DeepEP's published ones for today's presets); a cluster the simulator
has no figures for is not simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zepp.errors import ZeppInputError

__all__ = ["CONFIGS", "engine_routing", "buys", "format_table", "LayerFigures"]

OTHER_ROUTING = {"trtllm": "replica-rr", "zepp": "zepp"}  # formats without a registry row of their engine


def engine_routing(fmt: str) -> str:
    """The engine's own replica choice for format ``fmt`` (the registry row of the engine, else
    TensorRT-LLM's round-robin / Zepp's routing)."""
    from zepp.interop.engine_tables import ENGINE_ROWS
    from zepp.registry import SYSTEMS

    return SYSTEMS[ENGINE_ROWS[fmt][0]].routing if fmt in ENGINE_ROWS else OTHER_ROUTING[fmt]


class Config(NamedTuple):
    """One configuration of the report: whose placement, whose routing and whose transports
    (``engine``: the engine's own; ``zepp``: Zepp's)."""

    placement: str
    routing: str
    transport: str


CONFIG_PARTS = {
    "eplb": Config("eplb", "engine", "engine"),
    "engine+zepp-place": Config("zepp", "engine", "engine"),
    "engine+zepp-table": Config("zepp", "table", "engine"),
    "zepp-route": Config("zepp", "zepp", "engine"),
    "zepp-full": Config("zepp", "zepp", "zepp"),
}
CONFIGS = tuple(CONFIG_PARTS)


@dataclass(frozen=True)
class LayerFigures:
    layer: int | None
    window: str  # "history" or "held-out"
    config: str
    busiest_nic_bytes: float
    inter_node_bytes: float
    busiest_gpu_rows: float
    sim_ms: float | None = None


def simulated_ms(cluster, spec, placement_kind: str, routing: str, dispatch: str, combine: str | None,
                 plan) -> float:
    """The simulated layer time (ms) of ``plan`` on ``cluster`` (``zepp.sim.run.simulate_flowplan``:
    the preset's network figures), with no overlap (``signals``); a routing Zepp's planner decides
    is charged the modelled planning of Zepp's routing and ``zepp``/``reduce`` flows, the engine's
    replica choice nothing."""
    from zepp import registry
    from zepp.planner.routing import ROUTINGS
    from zepp.sim.run import simulate_flowplan

    zepp_planned = ROUTINGS.choice(routing).zepp_planner
    s = registry.System("zepp-place", "", "", placement_kind, routing, "zepp" if zepp_planned else dispatch,
                        "reduce" if zepp_planned else (combine or "dedup"), mechanics="signals",
                        planning="zepp" if zepp_planned else "none")
    tl, _, _ = simulate_flowplan(plan, cluster, spec, s)
    return float(tl.latency * 1e3)


def _figures(batches, placement, routing: str, dispatch: str, combine: str | None, row_bytes: int,
             relaxation: float, table=None) -> tuple[float, float, float, object]:
    """Mean busiest-NIC bytes, inter-node bytes and busiest-GPU rows over ``batches``, and the
    first batch's FlowPlan (``table``: the table of a table routing)."""
    from zepp.planner import Stages, plan_batch

    nic, inter, rows, plans = [], [], [], []
    for b in batches:
        plan = plan_batch(b, placement, Stages(routing, dispatch, combine), row_bytes, relaxation, table=table)
        st = plan.stats()
        nic.append(st.busiest_nic_bytes)
        inter.append(st.inter_node_bytes)
        rows.append(int(plan.routing.rows_per_rank().max()))
        plans.append(plan)
    return float(np.mean(nic)), float(np.mean(inter)), float(np.mean(rows)), plans[0]


def buys(history, heldout, zepp_ep, eplb_ep, engine_routing: str, dispatch: str = "relay",
         combine: str | None = "reduce", budget_mb: float = 4.0, iters: int = 2, seed: int = 0,
         relaxation: float = 0.25, progress=None, cluster=None, sim_layers: int = 4, tables=None,
         table_routing: str | None = None) -> list[LayerFigures]:
    """Figures per (layer, window, config). ``history``/``heldout``: ``LayerHistory`` (held-out
    may be ``None``); ``zepp_ep``/``eplb_ep``: ``EnginePlacement`` of each policy; ``cluster``:
    simulate the first ``sim_layers`` layers on it (``None``, or a cluster without network
    figures: no simulation); ``tables``: Zepp's table per MoE layer for ``table_routing`` (the
    engine's own dispatch over it is ``engine+zepp-table``; without tables that row is left out)."""
    from zepp.sim.calibrate import has_network

    spec = zepp_ep.model
    tokens = spec.tokens_for_budget(budget_mb)
    out: list[LayerFigures] = []
    simulate = cluster is not None and has_network(cluster.name)
    windows = [("history", history)] + ([("held-out", heldout)] if heldout is not None else [])
    routings = {"engine": engine_routing, "table": table_routing, "zepp": "zepp"}
    for i in range(history.num_entries):
        layer = history.layers[i] if history.layers is not None else None
        key = layer if layer is not None else spec.moe_layers[0]
        placements = {"zepp": zepp_ep.placement(key), "eplb": eplb_ep.placement(key)}
        table = tables[key] if tables is not None else None
        for wname, h in windows:
            batches = h.batches(i, zepp_ep.ranks, tokens, iters, seed)
            for name, cfg in CONFIG_PARTS.items():
                if cfg.routing == "table" and table is None:
                    continue
                rt = routings[cfg.routing]
                d, c = (dispatch, combine) if cfg.transport == "engine" else ("zepp", "reduce")
                nic, inter, rows, first = _figures(batches, placements[cfg.placement], rt, d, c, spec.row_bytes,
                                                   relaxation, table if cfg.routing == "table" else None)
                ms = simulated_ms(cluster, spec, cfg.placement, rt, d, c, first) if simulate and i < sim_layers else None
                out.append(LayerFigures(layer, wname, name, nic, inter, rows, ms))
        if progress is not None:
            progress(i + 1, history.num_entries)
    return out


def totals(figs: list[LayerFigures]) -> dict[tuple[str, str], tuple[float, ...]]:
    """Per (window, config): sums over layers of each figure (a model step crosses every layer),
    and the mean simulated ms over the simulated layers (NaN when none was)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for f in figs:
        a = acc.setdefault((f.window, f.config), [0.0, 0.0, 0.0, 0.0, 0])
        a[0] += f.busiest_nic_bytes
        a[1] += f.inter_node_bytes
        a[2] += f.busiest_gpu_rows
        if f.sim_ms is not None:
            a[3] += f.sim_ms
            a[4] += 1
    return {k: (v[0], v[1], v[2], v[3] / v[4] if v[4] else float("nan")) for k, v in acc.items()}


def format_table(figs: list[LayerFigures], max_layers: int = 6) -> str:
    """Aligned text: per window, the total over layers and the first layers, each config's
    figures and their ratio to ``eplb`` (< 1 is better)."""
    if not figs:
        raise ZeppInputError("no figures to report")
    mib = 2.0 ** 20
    lines = []
    head = (f"{'layer':>6}  {'configuration':<18} {'busiest NIC MiB':>15} {'x eplb':>7} {'inter-node MiB':>15} "
            f"{'x eplb':>7} {'busiest GPU rows':>16} {'x eplb':>7} {'sim layer ms':>12} {'x eplb':>7}")
    tot = totals(figs)
    for window in dict.fromkeys(f.window for f in figs):
        layers = list(dict.fromkeys(f.layer for f in figs if f.window == window))
        lines.append(f"{window} window ({len(layers)} layer{'s' if len(layers) != 1 else ''}; per batch, "
                     f"dispatch + combine; 'total' sums the layers, its sim ms is the mean of the simulated ones):")
        lines.append(head)
        configs = [c for c in CONFIGS if (window, c) in tot]
        rows = [("total", {c: tot[(window, c)] for c in configs})]
        for layer in layers[:max_layers]:
            rows.append((str(layer) if layer is not None else "all", {
                f.config: (f.busiest_nic_bytes, f.inter_node_bytes, f.busiest_gpu_rows,
                           float("nan") if f.sim_ms is None else f.sim_ms)
                for f in figs if f.window == window and f.layer == layer}))
        for name, per in rows:
            base = per["eplb"]
            for c in configs:
                v = per[c]
                r = [v[j] / base[j] if base[j] else float("nan") for j in range(4)]
                sim = (f"{v[3]:>12.3f} {r[3]:>7.2f}" if v[3] == v[3] else f"{'-':>12} {'-':>7}")
                lines.append(f"{name:>6}  {c:<18} {v[0] / mib:>15.2f} {r[0]:>7.2f} {v[1] / mib:>15.2f} {r[1]:>7.2f} "
                             f"{v[2]:>16.0f} {r[2]:>7.2f} {sim}")
                name = ""
        if len(layers) > max_layers:
            lines.append(f"  ... {len(layers) - max_layers} more layers in the --report JSON")
        lines.append("")
    return "\n".join(lines).rstrip()
