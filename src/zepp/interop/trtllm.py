"""TensorRT-LLM wide-EP load-balancer files (``moe_config: {backend: WideEP, load_balancer: PATH}``).

The YAML holds ``num_slots`` (physical experts in total, divisible by the EP size),
``initial_global_assignments`` (``{layer index: [num_slots expert ids]}``, MoE layers only,
keyed by their index in the model; slots ``r * num_slots / ep_size ...`` belong to rank ``r``;
every expert at least once per layer) and ``layer_updates_per_iter`` (``0``: static). These are
the rules of ``../shared/INTEROP.md``; TensorRT-LLM's own code could not be installed here to
check against. Its expert statistics are read by :func:`zepp.interop.history.read_history`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.formats.files import describe_keys
from zepp.interop.common import check_rows, load_obj

__all__ = ["write_engine", "read_engine", "check_file_object", "KEYS"]

KEYS = ("num_slots", "initial_global_assignments", "layer_updates_per_iter")


def _as_dict(ep) -> dict:
    return {
        "num_slots": int(ep.num_physical),
        "layer_updates_per_iter": 0,
        "initial_global_assignments": {int(l): ep.maps[l].astype(int).tolist() for l in sorted(ep.maps)},
    }


def check_file_object(obj, source: str, spec, ep_size: int) -> tuple[int, dict[int, np.ndarray]]:
    """Every rule of the load-balancer YAML; returns ``(num_slots, {layer: [num_slots]})``."""
    if not isinstance(obj, dict):
        raise ZeppInputError(f"{source}: must be a mapping with {', '.join(KEYS)}; got {type(obj).__name__}")
    unknown = [k for k in obj if k not in KEYS]
    if unknown:
        raise ZeppInputError(f"{source}: unknown field(s) {describe_keys({k: 0 for k in unknown})}; the load "
                             f"balancer reads {', '.join(KEYS)}")
    ns = obj.get("num_slots")
    if isinstance(ns, bool) or not isinstance(ns, int) or ns < spec.num_experts:
        raise ZeppInputError(f"{source}: field 'num_slots' must be an integer >= {spec.num_experts} experts, "
                             f"got {ns!r}")
    if ns % ep_size:
        raise ZeppInputError(f"{source}: num_slots {ns} is not divisible by the EP size {ep_size}")
    upd = obj.get("layer_updates_per_iter", 0)
    if isinstance(upd, bool) or not isinstance(upd, int) or upd < 0:
        raise ZeppInputError(f"{source}: field 'layer_updates_per_iter' must be an integer >= 0, got {upd!r}")
    ga = obj.get("initial_global_assignments")
    if not isinstance(ga, dict) or not ga:
        raise ZeppInputError(f"{source}: field 'initial_global_assignments' must map MoE layer index to "
                             f"{ns} expert ids")
    layers = []
    for k in ga:
        if isinstance(k, bool) or not isinstance(k, int):
            raise ZeppInputError(f"{source}: initial_global_assignments key {k!r} is not a layer index (integer)")
        if k not in spec.moe_layers:
            raise ZeppInputError(f"{source}: initial_global_assignments layer {k} is not a MoE layer of "
                                 f"{spec.name!r} (MoE layers {spec.moe_layers[0]}..{spec.moe_layers[-1]})")
        layers.append(k)
    layers.sort()
    rows = []
    for k in layers:
        v = ga[k]
        if not isinstance(v, list) or len(v) != ns:
            n = len(v) if isinstance(v, list) else type(v).__name__
            raise ZeppInputError(f"{source}: initial_global_assignments[{k}] must list num_slots = {ns} expert "
                                 f"ids, got {n}")
        rows.append(v)
    m = check_rows(rows, f"{source}: initial_global_assignments", "slots", spec.num_experts, ep_size,
                   layer_names=layers)
    return ns, {k: m[i] for i, k in enumerate(layers)}


def write_engine(path, ep) -> None:
    """Write the load-balancer YAML of an :class:`~zepp.interop.layers.EnginePlacement`."""
    import yaml

    d = _as_dict(ep)
    check_file_object(d, str(path), ep.model, ep.ranks)
    text = ("# zepp place: TensorRT-LLM wide-EP load balancer (static placement)\n"
            f"# model {ep.model.name}, {ep.nodes} nodes x {ep.gpus_per_node} GPUs, {ep.redundant} redundant experts, "
            f"policy {ep.policy}\n"
            + yaml.safe_dump(d, default_flow_style=None, sort_keys=False, width=1 << 16))
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise ZeppInputError(f"{path}: cannot write it ({exc.strerror or type(exc).__name__})") from None


def read_engine(path, spec, nodes: int, gpus_per_node: int):
    from zepp.interop.layers import EnginePlacement

    p, obj = load_obj(path, (".yaml",))
    ns, maps = check_file_object(obj, str(p), spec, nodes * gpus_per_node)
    return EnginePlacement(spec, nodes, gpus_per_node, ns, maps, "file")
