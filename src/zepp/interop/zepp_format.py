"""zepp's own placement file (JSON): every MoE layer's ``slot_expert [R, S]`` with its cluster.

``{"format": "zepp-placement/1", "model": name, "num_experts": E, "num_layers": layers,
"nodes": N, "gpus_per_node": L, "num_physical": P, "policy": name,
"layers": {"<model layer>": [[S expert ids] per GPU]}}``.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError
from zepp.interop.common import check_rows, load_obj, save_json

__all__ = ["write_engine", "read_engine", "FORMAT"]

FORMAT = "zepp-placement/1"


def write_engine(path, ep) -> None:
    s = ep.slots_per_gpu
    save_json(__import__("pathlib").Path(path), {
        "format": FORMAT, "model": ep.model.name, "num_experts": ep.model.num_experts,
        "num_layers": ep.model.num_layers, "nodes": ep.nodes, "gpus_per_node": ep.gpus_per_node,
        "num_physical": ep.num_physical, "policy": ep.policy,
        "layers": {str(l): ep.maps[l].reshape(-1, s).astype(int).tolist() for l in sorted(ep.maps)}})


def read_engine(path, spec, nodes: int, gpus_per_node: int):
    from zepp.interop.layers import EnginePlacement

    p, obj = load_obj(path, (".json",))
    src = str(p)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ZeppInputError(f"{src}: field 'format' must be {FORMAT!r}")
    for key, want in (("num_experts", spec.num_experts), ("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if obj.get(key) != want:
            raise ZeppInputError(f"{src}: field {key!r} is {obj.get(key)!r}, expected {want}")
    layers = obj.get("layers")
    if not isinstance(layers, dict) or not layers:
        raise ZeppInputError(f"{src}: field 'layers' must map model layer index to [[expert ids] per GPU]")
    keys = []
    for k in layers:
        if not str(k).isdigit() or int(k) not in spec.moe_layers:
            raise ZeppInputError(f"{src}: layers key {k!r} is not a MoE layer of {spec.name!r}")
        keys.append(int(k))
    keys.sort()
    rows = []
    for k in keys:
        v = layers[str(k)]
        if not isinstance(v, list) or len(v) != nodes * gpus_per_node or len({len(r) if isinstance(r, list) else -1
                                                                           for r in v}) != 1:
            raise ZeppInputError(f"{src}: layers['{k}'] must be {nodes * gpus_per_node} lists of equal length")
        rows.append([e for r in v for e in r])
    m = check_rows(rows, src, "layers", spec.num_experts, nodes * gpus_per_node, layer_names=keys)
    if obj.get("num_physical") != m.shape[1]:
        raise ZeppInputError(f"{src}: field 'num_physical' is {obj.get('num_physical')!r}, the layers hold {m.shape[1]}")
    return EnginePlacement(spec, nodes, gpus_per_node, m.shape[1], {k: m[i] for i, k in enumerate(keys)},
                           str(obj.get("policy", "file")))
