"""TensorRT-LLM wide-EP load-balancer files (``moe_config: {backend: WideEP, load_balancer: PATH}``).

The YAML holds ``num_slots`` (physical experts in total, divisible by the EP size),
``initial_global_assignments`` (``{layer index: [num_slots expert ids]}``, MoE layers only,
keyed by their index in the model; slots ``r * num_slots / ep_size ...`` belong to rank ``r``;
every expert at least once per layer) and ``layer_updates_per_iter`` (``0``: static). These are
the rules of ``../shared/INTEROP.md``; TensorRT-LLM's own code could not be installed here to
check against.

What it records (expert statistics: ``EXPERT_STATISTIC_ITER_RANGE``, ``EXPERT_STATISTIC_PATH``),
read by :func:`read_statistics`: a folder with ``meta_info.json`` (``num_experts``,
``num_experts_per_token``) and ``rank{r}.safetensors``, keys ``"{iteration}_{layer}"`` each a
bincount ``[E]``; or ``rank{r}_raw.safetensors``, the selected ids ``[T, k]`` per key.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import describe_keys, read_json, read_safetensors_header
from zepp.files.limits import MAX_TENSOR_FILE_BYTES
from zepp.interop.base_history import HistoryRequest
from zepp.interop.common import check_rows, load_obj
from zepp.traces.formats.arrays import check_ids, int_array, whole_counts
from zepp.traces.layer_history import LayerHistory, bin_steps
from zepp.traces.trace import Trace

__all__ = ["load_hint", "write_engine", "read_engine", "check_file_object", "KEYS", "is_statistics_folder",
           "read_statistics"]

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


def load_hint(out: str, ep) -> str:
    """How TensorRT-LLM is given the file ``out`` of ``ep``."""
    return f"TensorRT-LLM: moe_config: {{backend: WideEP, load_balancer: {out}}} (EP size {ep.ranks})"


# ---------------------------------------------------------------- what TensorRT-LLM records


_RANK_FILE = re.compile(r"^rank(\d+)(_raw)?\.safetensors$")
_KEY = re.compile(r"^(\d+)_(\d+)$")


def is_statistics_folder(d: Path) -> bool:
    return (d / "meta_info.json").exists()


def read_statistics(d: Path, req: HistoryRequest) -> LayerHistory:
    """Every layer's expert statistics of folder ``d`` (per-rank bincounts, or the raw ids when
    ``rank{r}_raw.safetensors`` files are there)."""
    e, k = _meta(d, req)
    files, raw = _rank_files(d)
    per_rank = [_keyed_arrays(files[r]) for r in sorted(files)]
    iters = sorted({it for pr in per_rank for it, _ in pr})
    layer_ids = sorted({ly for pr in per_rank for _, ly in pr})
    spec = req.spec
    if spec is not None:
        bad = [ly for ly in layer_ids if ly not in spec.moe_layers]
        if bad:
            raise ZeppInputError(f"{d}: layer index {bad[0]} is not a MoE layer of model {spec.name!r} "
                                 f"(MoE layers {spec.moe_layers[0]}..{spec.moe_layers[-1]})")
    if raw:
        return _raw_history(d, files, per_rank, iters, layer_ids, e, k, req.allow_duplicates)
    return _count_history(d, files, per_rank, iters, layer_ids, e, k)


def _meta(d: Path, req: HistoryRequest) -> tuple[int, int]:
    """``(experts, top-k)`` of ``meta_info.json``, checked against the model when it is known."""
    meta_p = d / "meta_info.json"
    meta = read_json(meta_p, "TensorRT-LLM meta_info.json")
    for key in ("num_experts", "num_experts_per_token"):
        v = meta.get(key) if isinstance(meta, dict) else None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ZeppInputError(f"{meta_p}: field {key!r} must be a positive integer, got {v!r}")
    e, k = meta["num_experts"], meta["num_experts_per_token"]
    if k > e:
        raise ZeppFileError(f"top-{k} of {e} experts", meta_p, "'num_experts_per_token'",
                            "it must be at most num_experts")
    if req.spec is not None and (e, k) != (req.experts, req.k):
        raise ZeppInputError(f"{meta_p}: {e} experts, top-{k}, but model {req.spec.name!r} has "
                             f"{req.experts} experts, top-{req.k}")
    return e, k


def _rank_files(d: Path) -> tuple[dict[int, Path], bool]:
    """``({rank: file}, raw)``: the raw-id files when there are any, else the bincount files."""
    files: dict[bool, dict[int, Path]] = {}
    for f in sorted(d.iterdir()):
        m = _RANK_FILE.match(f.name)
        if m:
            files.setdefault(bool(m.group(2)), {})[int(m.group(1))] = f
    raw = True in files
    chosen = files.get(True) or files.get(False)
    if not chosen:
        raise ZeppInputError(f"{d}: no rank{{r}}.safetensors or rank{{r}}_raw.safetensors next to meta_info.json")
    ranks = sorted(chosen)
    if ranks != list(range(len(ranks))):
        raise ZeppInputError(f"{d}: rank files {ranks} are not 0..{len(ranks) - 1}; a rank's file is missing")
    return chosen, raw


def _keyed_arrays(f: Path) -> dict[tuple[int, int], np.ndarray]:
    """``{(iteration, layer): array}`` of one rank's file."""
    parsed = {}
    for key, v in _safetensors(f).items():
        km = _KEY.match(key)
        if not km:
            raise ZeppInputError(f"{f}: key {key!r} is not '{{iteration}}_{{layer}}'")
        parsed[(int(km.group(1)), int(km.group(2)))] = v
    return parsed


