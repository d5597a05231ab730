"""What a placement buys an engine: bytes and rows per layer, Zepp's placement against EPLB's.

For each MoE layer of a :class:`~zepp.history.LayerHistory`, batches are sampled from the
history the placement was planned on and from a held-out part of it (the last rows or time
bins), and planned four ways (``CONFIGS``):

- ``eplb``: the engine's own replica choice over EPLB's placement (what the engine does today);
- ``engine+zepp-place``: the same replica choice over Zepp's placement (what the file buys);
- ``zepp-route``: Zepp's routing over Zepp's placement, on the engine's transport;
- ``zepp-full``: Zepp's routing and Zepp's transport (merged, NIC-split, pre-reduced).

The engine's transport defaults to DeepEP-style relay dispatch with a combine reduced inside
the node (``relay`` / ``reduce``), which is what wide-EP deployments of SGLang, vLLM and
TensorRT-LLM run across nodes. Figures per batch: the busiest NIC's bytes (either direction,
dispatch + combine), inter-node bytes in total, and the busiest GPU's GEMM rows; averaged over
the sampled batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError

__all__ = ["CONFIGS", "ENGINE_ROUTING", "buys", "format_table", "LayerFigures"]

ENGINE_ROUTING = {"sglang": "locality", "vllm": "random", "trtllm": "replica-rr", "zepp": "zepp"}
CONFIGS = ("eplb", "engine+zepp-place", "zepp-route", "zepp-full")


@dataclass(frozen=True)
class LayerFigures:
    layer: int | None
    window: str  # "history" or "held-out"
    config: str
    busiest_nic_bytes: float
    inter_node_bytes: float
    busiest_gpu_rows: float


def _figures(batches, placement, routing: str, dispatch: str, combine: str | None, row_bytes: int,
             relaxation: float) -> tuple[float, float, float]:
    from zepp.flows import build_flows
    from zepp.routing import route

    nic, inter, rows = [], [], []
    for b in batches:
        r = route(routing, b, placement, relaxation=relaxation)
        st = build_flows(r, dispatch, row_bytes, combine).stats()
        nic.append(st.busiest_nic_bytes)
        inter.append(st.inter_node_bytes)
        rows.append(int(r.rows_per_rank().max()))
    return float(np.mean(nic)), float(np.mean(inter)), float(np.mean(rows))


def buys(history, heldout, zepp_ep, eplb_ep, engine_routing: str, dispatch: str = "relay",
         combine: str | None = "reduce", budget_mb: float = 4.0, iters: int = 2, seed: int = 0,
         relaxation: float = 0.25, progress=None) -> list[LayerFigures]:
    """Figures per (layer, window, config). ``history``/``heldout``: ``LayerHistory`` (held-out
    may be ``None``); ``zepp_ep``/``eplb_ep``: ``EnginePlacement`` of each policy."""
    spec = zepp_ep.model
    ranks = zepp_ep.ranks
    tokens = spec.tokens_for_budget(budget_mb)
    out: list[LayerFigures] = []
    windows = [("history", history)] + ([("held-out", heldout)] if heldout is not None else [])
    entries = range(history.num_entries)
    for i in entries:
        layer = history.layers[i] if history.layers is not None else None
        key = layer if layer is not None else spec.moe_layers[0]
        zp, ep = zepp_ep.placement(key), eplb_ep.placement(key)
        for wname, h in windows:
            batches = h.batches(i, ranks, tokens, iters, seed)
            plans = {
                "eplb": (ep, engine_routing, dispatch, combine),
                "engine+zepp-place": (zp, engine_routing, dispatch, combine),
                "zepp-route": (zp, "zepp", dispatch, combine),
                "zepp-full": (zp, "zepp", "zepp", "reduce"),
            }
            for cfg in CONFIGS:
                pl, rt, d, c = plans[cfg]
                nic, inter, rows = _figures(batches, pl, rt, d, c, spec.row_bytes, relaxation)
                out.append(LayerFigures(layer, wname, cfg, nic, inter, rows))
        if progress is not None:
            progress(i + 1, history.num_entries)
    return out


def totals(figs: list[LayerFigures]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Per (window, config): sums over layers of each figure (a model step crosses every layer)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for f in figs:
        a = acc.setdefault((f.window, f.config), [0.0, 0.0, 0.0])
        a[0] += f.busiest_nic_bytes
        a[1] += f.inter_node_bytes
        a[2] += f.busiest_gpu_rows
    return {k: tuple(v) for k, v in acc.items()}


def format_table(figs: list[LayerFigures], max_layers: int = 6) -> str:
    """Aligned text: per window, the total over layers and the first layers, each config's
    figures and their ratio to ``eplb`` (< 1 is better)."""
    if not figs:
        raise ZeppInputError("no figures to report")
    mib = 2.0 ** 20
    lines = []
    head = (f"{'layer':>6}  {'configuration':<18} {'busiest NIC MiB':>15} {'x eplb':>7} {'inter-node MiB':>15} "
            f"{'x eplb':>7} {'busiest GPU rows':>16} {'x eplb':>7}")
    tot = totals(figs)
    for window in dict.fromkeys(f.window for f in figs):
        layers = list(dict.fromkeys(f.layer for f in figs if f.window == window))
        lines.append(f"{window} window ({len(layers)} layer{'s' if len(layers) != 1 else ''}; per batch, "
                     f"dispatch + combine; 'total' sums the layers):")
        lines.append(head)
        rows = [("total", {c: tot[(window, c)] for c in CONFIGS})]
        for layer in layers[:max_layers]:
            rows.append((str(layer) if layer is not None else "all", {
                f.config: (f.busiest_nic_bytes, f.inter_node_bytes, f.busiest_gpu_rows)
                for f in figs if f.window == window and f.layer == layer}))
        for name, per in rows:
            base = per["eplb"]
            for c in CONFIGS:
                v = per[c]
                r = [v[j] / base[j] if base[j] else float("nan") for j in range(3)]
                lines.append(f"{name:>6}  {c:<18} {v[0] / mib:>15.2f} {r[0]:>7.2f} {v[1] / mib:>15.2f} {r[1]:>7.2f} "
                             f"{v[2]:>16.0f} {r[2]:>7.2f}")
                name = ""
        if len(layers) > max_layers:
            lines.append(f"  ... {len(layers) - max_layers} more layers in the --report JSON")
        lines.append("")
    return "\n".join(lines).rstrip()
