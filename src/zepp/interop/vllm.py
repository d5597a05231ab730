"""vLLM EPLB maps (``.pt``) and the vLLM-Ascend placement JSON.

vLLM keeps, per MoE layer (``L`` = MoE layers only), ``physical_to_logical_map [L, P]``,
``logical_to_physical_map [L, E, redundant + 1]`` (-1 padded, replicas in ascending physical
index) and ``logical_replica_count [L, E]`` (``vllm/distributed/eplb/eplb_state.py`` of vLLM
0.33.0). Mainline vLLM has no file to load them from: the ``.pt`` holds exactly these three
tensors, for a patch or plugin that sets its EPLB state. The Ascend plugin reads
``{"moe_layer_count": L, "layer_list": [{"layer_id": l, "device_count": D, "device_list":
[{"device_id": d, "device_expert": [expert ids]}]}]}``; ``layer_id`` here is the MoE layer's
ordinal (0 = first MoE layer).

What vLLM records, read by :func:`read_load_window`: its EPLB load window
``expert_load_window [W, L, P]`` (physical experts, MoE layers only) saved with
``physical_to_logical_map [L, P]`` (``.pt`` or ``.npz``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import describe_keys
from zepp.interop.base_history import HistoryRequest
from zepp.interop.common import check_rows, load_obj, save_json
from zepp.traces.formats.arrays import int_array, whole_counts
from zepp.traces.layer_history import LayerHistory, bin_steps

__all__ = ["load_hint", "maps_of", "write_engine", "read_engine", "check_maps", "MAP_KEYS", "is_load_window",
           "read_load_window"]

MAP_KEYS = ("physical_to_logical_map", "logical_to_physical_map", "logical_replica_count")


def maps_of(p2l: np.ndarray, num_experts: int, redundant: int) -> dict[str, np.ndarray]:
    """The three maps from ``physical_to_logical_map [L, P]`` (vectorised)."""
    n_l, p = p2l.shape
    count = np.zeros((n_l, num_experts), dtype=np.int64)
    np.add.at(count, (np.arange(n_l)[:, None], p2l), 1)
    width = redundant + 1
    l2p = np.full((n_l, num_experts, width), -1, dtype=np.int64)
    order = np.argsort(p2l, axis=1, kind="stable")  # physical ids grouped by expert, ascending
    sorted_e = np.take_along_axis(p2l, order, axis=1)
    starts = np.concatenate([np.zeros((n_l, 1), dtype=np.int64), np.cumsum(count, axis=1)[:, :-1]], axis=1)
    rank = np.arange(p)[None, :] - np.take_along_axis(starts, sorted_e, axis=1)
    li = np.broadcast_to(np.arange(n_l)[:, None], (n_l, p))
    l2p[li, sorted_e, rank] = order
    return {"physical_to_logical_map": p2l.astype(np.int64), "logical_to_physical_map": l2p,
            "logical_replica_count": count}


def check_maps(obj, source: str, spec, ep_size: int) -> np.ndarray:
    """The three maps agree with each other and the rules; returns ``physical_to_logical_map``."""
    if not isinstance(obj, dict) or any(k not in obj for k in MAP_KEYS):
        raise ZeppInputError(f"{source}: needs the keys {', '.join(MAP_KEYS)} (found {describe_keys(obj)})")
    extra = [k for k in obj if k not in MAP_KEYS]
    if extra:
        raise ZeppInputError(f"{source}: unexpected key(s) {describe_keys({k: 0 for k in extra})}")
    p2l = check_rows(obj["physical_to_logical_map"], source, "physical_to_logical_map", spec.num_experts, ep_size)
    if p2l.shape[0] != len(spec.moe_layers):
        raise ZeppInputError(f"{source}: {p2l.shape[0]} layers; vLLM keeps one row per MoE layer "
                             f"({len(spec.moe_layers)} for {spec.name!r})")
    l2p = int_array(obj["logical_to_physical_map"], f"{source}: logical_to_physical_map", "physical ids", lo=-1,
                    hi=p2l.shape[1])
    cnt = int_array(obj["logical_replica_count"], f"{source}: logical_replica_count", "counts", lo=1,
                    hi=p2l.shape[1] + 1)
    want = maps_of(p2l, spec.num_experts, p2l.shape[1] - spec.num_experts)
    for k, a in (("logical_to_physical_map", l2p), ("logical_replica_count", cnt)):
        if a.shape != want[k].shape or not np.array_equal(a, want[k]):
            raise ZeppInputError(f"{source}: {k} disagrees with physical_to_logical_map (shape {a.shape}, expected "
                                 f"{want[k].shape}); write the three maps together")
    return p2l


def _ascend(ep) -> dict:
    layers = sorted(ep.maps)
    s = ep.slots_per_gpu
    return {"moe_layer_count": len(layers), "layer_list": [
        {"layer_id": i, "device_count": ep.ranks, "device_list": [
            {"device_id": d, "device_expert": ep.maps[l][d * s:(d + 1) * s].astype(int).tolist()}
            for d in range(ep.ranks)]}
        for i, l in enumerate(layers)]}


def _check_ascend(obj, source: str, spec, ep_size: int) -> np.ndarray:
    def need(d, key, kind, where):
        v = d.get(key) if isinstance(d, dict) else None
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)) or kind is list and not isinstance(v, list):
            raise ZeppInputError(f"{source}: {where}field {key!r} must be {'an integer' if kind is int else 'a list'}, "
                                 f"got {v!r}"[:300])
        return v

    n = need(obj, "moe_layer_count", int, "")
    lst = need(obj, "layer_list", list, "")
    if n != len(lst) or n != len(spec.moe_layers):
        raise ZeppInputError(f"{source}: moe_layer_count {n}, layer_list has {len(lst)} entries, model "
                             f"{spec.name!r} has {len(spec.moe_layers)} MoE layers")
    rows = []
    for i, layer in enumerate(lst):
        if need(layer, "layer_id", int, f"layer_list[{i}]: ") != i:
            raise ZeppInputError(f"{source}: layer_list[{i}]: layer_id {layer['layer_id']} (expected {i}, in order)")
        if need(layer, "device_count", int, f"layer_list[{i}]: ") != ep_size:
            raise ZeppInputError(f"{source}: layer_list[{i}]: device_count {layer['device_count']}, EP size {ep_size}")
        devs = need(layer, "device_list", list, f"layer_list[{i}]: ")
        if len(devs) != ep_size:
            raise ZeppInputError(f"{source}: layer_list[{i}]: {len(devs)} devices, EP size {ep_size}")
        row = []
        for d, dev in enumerate(devs):
            if need(dev, "device_id", int, f"layer_list[{i}].device_list[{d}]: ") != d:
                raise ZeppInputError(f"{source}: layer_list[{i}].device_list[{d}]: device_id out of order")
            row.append(need(dev, "device_expert", list, f"layer_list[{i}].device_list[{d}]: "))
        if len({len(r) for r in row}) != 1:
            raise ZeppInputError(f"{source}: layer_list[{i}]: devices hold different expert counts; every device "
                                 f"must hold the same number")
        rows.append([e for r in row for e in r])
    return check_rows(rows, source, "device_expert", spec.num_experts, ep_size)


def write_engine(path, ep) -> None:
    """``.pt``: the three EPLB maps; ``.json``: the Ascend placement file."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        d = _ascend(ep)
        _check_ascend(d, str(p), ep.model, ep.ranks)
        save_json(p, d)
        return
    if p.suffix.lower() not in (".pt", ".pth"):
        raise ZeppInputError(f"--out {p}: vLLM placements are .pt (EPLB maps) or .json (vLLM-Ascend)")
    import torch

    p2l = np.stack([ep.maps[l] for l in sorted(ep.maps)])
    maps = maps_of(p2l, ep.model.num_experts, ep.redundant)
    check_maps(maps, str(p), ep.model, ep.ranks)
    try:
        torch.save({k: torch.from_numpy(v) for k, v in maps.items()}, p)
    except OSError as exc:
        raise ZeppInputError(f"{p}: cannot write it ({exc.strerror or type(exc).__name__})") from None