def _safetensors(p: Path) -> dict[str, np.ndarray]:
    """Every array of one rank's statistics file, its header checked first (``zepp.files``)."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ZeppInputError("reading TensorRT-LLM statistics needs the safetensors package (pip install safetensors)") \
            from None
    read_safetensors_header(p, "TensorRT-LLM statistics file", MAX_TENSOR_FILE_BYTES)
    try:
        return load_file(str(p))
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied; fix the file's permissions") from None
    except Exception as exc:
        raise ZeppInputError(f"{p}: cannot read it as a safetensors file ({type(exc).__name__})") from None


def _raw_ids(a, where: str, e: int, k: int) -> np.ndarray:
    """One key's selected ids as ``[tokens, k]`` (a flat array is cut into rows of ``k``)."""
    a = int_array(a, where, "expert ids", lo=0, hi=e)
    if a.ndim == 1:
        if a.size % k:
            raise ZeppInputError(f"{where} holds {a.size} ids, not a multiple of top-{k}")
        a = a.reshape(-1, k)
    if a.ndim != 2 or a.shape[1] != k:
        raise ZeppInputError(f"{where} must be [tokens, {k}], got {a.shape}")
    return a


def _raw_history(d: Path, files: dict[int, Path], per_rank: list[dict], iters: list[int], layer_ids: list[int],
                 e: int, k: int, allow_duplicates: bool) -> LayerHistory:
    """Tokens form: per layer every rank's ids in iteration order, rank by rank."""
    traces, token_ranks = [], []
    for ly in layer_ids:
        parts, ranks = [], []
        for r, pr in enumerate(per_rank):
            for it in iters:
                if (it, ly) in pr:
                    a = _raw_ids(pr[(it, ly)], f"{files[r]}: key '{it}_{ly}'", e, k)
                    parts.append(a)
                    ranks.append(np.full(len(a), r, dtype=np.int64))
        ids = np.concatenate(parts)
        check_ids(ids, e, k, f"{d} (layer {ly})", "row (0-based)", allow_duplicates)
        traces.append(Trace(ids.astype(np.int32), e, f"{d}:layer{ly}"))
        token_ranks.append(np.concatenate(ranks))
    return LayerHistory(str(d), "trtllm-raw", e, k, tuple(layer_ids), tuple(traces), sources="ranks",
                        token_ranks=tuple(token_ranks), notes=())


def _count_history(d: Path, files: dict[int, Path], per_rank: list[dict], iters: list[int], layer_ids: list[int],
                   e: int, k: int) -> LayerHistory:
    """Counts form ``[L, B, ranks, E]``: each rank's bincounts, iterations grouped into bins."""
    arr = np.zeros((len(layer_ids), len(iters), len(per_rank), e), dtype=np.int64)
    li = {ly: i for i, ly in enumerate(layer_ids)}
    ii = {it: i for i, it in enumerate(iters)}
    for r, pr in enumerate(per_rank):
        for (it, ly), v in pr.items():
            a = whole_counts(v, f"{files[r]}: key '{it}_{ly}'")
            if a.shape != (e,):
                raise ZeppInputError(f"{files[r]}: key '{it}_{ly}' must be a bincount of length {e}, got shape "
                                     f"{a.shape}")
            arr[li[ly], ii[it], r] = a
    return LayerHistory(str(d), "trtllm", e, k, tuple(layer_ids), counts=bin_steps(arr, 1), sources="ranks",
                        notes=())
