"""Zepp's routing tables for the engines, one file beside the placement (``table_path``), planned
per MoE layer from the history (``plan_tables``) and read back with every check before an engine
plug-in (``zepp.engines``) installs them.

- SGLang (``sglang-table``, ``.json`` or ``.pt``): ``{"zepp_table": "sglang", "ep_size": R,
  "num_logical_experts": E, "layers": [MoE layer ids], "physical_to_logical_map": [layers, P],
  "logical_to_rank_dispatch_physical_map": [R, layers, E]}``: per rank and layer the physical id of
  each expert's copy that rank's static dispatch sends to (``zepp.planner.routing.engine_tables.StaticTable``).
- vLLM (``vllm-table``, ``.pt``): ``{"zepp_table": "vllm", "ep_size": R, "num_logical_experts": E,
  "layers": [...], "physical_to_logical_map": [layers, P], "gpus_per_node": L, "relaxation": C,
  "objective": "nic" | "rows", "width": W, "choices": [layers, R, E, m], "counts": [layers, R, E, m]}``:
  per rank the copies and their positions in vLLM's row (``HashTable``; a plug-in writes the rows
  with ``hash_rows``, and plans its re-plans' tables with the same ``C`` and objective).

``physical_to_logical_map`` is the placement the tables belong to (the plug-ins refuse to install
them over another). The routing each format's tables stand for is the routing of the engine's
Zepp row in the registry (``ENGINE_ROWS``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import describe_keys
from zepp.interop.common import check_rows, load_obj, save_json
from zepp.traces.formats.arrays import int_array

__all__ = ["ENGINE_ROWS", "table_path", "table_routing", "plan_tables", "write_tables", "read_tables", "KEYS"]

# format: (the engine's own row, the engine with Zepp's placement and table); registry names
ENGINE_ROWS = {"sglang": ("sglang-deepep", "sglang-zepp"), "vllm": ("vllm-eplb", "vllm-zepp")}
KEYS = {"sglang": ("zepp_table", "ep_size", "num_logical_experts", "layers", "physical_to_logical_map",
                   "logical_to_rank_dispatch_physical_map"),
        "vllm": ("zepp_table", "ep_size", "num_logical_experts", "layers", "physical_to_logical_map", "gpus_per_node",
                 "relaxation", "objective", "width", "choices", "counts")}
SUFFIXES = {"sglang": (".json", ".pt"), "vllm": (".pt",)}


def table_path(fmt: str, out) -> Path | None:
    """The table file written beside the placement ``out`` (``None``: the format has no table)."""
    if fmt not in ENGINE_ROWS:
        return None
    p = Path(out)
    suffix = p.suffix.lower() if p.suffix.lower() in SUFFIXES[fmt] else SUFFIXES[fmt][0]
    if fmt == "vllm" and p.suffix.lower() == ".json":  # vLLM-Ascend's file: no plug-in reads a table
        return None
    return p.with_name(p.stem + ".zepp-table" + suffix)


def table_routing(fmt: str, tokens_per_gpu: int) -> str:
    """The routing (a ``ROUTINGS`` name) of format ``fmt``'s tables for batches of ``tokens_per_gpu``
    tokens: the routing of the variant of the engine's Zepp row that batch size runs (a decode
    deployment's table on the low-latency kernels, a prefill deployment's above)."""
    from zepp.registry import SYSTEMS, pick_variant

    return SYSTEMS[pick_variant(ENGINE_ROWS[fmt][1], tokens_per_gpu, {})].routing


def plan_tables(fmt: str, history, ep, relaxation: float, tokens_per_gpu: int) -> dict[int, object]:
    """Per MoE layer of ``ep`` (an ``EnginePlacement``), the table of ``table_routing(fmt, tokens_per_gpu)``
    planned from the layer's history (a layer without records: the summed history, as its placement)."""
    from zepp.planner.routing import ROUTINGS, demand_per_gpu

    build = ROUTINGS[table_routing(fmt, tokens_per_gpu)].build_table
    L = ep.gpus_per_node
    demand = {}
    for i in range(history.num_entries):
        layer = history.layers[i] if history.layers is not None else None
        demand[layer] = history.node_demand(i, ep.nodes, L)[0]
    total = sum(demand.values())
    out = {}
    for layer in sorted(ep.maps):
        hist = demand.get(layer, demand.get(None, total))
        out[layer] = build(ep.placement(layer), demand_per_gpu(hist, L), relaxation, L)
    return out