def read_engine(path, spec, nodes: int, gpus_per_node: int):
    from zepp.interop.layers import EnginePlacement

    p, obj = load_obj(path, (".pt", ".json"))
    ranks = nodes * gpus_per_node
    m = _check_ascend(obj, str(p), spec, ranks) if p.suffix.lower() == ".json" else check_maps(obj, str(p), spec, ranks)
    return EnginePlacement(spec, nodes, gpus_per_node, m.shape[1],
                           {l: m[i] for i, l in enumerate(spec.moe_layers)}, "file")


def load_hint(out: str, ep) -> str:
    """How vLLM (``.pt``) or vLLM-Ascend (``.json``) is given the file ``out`` of ``ep``."""
    if out.lower().endswith(".json"):
        return f"vLLM-Ascend: give {out} as the expert placement file (EP size {ep.ranks})"
    return (f"vLLM: {out} holds physical_to_logical_map, logical_to_physical_map and logical_replica_count per "
            f"MoE layer for its EPLB state (num_redundant_experts={ep.redundant}; mainline vLLM has no loader: zepp's "
            f"vllm.general_plugins entry point applies this placement from the table file beside it)")


# ---------------------------------------------------------------- what vLLM records


def is_load_window(obj) -> bool:
    return isinstance(obj, dict) and "expert_load_window" in obj


