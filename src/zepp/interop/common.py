"""What the engine placement formats share: the rules every map obeys, reading and writing files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import input_file, read_json, read_yaml
from zepp.traces.formats.arrays import int_array, to_numpy, torch_load

__all__ = ["check_rows", "load_obj", "save_json"]


def check_rows(m, source: str, what: str, num_experts: int, ep_size: int, layer_names=None) -> np.ndarray:
    """``m [layers, P]`` of logical ids: integers (no floats, never truncated), in ``[0, E)``,
    ``P`` divisible by ``ep_size``, every expert at least once per row. Returns int64."""
    a = int_array(m, f"{source}: {what}", "logical expert ids", lo=0, hi=num_experts)
    if a.ndim != 2:
        raise ZeppInputError(f"{source}: {what} must be [layers, physical experts], got shape {a.shape}")
    if a.shape[1] % ep_size:
        raise ZeppInputError(f"{source}: {what} has {a.shape[1]} physical experts per layer, not divisible by the "
                             f"{ep_size} GPUs")
    if a.shape[1] < num_experts:
        raise ZeppInputError(f"{source}: {what} has {a.shape[1]} physical experts, fewer than the {num_experts} "
                             f"logical ones")
    present = np.zeros((a.shape[0], num_experts), dtype=bool)
    present[np.arange(a.shape[0])[:, None], a] = True
    if not present.all():
        li, e = np.argwhere(~present)[0]
        name = layer_names[li] if layer_names is not None else li
        raise ZeppInputError(f"{source}: {what}: layer {name} has no copy of expert {e}; every logical expert must "
                             f"appear at least once in every layer")
    return a


def load_obj(path, kinds: tuple[str, ...]):
    """Parse a ``.json`` / ``.pt`` / ``.yaml`` file into Python objects (tensors become arrays)."""
    p = input_file(path, "placement file", ", ".join(kinds))
    suffix = p.suffix.lower()
    if suffix == ".json" and ".json" in kinds:
        return p, read_json(p, "placement file", ", ".join(kinds))
    if suffix in (".pt", ".pth") and ".pt" in kinds:
        obj = torch_load(p)
        if isinstance(obj, dict):
            obj = {k: (to_numpy(v, f"{p}: {k}") if hasattr(v, "detach") else v) for k, v in obj.items()}
        return p, obj
    if suffix in (".yaml", ".yml") and ".yaml" in kinds:
        return p, read_yaml(p, "placement file", ", ".join(kinds))
    raise ZeppInputError(f"{p}: unknown suffix {suffix!r}; this format is read from {', '.join(kinds)}")


def save_json(p: Path, obj) -> None:
    try:
        p.write_text(json.dumps(obj, separators=(",", ":")) + "\n")
    except OSError as exc:
        raise ZeppInputError(f"{p}: cannot write it ({exc.strerror or type(exc).__name__})") from None