def _payload(fmt: str, ep, tables: dict[int, object]) -> dict:
    layers = sorted(tables)
    p2l = np.stack([ep.maps[l] for l in layers]).astype(np.int64)
    d = {"zepp_table": fmt, "ep_size": ep.ranks, "num_logical_experts": ep.model.num_experts, "layers": layers,
         "physical_to_logical_map": p2l}
    if fmt == "sglang":
        d["logical_to_rank_dispatch_physical_map"] = np.stack([tables[l].slot for l in layers], 1).astype(np.int64)
    else:
        t0 = tables[layers[0]]
        m = max(tables[l].choices.shape[2] for l in layers)
        pad = lambda a, v: np.pad(a, ((0, 0), (0, 0), (0, m - a.shape[2])), constant_values=v)  # noqa: E731
        d.update(gpus_per_node=ep.gpus_per_node, relaxation=float(t0.relaxation), objective=t0.objective,
                 width=int(t0.width),
                 choices=np.stack([pad(tables[l].choices, -1) for l in layers]).astype(np.int32),
                 counts=np.stack([pad(tables[l].counts, 0) for l in layers]).astype(np.int32))
    return d


def write_tables(path, fmt: str, ep, tables: dict[int, object]) -> None:
    """Write the tables of every MoE layer (``.json`` or ``.pt`` by suffix) and read them back."""
    p = Path(path)
    d = _payload(fmt, ep, tables)
    if p.suffix.lower() == ".json":
        save_json(p, {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()})
    else:
        import torch

        try:
            torch.save({k: (torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v)
                        for k, v in d.items()}, p)
        except OSError as exc:
            raise ZeppInputError(f"{p}: cannot write it ({exc.strerror or type(exc).__name__})") from None
    back = read_tables(p)
    if any(not np.array_equal(np.asarray(back[k]), np.asarray(d[k])) for k in d):
        raise ZeppInputError(f"{p}: reading the written table back gave another table (a bug; please report)")


def read_tables(path) -> dict:
    """A table file, every field checked (one ``ZeppInputError`` naming the file and the field)."""
    p, obj = load_obj(path, (".json", ".pt"))
    fmt = obj.get("zepp_table") if isinstance(obj, dict) else None
    if fmt not in KEYS:
        raise ZeppInputError(f"{p}: not a zepp table file (keys {describe_keys(obj)}); write one with zepp place "
                             f"--format sglang or vllm")
    missing = [k for k in KEYS[fmt] if k not in obj]
    extra = [k for k in obj if k not in KEYS[fmt]]
    if missing or extra:
        raise ZeppInputError(f"{p}: a {fmt} table needs exactly the keys {', '.join(KEYS[fmt])} (missing: "
                             f"{', '.join(missing) or 'none'}; unexpected: {', '.join(extra) or 'none'})")
    R, E = (_whole(obj[k], p, k, 1) for k in ("ep_size", "num_logical_experts"))
    layers = int_array(obj["layers"], f"{p}: layers", "layer ids", lo=0, hi=1 << 20)
    p2l = check_rows(obj["physical_to_logical_map"], str(p), "physical_to_logical_map", E, R)
    if layers.ndim != 1 or layers.size != p2l.shape[0] or np.unique(layers).size != layers.size:
        raise ZeppInputError(f"{p}: layers must list each MoE layer once, one per physical_to_logical_map row "
                             f"({p2l.shape[0]})")
    out = {"zepp_table": fmt, "ep_size": R, "num_logical_experts": E, "layers": layers.tolist(),
           "physical_to_logical_map": p2l}
    check = _check_sglang if fmt == "sglang" else _check_vllm
    out.update(check(obj, p, p2l, R, E))
    return out


