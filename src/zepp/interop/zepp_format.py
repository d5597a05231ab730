"""zepp's own placement file (JSON): every MoE layer's ``slot_expert [R, S]`` with its cluster.

``{"format": "zepp-placement/1", "model": name, "num_experts": E, "num_layers": layers,
"nodes": N, "gpus_per_node": L, "num_physical": P, "policy": name,
"layers": {"<model layer>": [[S expert ids] per GPU]}}``.

What zepp records, read by :func:`read_recorder`: the serving recorder's folder (``zepp generate
--record``, ``zepp.serve.rank.write_record``): ``layer_{i:03d}.txt`` (the text format, every
token of MoE layer ``i``, counted from 0 = the model's first MoE layer, in recorded order) and
``load.json`` (``{"logical_count": [MoE layers][E], "experts": E, "top_k": k, "layers": M}``;
read when there are no layer files). One text trace (``../shared/traces``) is read by
:func:`read_text_trace` as one layer that stands for every MoE layer.
"""

from __future__ import annotations

import re
from pathlib import Path

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import read_json
from zepp.interop.base_history import HistoryRequest
from zepp.interop.common import check_rows, load_obj, save_json
from zepp.traces.formats.arrays import whole_counts
from zepp.traces.formats.trace_files import read_trace
from zepp.traces.layer_history import LayerHistory
from zepp.traces.trace import Trace

__all__ = ["load_hint", "write_engine", "read_engine", "FORMAT", "has_layer_files", "read_recorder", "read_text_trace"]

FORMAT = "zepp-placement/1"


