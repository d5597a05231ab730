"""SGLang expert-location files.

SGLang's ``--init-expert-location`` accepts a ``.json`` or ``.pt`` holding either
``physical_to_logical_map [layers, P]`` (the logical expert in each physical slot; slots are
rank-major, ``P = ranks * slots_per_rank``) or ``logical_count [layers, E]`` (a load histogram
it plans its own placement from). Its expert distribution recorder dumps ``logical_count
[steps, layers, E]`` (stat mode) and ``topk_ids_of_layer [layers, T, k]`` (per_token mode);
:func:`zepp.trace.read_load_histogram` and :func:`zepp.trace.read_trace` read those.

zepp's :class:`~zepp.plan.Placement` ``slot_expert [R, S]`` is the same map for one layer with
slot ``r * S + s`` at row ``r``, column ``s``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.plan import Placement
from zepp.trace import read_load_histogram, read_trace

__all__ = [
    "placement_to_physical_map", "write_init_expert_location", "read_placement", "write_logical_count",
    "read_load_histogram", "read_trace",
]


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
    p = Path(path)
    m = placement_to_physical_map(placement, layers)
    _write(p, {"physical_to_logical_map": m})


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
        p.write_text(json.dumps({k: v.tolist() for k, v in data.items()}))
    elif suffix in (".pt", ".pth"):
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in data.items()}, p)
    else:
        raise ZeppInputError(f"{p}: unknown suffix {suffix!r}; SGLang reads .json or .pt expert-location files")


def read_placement(path, num_experts: int, ranks: int, gpus_per_node: int, layer: int = 0) -> Placement:
    """A :class:`Placement` from an SGLang (or vLLM) ``physical_to_logical_map [layers, P]``
    file (``.json``, ``.pt`` or ``.npz``); ``P`` must be a multiple of ``ranks``."""
    p = Path(path)
    if not p.is_file():
        raise ZeppInputError(f"expert-location file {str(p)!r} does not exist")
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            obj = json.loads(p.read_text())
        elif suffix in (".pt", ".pth"):
            import torch

            obj = torch.load(p, map_location="cpu", weights_only=True)
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                obj = {k: z[k] for k in z.files}
        else:
            raise ZeppInputError(f"{p}: unknown suffix {suffix!r}; use .json, .pt or .npz")
    except ZeppInputError:
        raise
    except Exception as exc:
        raise ZeppInputError(f"{p}: cannot read it ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or "physical_to_logical_map" not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise ZeppInputError(f"{p}: no 'physical_to_logical_map' (found {keys})")
    m = obj["physical_to_logical_map"]
    m = np.asarray(m.numpy() if hasattr(m, "numpy") else m)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2:
        raise ZeppInputError(f"{p}: physical_to_logical_map must be [layers, P], got shape {m.shape}")
    if not -m.shape[0] <= layer < m.shape[0]:
        raise ZeppInputError(f"{p}: has {m.shape[0]} layers; layer={layer} is out of range")
    row = m[layer]
    if row.size % ranks:
        raise ZeppInputError(
            f"{p}: {row.size} physical slots do not split evenly over {ranks} ranks; pass the rank count "
            f"the map was made for"
        )
    return Placement(row.reshape(ranks, -1).astype(np.int32), int(num_experts), int(gpus_per_node))