def _whole(v, p, key: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ZeppInputError(f"{p}: {key} must be an integer >= {lo}, got {v!r}"[:300])
    return int(v)


def _served_by_copies(slots: np.ndarray, p2l: np.ndarray, p, key: str) -> None:
    """Every slot id in ``slots [R, layers, E, ...]`` (``-1`` allowed only as padding by the caller)
    holds the expert it stands for in that layer's map."""
    R, n_l, E = slots.shape[:3]
    e = np.broadcast_to(np.arange(E).reshape((1, 1, E) + (1,) * (slots.ndim - 3)), slots.shape)
    li = np.broadcast_to(np.arange(n_l).reshape((1, n_l, 1) + (1,) * (slots.ndim - 3)), slots.shape)
    ok = (slots < 0) | (p2l[li, np.maximum(slots, 0)] == e)
    if not ok.all():
        r, l, x = np.argwhere(~ok)[0][:3]
        raise ZeppInputError(f"{p}: {key}: rank {r}, layer row {l}, expert {x} points at a physical slot that "
                             f"holds another expert; write the table with the placement it belongs to")


def _check_sglang(obj, p, p2l, R, E) -> dict:
    key = "logical_to_rank_dispatch_physical_map"
    m = int_array(obj[key], f"{p}: {key}", "physical ids", lo=0, hi=p2l.shape[1])
    if m.shape != (R, p2l.shape[0], E):
        raise ZeppInputError(f"{p}: {key} has shape {m.shape}, expected [ep_size, layers, experts] = "
                             f"{[R, p2l.shape[0], E]}")
    _served_by_copies(m, p2l, p, key)
    return {key: m}


def _check_vllm(obj, p, p2l, R, E) -> dict:
    L, W = _whole(obj["gpus_per_node"], p, "gpus_per_node", 1), _whole(obj["width"], p, "width", 1)
    rel = obj["relaxation"]
    if isinstance(rel, bool) or not isinstance(rel, (int, float)) or not 0 <= rel <= 1000:
        raise ZeppInputError(f"{p}: relaxation must be a number in [0, 1000], got {rel!r}"[:300])
    if W & (W - 1) or R % L:
        raise ZeppInputError(f"{p}: width must be a power of two and gpus_per_node divide ep_size (got {W}, {L})")
    from zepp.planner.routing.engine_tables import OBJECTIVES

    if obj["objective"] not in OBJECTIVES:
        raise ZeppInputError(f"{p}: objective must be one of {', '.join(OBJECTIVES)}, got {obj['objective']!r}"[:300])
    ch = int_array(obj["choices"], f"{p}: choices", "physical ids", lo=-1, hi=p2l.shape[1])
    cnt = int_array(obj["counts"], f"{p}: counts", "positions", lo=0, hi=W + 1)
    if ch.ndim != 4 or ch.shape[:3] != (p2l.shape[0], R, E) or cnt.shape != ch.shape:
        raise ZeppInputError(f"{p}: choices and counts must both be [layers, ep_size, experts, m] = "
                             f"{[p2l.shape[0], R, E, 'm']}; got {ch.shape} and {cnt.shape}")
    total = cnt.sum(3)
    if not np.isin(total, (1, W)).all() or ((cnt > 0) & (ch < 0)).any() or (ch[..., 0] < 0).any():
        raise ZeppInputError(f"{p}: each (layer, rank, expert) row needs its first choice and counts that sum to 1 "
                             f"(one copy) or to width {W}")
    _served_by_copies(ch.transpose(1, 0, 2, 3), p2l, p, "choices")
    return {"gpus_per_node": L, "relaxation": float(rel), "objective": obj["objective"], "width": W, "choices": ch,
            "counts": cnt}
