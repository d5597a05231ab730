"""SGLang expert-location files.

SGLang's ``--init-expert-location`` accepts a ``.json`` or ``.pt`` holding either
``physical_to_logical_map [layers, P]`` (the logical expert in each physical slot; slots are
rank-major, ``P = ranks * slots_per_rank``) or ``logical_count [layers, E]`` (a load histogram
it plans its own placement from). The dict is passed to a function as keyword arguments, so it
holds exactly one key; ``layers`` is the model's ``num_hidden_layers`` (dense rows exist and are
never used: zepp writes SGLang's trivial row ``arange(P) % E`` there); every logical expert
appears in every row; ``P = E + --ep-num-redundant-experts`` is divisible by the EP size
(checked against ``sglang/srt/eplb/expert_location.py`` of SGLang 0.5.23:
``compute_initial_expert_location_metadata`` and ``init_by_mapping``).

Its expert distribution recorder dumps are read by :func:`zepp.interop.history.read_history`.
zepp's :class:`~zepp.planner.types.Placement` ``slot_expert [R, S]`` is one layer's row, slot
``r * S + s`` at row ``r``, column ``s``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.formats import read_load_histogram, read_trace
from zepp.traces.formats.files import describe_keys
from zepp.interop.common import check_rows, load_obj, save_json
from zepp.planner.types import Placement

__all__ = [
    "placement_to_physical_map", "write_init_expert_location", "read_placement", "write_logical_count",
    "read_load_histogram", "read_trace", "write_engine", "read_engine", "check_file_object",
]

KEY = "physical_to_logical_map"


def placement_to_physical_map(placement: Placement, layers: int = 1) -> np.ndarray:
    """``physical_to_logical_map [layers, R * S]`` int64, the same placement on every layer.

    SGLang needs every physical slot filled; a placement with empty (``-1``) slots is refused.
    """
    se = placement.slot_expert
    empty = np.argwhere(se < 0)
    if empty.size:
        r, s = empty[0]
        raise ZeppInputError(
            f"placement has {len(empty)} empty slot(s) (first: rank {r}, slot {s}); SGLang needs every "
            f"physical slot to hold an expert: plan with extra slots that divide evenly, or fill them"
        )
    if isinstance(layers, bool) or int(layers) != layers or layers < 1:
        raise ZeppInputError(f"layers must be a positive integer, got {layers!r}")
    return np.tile(se.reshape(1, -1).astype(np.int64), (int(layers), 1))


def write_init_expert_location(path, placement: Placement, layers: int = 1) -> None:
    """Write ``{"physical_to_logical_map": [layers, P]}`` for ``--init-expert-location``
    (``.json`` or ``.pt`` by suffix)."""
    _write(Path(path), {KEY: placement_to_physical_map(placement, layers)})


def write_logical_count(path, hist: np.ndarray, layers: int = 1) -> None:
    """Write ``{"logical_count": [layers, E]}`` (a per-expert load histogram ``hist [E]`` or
    ``[layers, E]``) for ``--init-expert-location``."""
    h = np.asarray(hist)
    if h.ndim == 1:
        h = np.tile(h[None, :], (int(layers), 1))
    if h.ndim != 2 or not np.issubdtype(h.dtype, np.number) or np.any(h < 0):
        raise ZeppInputError(f"logical_count must be non-negative [E] or [layers, E], got shape {h.shape}")
    _write(Path(path), {"logical_count": h.astype(np.int64)})


def _write(p: Path, data: dict) -> None:
    suffix = p.suffix.lower()
    if suffix == ".json":
        save_json(p, {k: v.tolist() for k, v in data.items()})
    elif suffix in (".pt", ".pth"):
        import torch

        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in data.items()}, p)
    else:
        raise ZeppInputError(f"{p}: unknown suffix {suffix!r}; SGLang reads .json or .pt expert-location files")


def check_file_object(obj, source: str, num_layers: int, num_experts: int, ep_size: int) -> np.ndarray:
    """Every rule SGLang applies when it loads ``--init-expert-location`` with a
    ``physical_to_logical_map``; returns the map ``[num_layers, P]`` int64."""
    if not isinstance(obj, dict) or KEY not in obj:
        raise ZeppInputError(f"{source}: no {KEY!r} (found {describe_keys(obj)})")
    extra = [k for k in obj if k != KEY]
    if extra:
        raise ZeppInputError(f"{source}: holds keys besides {KEY!r} ({describe_keys({k: 0 for k in extra})}); SGLang "
                             f"passes the dict as keyword arguments, so no other key may be present")
    m = check_rows(obj[KEY], source, KEY, num_experts, ep_size)
    if m.shape[0] != num_layers:
        raise ZeppInputError(f"{source}: {KEY} has {m.shape[0]} rows; SGLang needs one per model layer "
                             f"({num_layers}, dense layers included)")
    return m


def write_engine(path, ep) -> None:
    """Write an :class:`~zepp.interop.layers.EnginePlacement` for ``--init-expert-location``
    (``.json`` or ``.pt``): exactly ``{"physical_to_logical_map": [num_layers, P]}``."""
    m = ep.full_map()
    check_file_object({KEY: m}, str(path), ep.model.num_layers, ep.model.num_experts, ep.ranks)
    _write(Path(path), {KEY: m})


def read_engine(path, spec, nodes: int, gpus_per_node: int):
    """The :class:`~zepp.interop.layers.EnginePlacement` of an SGLang expert-location file
    (MoE layers of ``spec``; dense rows are checked but not kept)."""
    from zepp.interop.layers import EnginePlacement

    p, obj = load_obj(path, (".json", ".pt"))
    m = check_file_object(obj, str(p), spec.num_layers, spec.num_experts, nodes * gpus_per_node)
    return EnginePlacement(spec, nodes, gpus_per_node, m.shape[1], {l: m[l] for l in spec.moe_layers}, "file")


def read_placement(path, num_experts: int, ranks: int, gpus_per_node: int, layer: int = 0) -> Placement:
    """A :class:`Placement` from an SGLang (or vLLM) ``physical_to_logical_map [layers, P]``
    file (``.json``, ``.pt`` or ``.npz``); ``P`` must be a multiple of ``ranks``. Float slots
    are refused (never truncated)."""
    from zepp.traces.formats.arrays import npz_load

    p = Path(path)
    if p.suffix.lower() == ".npz":
        from zepp.traces.formats.files import input_file

        obj = npz_load(input_file(p, "expert-location file", ".json, .pt or .npz"))
    else:
        p, obj = load_obj(p, (".json", ".pt"))
    if not isinstance(obj, dict) or KEY not in obj:
        raise ZeppInputError(f"{p}: no {KEY!r} (found {describe_keys(obj)})")
    from zepp.traces.formats.arrays import int_array

    m = int_array(obj[KEY], f"{p}: {KEY}", "logical expert ids", lo=0, hi=num_experts)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2:
        raise ZeppInputError(f"{p}: {KEY} must be [layers, P], got shape {m.shape}")
    if not -m.shape[0] <= layer < m.shape[0]:
        raise ZeppInputError(f"{p}: has {m.shape[0]} layers; layer={layer} is out of range")
    row = m[layer]
    if row.size % ranks:
        raise ZeppInputError(
            f"{p}: {row.size} physical slots do not split evenly over {ranks} ranks; pass the rank count "
            f"the map was made for"
        )
    return Placement(row.reshape(ranks, -1).astype(np.int32), int(num_experts), int(gpus_per_node))