def read_load_window(p: Path, obj: dict, req: HistoryRequest) -> LayerHistory:
    """Counts form from ``expert_load_window [W, L, P]``: physical counts summed per logical
    expert, the window's steps grouped into bins; no source ranks."""
    if "physical_to_logical_map" not in obj:
        raise ZeppInputError(f"{p}: has 'expert_load_window' but no 'physical_to_logical_map'; save both "
                             f"(the window counts physical experts)")
    w = whole_counts(obj["expert_load_window"], f"{p}: expert_load_window")
    m = int_array(obj["physical_to_logical_map"], f"{p}: physical_to_logical_map", "logical ids", lo=-1,
                  hi=req.experts)
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3 or m.ndim != 2 or w.shape[1:] != m.shape:
        raise ZeppInputError(f"{p}: expert_load_window must be [W, L, P] and physical_to_logical_map [L, P]; got "
                             f"{w.shape} and {m.shape}")
    e = req.experts or int(m.max()) + 1
    missing = [(li, int(np.setdiff1d(np.arange(e), row)[0])) for li, row in enumerate(m)
               if np.setdiff1d(np.arange(e), row).size]
    if missing:
        raise ZeppFileError(f"layer {missing[0][0]} has no slot of expert {missing[0][1]} ({m.shape[1]} physical slots, "
                            f"{e} experts)", p, "physical_to_logical_map", "give the map the window was recorded with")
    n_l = m.shape[0]
    logical = np.zeros((w.shape[0], n_l, e), dtype=np.int64)
    lidx, pidx = np.nonzero(m >= 0)
    np.add.at(logical, (slice(None), lidx, m[lidx, pidx]), w[:, lidx, pidx])
    spec = req.spec
    if spec is not None and n_l != len(spec.moe_layers):
        raise ZeppInputError(f"{p}: {n_l} MoE layers, model {spec.name!r} has {len(spec.moe_layers)}")
    layers = spec.moe_layers if spec is not None else tuple(range(n_l))
    c = bin_steps(logical, 0).transpose(1, 0, 2)[:, :, None, :]
    return LayerHistory(str(p), "vllm", e, req.k, tuple(layers), counts=c, sources="none",
                        notes=("vLLM's window holds one rank's view (or the all-reduced sum): no source ranks",))