def write_engine(path, ep) -> None:
    s = ep.slots_per_gpu
    save_json(Path(path), {
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


def load_hint(out: str, ep) -> str:
    """How zepp reads the file ``out`` of ``ep`` back."""
    return f"zepp: zepp.interop.read_placement_file({out!r}, 'zepp', spec, {ep.nodes}, {ep.gpus_per_node})"


# ---------------------------------------------------------------- what zepp records


_LAYER_FILE = re.compile(r"^layer_(\d{3,})\.txt$")


def _layer_files(d: Path) -> list[tuple[int, Path]]:
    """``[(MoE layer ordinal, file)]`` of the ``layer_NNN.txt`` files in ``d``, in order."""
    return sorted((int(m.group(1)), f) for f in d.iterdir() if (m := _LAYER_FILE.match(f.name)))


def has_layer_files(d: Path) -> bool:
    return any(_LAYER_FILE.match(f.name) for f in d.iterdir())


def read_text_trace(p: Path, req: HistoryRequest) -> LayerHistory:
    """One text trace: one layer, its placement used for every MoE layer."""
    t = read_trace(p, num_experts=req.experts, top_k=req.k, allow_duplicates=req.allow_duplicates)
    return LayerHistory(str(p), "text", t.num_experts, t.top_k, None, (t,), token_ranks=(None,),
                        notes=("one layer's trace: its placement is used for every MoE layer",))


def read_recorder(d: Path, req: HistoryRequest) -> LayerHistory:
    """The recorder's folder ``d``: its layer files (tokens form), else its ``load.json`` (counts)."""
    files = _layer_files(d)
    if files:
        return _layer_file_history(d, files, req)
    load_p = d / "load.json"
    if not load_p.exists():
        raise ZeppInputError(f"{d}: no layer_NNN.txt files and no load.json; a zepp recorder folder holds "
                             f"layer_{{i:03d}}.txt (one per MoE layer) and load.json")
    return _load_json_history(d, load_p, req)


def _ordinals_to_layers(d: Path, req: HistoryRequest, ordinals: list[int], what: str) -> tuple[int, ...]:
    """Model layer index of each MoE layer ordinal (the recorder counts MoE layers from 0)."""
    spec = req.spec
    if spec is None:
        return tuple(ordinals)
    bad = [i for i in ordinals if i >= len(spec.moe_layers)]
    if bad:
        raise ZeppInputError(f"{d}: {what} {bad[0]} but model {spec.name!r} has {len(spec.moe_layers)} MoE layers "
                             f"(recorder files count MoE layers from 0)")
    return tuple(spec.moe_layers[i] for i in ordinals)


def _layer_file_history(d: Path, files: list[tuple[int, Path]], req: HistoryRequest) -> LayerHistory:
    e = req.experts
    traces = [read_trace(f, num_experts=e, top_k=req.k, allow_duplicates=req.allow_duplicates) for _, f in files]
    layers = _ordinals_to_layers(d, req, [i for i, _ in files], "layer_NNN.txt index")
    e = e or max(t.num_experts for t in traces)
    traces = tuple(Trace(t.topk_ids, e, t.source) for t in traces)
    if (d / "load.json").exists():  # what the recorder wrote beside the traces must agree with them
        _agrees_with_traces(d / "load.json", _read_load_json(d / "load.json"), traces, [i for i, _ in files])
    return LayerHistory(str(d), "zepp-recorder", e, traces[0].top_k, layers, traces, sources="none",
                        token_ranks=tuple(None for _ in traces))


# load.json's fields (``zepp.serve.rank.write_record``): {name: what it must be}
LOAD_KEYS = {"logical_count": "[MoE layers][experts] entry counts", "experts": "a positive integer",
             "top_k": "a positive integer, at most experts", "layers": "the MoE layer count (logical_count's rows)",
             "system": "the system's name", "nodes": "a positive integer", "gpus_per_node": "a positive integer"}


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _read_load_json(load_p: Path) -> dict:
    """``load.json`` checked field by field and against itself: ``{"counts": [M, E] int64,
    "experts", "top_k" (or None), "layers"}``."""
    obj = read_json(load_p, "load.json")
    if not isinstance(obj, dict) or "logical_count" not in obj:
        raise ZeppInputError(f"{load_p}: field 'logical_count' ([MoE layers][experts] entry counts) is missing")
    unknown = [k for k in obj if k not in LOAD_KEYS]
    if unknown:
        raise ZeppFileError(f"unknown field {unknown[0]!r}"[:80], load_p, repr(unknown[0])[:60],
                            f"load.json holds {', '.join(LOAD_KEYS)}")
    c = whole_counts(obj["logical_count"], f"{load_p}: logical_count")
    if c.ndim != 2 or 0 in c.shape:
        raise ZeppInputError(f"{load_p}: field 'logical_count' must be [MoE layers][experts], got shape {c.shape}")
    fe = obj.get("experts", c.shape[1])
    if isinstance(fe, bool) or not isinstance(fe, int) or fe != c.shape[1]:
        raise ZeppInputError(f"{load_p}: field 'experts' is {fe!r}, logical_count has {c.shape[1]} columns")
    fk = obj.get("top_k")
    if fk is not None and not (_positive(fk) and fk <= fe):
        raise ZeppFileError(f"top_k must be a positive integer at most the {fe} experts, got {fk!r}", load_p, "'top_k'",
                            "give the model's top-k")
    for key, want in (("layers", c.shape[0]), ("nodes", None), ("gpus_per_node", None)):
        v = obj.get(key, want)
        if v is not None and not (_positive(v) and (want is None or v == want)):
            raise ZeppFileError(f"{key} is {v!r}" + (f", logical_count has {want} rows" if want else ", not a "
                                "positive integer"), load_p, repr(key), "fix or remove load.json")
    if not isinstance(obj.get("system", ""), str):
        raise ZeppFileError("system must be a name", load_p, "'system'", "fix or remove load.json")
    return {"counts": c, "experts": fe, "top_k": fk, "layers": c.shape[0]}


def _agrees_with_traces(load_p: Path, load: dict, traces: tuple, ordinals: list[int]) -> None:
    """The recorder's ``load.json`` and its layer files describe one recording."""
    t = traces[0]
    for field, mine, theirs in (("'layers'", load["layers"], max(ordinals) + 1), ("'experts'", load["experts"],
                                t.num_experts), ("'top_k'", load["top_k"] or t.top_k, t.top_k)):
        if mine != theirs:
            raise ZeppFileError(f"load.json says {mine}, the layer_NNN.txt files {theirs}", load_p, field,
                                "the folder mixes two recordings: record again, or remove load.json")


def _load_json_history(d: Path, load_p: Path, req: HistoryRequest) -> LayerHistory:
    e, k = req.experts, req.k
    load = _read_load_json(load_p)
    c, fe = load["counts"], load["experts"]
    if e is not None and fe != e:
        raise ZeppInputError(f"{load_p}: {fe} experts, the model {e}")
    fk = load["top_k"] if load["top_k"] is not None else k
    if k is not None and fk != k:
        raise ZeppFileError(f"top_k is {fk}, the model's top-{k}", load_p, "'top_k'", "use the model it was recorded with")
    layers = _ordinals_to_layers(d, req, list(range(c.shape[0])), "logical_count row")
    return LayerHistory(str(d), "zepp-recorder", fe, fk, layers, counts=c[:, None, None, :], sources="none",
                        notes=("load.json sums over ranks: no source ranks",))
