"""Expert history of every layer of a model, read from what an engine recorded.

One internal form, :class:`LayerHistory`: per MoE layer either

- **tokens**: ``topk_ids [N, k]`` per token (a :class:`~zepp.traces.sampling.Trace`), in recorded
  order, optionally with the EP rank that held each token; or
- **counts**: a load histogram ``[B, S, E]`` per layer: ``B`` time bins (consecutive
  groups of the recorded steps, at most ``MAX_BINS``), ``S`` sources (EP ranks that sent the
  entries, or ``S = 1`` when the engine summed over them), ``E`` logical experts.

What each form supports as placement input (:meth:`LayerHistory.node_demand`):

| form | node demand ``[N, E]`` (zepp placement) | total load ``[E]`` (EPLB) | batches for the report |
| --- | --- | --- | --- |
| tokens | rows dealt to the planned ranks (``zepp.traces.sampling.node_demand``, shuffled) | yes | sampled rows |
| counts, sources = ranks | recorded ranks grouped onto the planned nodes (``S = R``: rank ``r`` on node ``r // L``; ``S`` a multiple of ``N``: ``S/N`` consecutive ranks per node) | yes | drawn per source |
| counts, no sources | **assumed**: every node asks for each expert in equal share | yes | drawn from the total |

A histogram without source ranks cannot say which node asks for what: Zepp's placement then
spreads replicas by load only, and the report's locality gain is an estimate on tokens drawn
from that assumption. Batches drawn from a histogram pick ``k`` distinct experts per token in
proportion to load (Gumbel top-k); which experts are picked *together* is not recorded, so
drawn batches have no co-selection structure.

Readers (:func:`read_history`; formats in ``../shared/INTEROP.md``):

- ``.txt``: the text format of ``../shared/traces`` (one layer, applied to every MoE layer);
- a folder written by zepp's recorder (``zepp generate --record``, ``zepp.serve``):
  ``DIR/layer_{i:03d}.txt`` (text format, every token of MoE layer ``i``, counted from 0 = the
  model's first MoE layer, in recorded order) and ``DIR/load.json`` (``{"logical_count":
  [MoE layers][E], "experts": E, "top_k": k, "layers": M}``; read when there are no layer files);
- SGLang expert-distribution dumps (``.pt``, or a folder of them): ``stat`` (``logical_count
  [steps, layers, E]``), ``per_pass`` (``records[*].global_physical_count [layers, P]``) and
  ``per_token`` (``records[*].topk_ids_of_layer [layers, T, k]``), physical ids mapped to
  logical ones through the dump's ``last_physical_to_logical_map``; one file per rank;
- TensorRT-LLM expert statistics (a folder with ``meta_info.json`` and ``rank{r}.safetensors``,
  keys ``"{iteration}_{layer}"`` each a bincount ``[E]``; or ``rank{r}_raw.safetensors`` with
  the selected ids ``[T, k]`` per key);
- a vLLM load window (``.pt`` or ``.npz`` with ``expert_load_window [W, L, P]`` and
  ``physical_to_logical_map [L, P]``; ``L`` counts MoE layers only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.formats import sglang_topk
from zepp.traces.formats.arrays import check_ids, int_array, npz_load, to_numpy, torch_load
from zepp.traces.formats.files import describe_keys, input_file, read_bytes
from zepp.traces.trace import Trace

__all__ = ["LayerHistory", "read_history", "history_from_traces", "MAX_BINS", "FORMATS"]

MAX_BINS = 10
FORMATS = ("text", "zepp-recorder", "sglang-stat", "sglang-per-pass", "sglang-per-token", "trtllm",
           "trtllm-raw", "vllm")


@dataclass(frozen=True)
class LayerHistory:
    """Every MoE layer's history (see the module docstring).

    ``layers``: model layer index of each entry; ``None`` means one history that stands for
    every MoE layer (a single-layer trace). ``tokens`` (form ``tokens``) or ``counts``
    (``[M, B, S, E]`` int64, form ``counts``); ``sources`` is ``"ranks"`` or ``"none"``;
    ``token_ranks``: per layer the recorded EP rank of each token row (or ``None``).
    """

    source: str
    format: str
    num_experts: int
    top_k: int | None
    layers: tuple[int, ...] | None
    tokens: tuple[Trace, ...] | None = None
    counts: np.ndarray | None = None
    sources: str = "none"
    token_ranks: tuple[np.ndarray | None, ...] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def form(self) -> str:
        return "tokens" if self.tokens is not None else "counts"

    @property
    def num_entries(self) -> int:
        return len(self.tokens) if self.tokens is not None else int(self.counts.shape[0])

    @property
    def num_sources(self) -> int:
        return 1 if self.counts is None else int(self.counts.shape[2])

    def describe(self) -> str:
        what = (f"{self.num_entries} layer(s)" if self.layers is not None else "one layer (used for every MoE layer)")
        if self.form == "tokens":
            rows = sum(len(t) for t in self.tokens)
            body = f"top-{self.top_k} ids of {rows} token rows"
        else:
            src = f"{self.num_sources} source ranks" if self.sources == "ranks" else "no source ranks"
            body = f"load histograms ({self.counts.shape[1]} time bins, {src})"
        return f"{self.source} [{self.format}]: {what}, {self.num_experts} experts, {body}"

    # ------------------------------------------------------------ held-out split

    def split(self, heldout: float) -> tuple["LayerHistory", "LayerHistory | None"]:
        """``(history, held-out)``: the last ``heldout`` fraction of each layer's rows (tokens)
        or time bins (counts) held out; ``None`` when nothing can be held out."""
        if not 0 <= heldout < 1:
            raise ZeppInputError(f"--heldout must lie in [0, 1), got {heldout!r}")
        if heldout == 0:
            return self, None
        if self.form == "tokens":
            head, tail, hr, tr = [], [], [], []
            for i, t in enumerate(self.tokens):
                cut = int(round(len(t) * (1 - heldout)))
                if cut < 1 or cut >= len(t):
                    return self, None
                head.append(Trace(t.topk_ids[:cut], t.num_experts, t.source + "[history]"))
                tail.append(Trace(t.topk_ids[cut:], t.num_experts, t.source + "[held-out]"))
                ranks = self.token_ranks[i] if self.token_ranks else None
                hr.append(None if ranks is None else ranks[:cut])
                tr.append(None if ranks is None else ranks[cut:])
            mk = lambda tk, rk: LayerHistory(self.source, self.format, self.num_experts, self.top_k,  # noqa: E731
                                             self.layers, tuple(tk), None, self.sources, tuple(rk), self.notes)
            return mk(head, hr), mk(tail, tr)
        b = self.counts.shape[1]
        cut = int(round(b * (1 - heldout)))
        if b < 2 or cut < 1 or cut >= b:
            return self, None
        mk = lambda c: LayerHistory(self.source, self.format, self.num_experts, self.top_k, self.layers,  # noqa: E731
                                    None, c, self.sources, None, self.notes)
        return mk(self.counts[:, :cut]), mk(self.counts[:, cut:])

    # ------------------------------------------------------------ placement inputs

    def load(self, i: int) -> np.ndarray:
        """Total entries per expert ``[E]`` of entry ``i``."""
        if self.form == "tokens":
            return self.tokens[i].expert_load()
        return self.counts[i].sum(axis=(0, 1))

    def _source_node_weights(self, nodes: int) -> np.ndarray | None:
        """``[S, N]`` share of each recorded source that lands on each planned node, or ``None``
        when sources are unknown."""
        s = self.num_sources
        if self.sources != "ranks" or s < 2:
            return None
        if s % nodes == 0:
            w = np.zeros((s, nodes))
            w[np.arange(s), np.arange(s) * nodes // s] = 1.0
            return w
        return None

    def node_demand(self, i: int, nodes: int, gpus_per_node: int) -> tuple[np.ndarray, str]:
        """``(hist [N, E] int64, how)``: the demand each planned node puts on each expert, and a
        sentence saying how it was obtained (what was assumed)."""
        from zepp.traces.sampling import node_demand

        if self.form == "tokens":
            t = self.tokens[i]
            ranks = self.token_ranks[i] if self.token_ranks else None
            r = nodes * gpus_per_node
            if ranks is not None and int(ranks.max(initial=-1)) + 1 == r:
                node = ranks // gpus_per_node
                key = node[:, None].astype(np.int64) * self.num_experts + t.topk_ids
                h = np.bincount(key.ravel(), minlength=nodes * self.num_experts).reshape(nodes, self.num_experts)
                return h.astype(np.int64), "token rows on their recorded ranks"
            return node_demand(t, nodes, gpus_per_node), "token rows dealt to the planned ranks (shuffled)"
        c = self.counts[i].sum(axis=0)  # [S, E]
        w = self._source_node_weights(nodes)
        if w is not None:
            return (w.T @ c).astype(np.int64), f"{self.num_sources} recorded source ranks grouped onto {nodes} nodes"
        total = c.sum(axis=0)
        base, rem = total // nodes, total % nodes
        h = np.broadcast_to(base, (nodes, self.num_experts)) + (np.arange(nodes)[:, None] < rem[None, :])
        why = ("no source ranks recorded" if self.sources != "ranks"
               else f"{self.num_sources} recorded ranks do not group onto {nodes} nodes")
        return h.astype(np.int64), f"{why}: every node assumed to ask for each expert in equal share"

    def batches(self, i: int, ranks: int, tokens_per_rank: int, iters: int, seed: int) -> np.ndarray:
        """``[iters, R, T, k]`` evaluation batches of entry ``i`` (sampled rows, or drawn from
        the histogram: ``k`` distinct experts per token in proportion to the source's load)."""
        from zepp.traces.sampling import sample_batches

        if self.form == "tokens":
            return sample_batches(self.tokens[i], ranks, tokens_per_rank, iters, seed)
        if self.top_k is None:
            raise ZeppInputError(f"{self.source}: the histogram does not say top-k; pass --model or --topk")
        k = self.top_k
        c = self.counts[i].sum(axis=0).astype(np.float64)  # [S, E]
        s = c.shape[0]
        src_of_rank = np.arange(ranks) * s // ranks if s > 1 else np.zeros(ranks, dtype=np.int64)
        rng = np.random.default_rng(seed)
        with np.errstate(divide="ignore"):
            logp = np.log(c / np.maximum(c.sum(axis=1, keepdims=True), 1))
        out = np.empty((iters, ranks, tokens_per_rank, k), dtype=np.int32)
        for r in range(ranks):  # loop over ranks; vectorised over tokens
            g = rng.gumbel(size=(iters * tokens_per_rank, self.num_experts)) + logp[src_of_rank[r]]
            top = np.argpartition(-g, k - 1, axis=1)[:, :k]
            out[:, r] = np.sort(top, axis=1).reshape(iters, tokens_per_rank, k)
        return out


# ---------------------------------------------------------------- helpers


def _bins(counts: np.ndarray, axis_steps: int = 0) -> np.ndarray:
    """Group the steps axis (``axis_steps``) into at most ``MAX_BINS`` consecutive bins."""
    n = counts.shape[axis_steps]
    b = max(1, min(MAX_BINS, n))
    edges = np.arange(n) * b // n
    out = np.zeros((b,) + counts.shape[:axis_steps] + counts.shape[axis_steps + 1:], dtype=np.int64)
    np.add.at(out, edges, np.moveaxis(counts, axis_steps, 0).astype(np.int64))
    return np.moveaxis(out, 0, axis_steps)


def _counts(x, where: str) -> np.ndarray:
    a = to_numpy(x, where)
    if a.dtype.kind == "f" and a.size and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
        a = a.astype(np.int64)  # whole numbers stored as floats are exact
    return int_array(a, where, "counts", lo=0, hi=2**62)


def _model_layers(spec, recorded: int, source: str, what: str) -> tuple[int, ...]:
    """Model layer index of each of ``recorded`` rows: all layers (``num_layers``) or MoE layers only."""
    if spec is None:
        return tuple(range(recorded))
    if recorded == spec.num_layers:
        return tuple(range(recorded))
    if recorded == len(spec.moe_layers):
        return spec.moe_layers
    raise ZeppInputError(
        f"{source}: {what} has {recorded} layers, but model {spec.name!r} has {spec.num_layers} layers "
        f"({len(spec.moe_layers)} MoE); pass the model the dump was recorded with (--model)")


def _spec_e(spec, num_experts):
    if num_experts is not None:
        return int(num_experts)
    return spec.num_experts if spec is not None else None


# ---------------------------------------------------------------- SGLang


_SG_RANK = re.compile(r"_(\d+)\.pt$")


def _sglang(paths: list[Path], objs: list, spec, num_experts, top_k, allow_duplicates) -> LayerHistory:
    source = str(paths[0].parent if len(paths) > 1 else paths[0])
    first = objs[0]
    notes: list[str] = []
    if isinstance(first, dict) and "logical_count" in first:
        if len(objs) > 1:
            raise ZeppInputError(f"{source}: more than one stat-mode dump; give one file (rank 0 writes it)")
        lc = _counts(first["logical_count"], f"{paths[0]}: logical_count")
        if lc.ndim == 2:
            lc = lc[None]
        if lc.ndim != 3:
            raise ZeppInputError(f"{paths[0]}: logical_count must be [steps, layers, E], got shape {lc.shape}")
        e = _spec_e(spec, num_experts) or lc.shape[2]
        if lc.shape[2] != e:
            raise ZeppInputError(f"{paths[0]}: logical_count has {lc.shape[2]} experts, the model {e}")
        layers = _model_layers(spec, lc.shape[1], str(paths[0]), "logical_count")
        c = _bins(lc, 0).transpose(1, 0, 2)[:, :, None, :]  # [L, B, 1, E]
        keep = [i for i, l in enumerate(layers) if (spec is None and c[i].sum() > 0) or
                (spec is not None and l in spec.moe_layers)]
        if len(keep) < len(layers):
            notes.append(f"{len(layers) - len(keep)} dense or empty layer row(s) skipped")
        notes.append("stat mode sums over ranks: no source ranks")
        return LayerHistory(source, "sglang-stat", e, top_k or (spec.top_k if spec else None),
                            tuple(layers[i] for i in keep), counts=c[keep], sources="none", notes=tuple(notes))
    # per_pass / per_token: one file per rank, each {"records": [...], "last_physical_to_logical_map": [L, P]}
    per_token = None
    tok: dict[int, list] = {}
    cnt: list[np.ndarray] = []  # per rank [passes, L, E]
    ranks_seen = []
    n_layers = None
    for p, obj in zip(paths, objs):
        if not isinstance(obj, dict) or not isinstance(obj.get("records"), (list, tuple)):
            raise ZeppInputError(f"{p}: not an SGLang expert-distribution dump (keys {describe_keys(obj)}); expected "
                                 f"'logical_count' (stat mode) or 'records' (per_pass / per_token mode)")
        if "last_physical_to_logical_map" not in obj:
            raise ZeppInputError(f"{p}: no 'last_physical_to_logical_map'; the recorded ids are physical and cannot "
                                 f"be mapped to logical experts without it")
        m = int_array(obj["last_physical_to_logical_map"], f"{p}: last_physical_to_logical_map", "logical ids",
                      lo=0, hi=_spec_e(spec, num_experts))
        if m.ndim != 2:
            raise ZeppInputError(f"{p}: last_physical_to_logical_map must be [layers, P], got shape {m.shape}")
        n_layers = m.shape[0] if n_layers is None else n_layers
        if m.shape[0] != n_layers:
            raise ZeppInputError(f"{p}: {m.shape[0]} layers, other ranks' files {n_layers}")
        e = _spec_e(spec, num_experts) or int(m.max()) + 1
        recs = [r for r in obj["records"] if isinstance(r, dict)]
        if not recs:
            raise ZeppInputError(f"{p}: 'records' is empty; record some forward passes before dumping")
        has_tok = all("topk_ids_of_layer" in r for r in recs)
        per_token = has_tok if per_token is None else per_token
        rank = int(recs[0].get("rank", len(ranks_seen))) if not isinstance(recs[0].get("rank"), bool) else 0
        ranks_seen.append(rank)
        if per_token:
            for li in range(n_layers):
                parts = [sglang_topk({"topk_ids_of_layer": r["topk_ids_of_layer"],
                                      "last_physical_to_logical_map": m}, str(p), li) for r in recs]
                tok.setdefault(li, []).append((rank, np.concatenate(parts) if parts else np.empty((0, 1), np.int64)))
        else:
            rows = []
            for j, r in enumerate(recs):
                if "global_physical_count" not in r:
                    raise ZeppInputError(f"{p}: record {j} has no 'global_physical_count' (keys {describe_keys(r)})")
                g = _counts(r["global_physical_count"], f"{p}: record {j}: global_physical_count")
                if g.shape != m.shape:
                    raise ZeppInputError(f"{p}: record {j}: global_physical_count has shape {g.shape}, the map "
                                         f"{m.shape}")
                logical = np.zeros((n_layers, e), dtype=np.int64)
                np.add.at(logical, (np.arange(n_layers)[:, None], m), g)  # physical -> logical
                rows.append(logical)
            cnt.append(np.stack(rows))
    if len(set(ranks_seen)) != len(ranks_seen):
        raise ZeppInputError(f"{source}: two files claim the same rank ({sorted(ranks_seen)}); give one file per rank")
    layers = _model_layers(spec, n_layers, source, "last_physical_to_logical_map")
    order = np.argsort(ranks_seen)
    if per_token:
        traces, rk, keep_layers = [], [], []
        for li in range(n_layers):
            if spec is not None and layers[li] not in spec.moe_layers:
                continue
            pieces = [tok[li][j] for j in order]
            ids = np.concatenate([a for _, a in pieces])
            if ids.shape[0] == 0:
                continue
            ek = check_ids(ids, e, top_k, f"{source} (layer {layers[li]})", "row (0-based)", allow_duplicates)
            traces.append(Trace(ids.astype(np.int32), ek, f"{source}:layer{layers[li]}"))
            rk.append(np.concatenate([np.full(len(a), j, dtype=np.int64) for j, (_, a) in enumerate(pieces)]))
            keep_layers.append(layers[li])
        if not traces:
            raise ZeppInputError(f"{source}: no MoE layer holds any token")
        if len(paths) < 2:
            rk = [None] * len(traces)
        return LayerHistory(source, "sglang-per-token", e, traces[0].top_k, tuple(keep_layers), tuple(traces),
                            sources="ranks" if len(paths) > 1 else "none", token_ranks=tuple(rk), notes=tuple(notes))
    passes = {c.shape[0] for c in cnt}
    steps = min(passes)
    if len(passes) > 1:
        notes.append(f"ranks recorded different pass counts {sorted(passes)}; the first {steps} of each are used")
    arr = np.stack([cnt[j][:steps] for j in order], axis=2)  # [passes, L, S, E]
    c = _bins(arr, 0).transpose(1, 0, 2, 3)  # [L, B, S, E]
    keep = [i for i, l in enumerate(layers) if (spec is None and c[i].sum() > 0) or
            (spec is not None and l in spec.moe_layers)]
    return LayerHistory(source, "sglang-per-pass", e, top_k or (spec.top_k if spec else None),
                        tuple(layers[i] for i in keep), counts=c[keep], sources="ranks" if len(paths) > 1 else "none",
                        notes=tuple(notes))


# ---------------------------------------------------------------- TensorRT-LLM


_TRT_FILE = re.compile(r"^rank(\d+)(_raw)?\.safetensors$")
_TRT_KEY = re.compile(r"^(\d+)_(\d+)$")


def _safetensors(p: Path) -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ZeppInputError("reading TensorRT-LLM statistics needs the safetensors package (pip install safetensors)") \
            from None
    try:
        return load_file(str(p))
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied; fix the file's permissions") from None
    except Exception as exc:
        raise ZeppInputError(f"{p}: cannot read it as a safetensors file ({type(exc).__name__})") from None


def _trtllm(d: Path, spec, num_experts, top_k, allow_duplicates) -> LayerHistory:
    meta_p = d / "meta_info.json"
    try:
        meta = json.loads(read_bytes(input_file(meta_p, "TensorRT-LLM meta_info.json", ".json")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ZeppInputError(f"{meta_p}: not valid JSON ({exc})") from None
    for key in ("num_experts", "num_experts_per_token"):
        v = meta.get(key) if isinstance(meta, dict) else None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ZeppInputError(f"{meta_p}: field {key!r} must be a positive integer, got {v!r}")
    e, k = meta["num_experts"], meta["num_experts_per_token"]
    if spec is not None and (e, k) != (_spec_e(spec, num_experts), top_k or spec.top_k):
        raise ZeppInputError(f"{meta_p}: {e} experts, top-{k}, but model {spec.name!r} has "
                             f"{_spec_e(spec, num_experts)} experts, top-{top_k or spec.top_k}")
    files = {}
    for f in sorted(d.iterdir()):
        m = _TRT_FILE.match(f.name)
        if m:
            files.setdefault(bool(m.group(2)), {})[int(m.group(1))] = f
    raw = True in files
    chosen = files.get(True) or files.get(False)
    if not chosen:
        raise ZeppInputError(f"{d}: no rank{{r}}.safetensors or rank{{r}}_raw.safetensors next to meta_info.json")
    ranks = sorted(chosen)
    if ranks != list(range(len(ranks))):
        raise ZeppInputError(f"{d}: rank files {ranks} are not 0..{len(ranks) - 1}; a rank's file is missing")
    per_rank: list[dict[tuple[int, int], np.ndarray]] = []
    for r in ranks:
        data = _safetensors(chosen[r])
        parsed = {}
        for key, v in data.items():
            km = _TRT_KEY.match(key)
            if not km:
                raise ZeppInputError(f"{chosen[r]}: key {key!r} is not '{{iteration}}_{{layer}}'")
            parsed[(int(km.group(1)), int(km.group(2)))] = v
        per_rank.append(parsed)
    iters = sorted({it for pr in per_rank for it, _ in pr})
    layer_ids = sorted({ly for pr in per_rank for _, ly in pr})
    if spec is not None:
        bad = [ly for ly in layer_ids if ly not in spec.moe_layers]
        if bad:
            raise ZeppInputError(f"{d}: layer index {bad[0]} is not a MoE layer of model {spec.name!r} "
                                 f"(MoE layers {spec.moe_layers[0]}..{spec.moe_layers[-1]})")
    notes = []
    if raw:
        traces, rks = [], []
        for ly in layer_ids:
            parts, rk = [], []
            for r, pr in enumerate(per_rank):
                for it in iters:
                    if (it, ly) in pr:
                        a = int_array(pr[(it, ly)], f"{chosen[r]}: key '{it}_{ly}'", "expert ids", lo=0, hi=e)
                        if a.ndim == 1:
                            if a.size % k:
                                raise ZeppInputError(f"{chosen[r]}: key '{it}_{ly}' holds {a.size} ids, not a "
                                                     f"multiple of top-{k}")
                            a = a.reshape(-1, k)
                        if a.ndim != 2 or a.shape[1] != k:
                            raise ZeppInputError(f"{chosen[r]}: key '{it}_{ly}' must be [tokens, {k}], got {a.shape}")
                        parts.append(a)
                        rk.append(np.full(len(a), r, dtype=np.int64))
            ids = np.concatenate(parts)
            check_ids(ids, e, k, f"{d} (layer {ly})", "row (0-based)", allow_duplicates)
            traces.append(Trace(ids.astype(np.int32), e, f"{d}:layer{ly}"))
            rks.append(np.concatenate(rk))
        return LayerHistory(str(d), "trtllm-raw", e, k, tuple(layer_ids), tuple(traces), sources="ranks",
                            token_ranks=tuple(rks), notes=tuple(notes))
    arr = np.zeros((len(layer_ids), len(iters), len(ranks), e), dtype=np.int64)
    li = {ly: i for i, ly in enumerate(layer_ids)}
    ii = {it: i for i, it in enumerate(iters)}
    for r, pr in enumerate(per_rank):
        for (it, ly), v in pr.items():
            a = _counts(v, f"{chosen[r]}: key '{it}_{ly}'")
            if a.shape != (e,):
                raise ZeppInputError(f"{chosen[r]}: key '{it}_{ly}' must be a bincount of length {e}, got shape {a.shape}")
            arr[li[ly], ii[it], r] = a
    return LayerHistory(str(d), "trtllm", e, k, tuple(layer_ids), counts=_bins(arr, 1), sources="ranks",
                        notes=tuple(notes))


# ---------------------------------------------------------------- vLLM


def _vllm(p: Path, obj: dict, spec, num_experts, top_k) -> LayerHistory:
    if "physical_to_logical_map" not in obj:
        raise ZeppInputError(f"{p}: has 'expert_load_window' but no 'physical_to_logical_map'; save both "
                             f"(the window counts physical experts)")
    w = _counts(obj["expert_load_window"], f"{p}: expert_load_window")
    m = int_array(obj["physical_to_logical_map"], f"{p}: physical_to_logical_map", "logical ids", lo=-1,
                  hi=_spec_e(spec, num_experts))
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3 or m.ndim != 2 or w.shape[1:] != m.shape:
        raise ZeppInputError(f"{p}: expert_load_window must be [W, L, P] and physical_to_logical_map [L, P]; got "
                             f"{w.shape} and {m.shape}")
    e = _spec_e(spec, num_experts) or int(m.max()) + 1
    n_l = m.shape[0]
    logical = np.zeros((w.shape[0], n_l, e), dtype=np.int64)
    valid = m >= 0
    lidx, pidx = np.nonzero(valid)
    np.add.at(logical, (slice(None), lidx, m[lidx, pidx]), w[:, lidx, pidx])
    if spec is not None and n_l != len(spec.moe_layers):
        raise ZeppInputError(f"{p}: {n_l} MoE layers, model {spec.name!r} has {len(spec.moe_layers)}")
    layers = spec.moe_layers if spec is not None else tuple(range(n_l))
    c = _bins(logical, 0).transpose(1, 0, 2)[:, :, None, :]
    return LayerHistory(str(p), "vllm", e, top_k or (spec.top_k if spec else None), tuple(layers), counts=c,
                        sources="none", notes=("vLLM's window holds one rank's view (or the all-reduced sum): no "
                                               "source ranks",))


# ---------------------------------------------------------------- zepp recorder


_LAYER_TXT = re.compile(r"^layer_(\d{3,})\.txt$")


def _zepp_dir(d: Path, spec, num_experts, top_k, allow_duplicates) -> LayerHistory:
    """The serving recorder's folder (``zepp generate --record``, ``zepp.serve.rank.write_record``):
    ``layer_{i:03d}.txt`` per MoE layer ``i`` (ordinal: 0 = the first MoE layer) and
    ``load.json`` (``{"logical_count": [MoE layers][E], "experts": E, "top_k": k, "layers": M}``)."""
    from zepp.traces.formats import read_trace

    files = sorted((int(m.group(1)), f) for f in d.iterdir() if (m := _LAYER_TXT.match(f.name)))
    load_p = d / "load.json"
    e = _spec_e(spec, num_experts)
    k = top_k or (spec.top_k if spec else None)

    def model_layers(ordinals: list[int], what: str) -> tuple[int, ...]:
        if spec is None:
            return tuple(ordinals)
        bad = [i for i in ordinals if i >= len(spec.moe_layers)]
        if bad:
            raise ZeppInputError(f"{d}: {what} {bad[0]} but model {spec.name!r} has {len(spec.moe_layers)} MoE layers "
                                 f"(recorder files count MoE layers from 0)")
        return tuple(spec.moe_layers[i] for i in ordinals)

    if files:
        traces = [read_trace(f, num_experts=e, top_k=k, allow_duplicates=allow_duplicates) for _, f in files]
        layers = model_layers([i for i, _ in files], "layer_NNN.txt index")
        e = e or max(t.num_experts for t in traces)
        traces = tuple(Trace(t.topk_ids, e, t.source) for t in traces)
        return LayerHistory(str(d), "zepp-recorder", e, traces[0].top_k, layers, traces, sources="none",
                            token_ranks=tuple(None for _ in traces))
    if not load_p.exists():
        raise ZeppInputError(f"{d}: no layer_NNN.txt files and no load.json; a zepp recorder folder holds "
                             f"layer_{{i:03d}}.txt (one per MoE layer) and load.json")
    try:
        obj = json.loads(read_bytes(input_file(load_p, "load.json", ".json")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ZeppInputError(f"{load_p}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict) or "logical_count" not in obj:
        raise ZeppInputError(f"{load_p}: field 'logical_count' ([MoE layers][experts] entry counts) is missing")
    c = _counts(obj["logical_count"], f"{load_p}: logical_count")
    if c.ndim != 2:
        raise ZeppInputError(f"{load_p}: field 'logical_count' must be [MoE layers][experts], got shape {c.shape}")
    fe = obj.get("experts", c.shape[1])
    if isinstance(fe, bool) or not isinstance(fe, int) or fe != c.shape[1]:
        raise ZeppInputError(f"{load_p}: field 'experts' is {fe!r}, logical_count has {c.shape[1]} columns")
    if e is not None and fe != e:
        raise ZeppInputError(f"{load_p}: {fe} experts, the model {e}")
    fk = obj.get("top_k", k)
    if fk is not None and (isinstance(fk, bool) or not isinstance(fk, int) or fk < 1):
        raise ZeppInputError(f"{load_p}: field 'top_k' must be a positive integer, got {fk!r}")
    layers = model_layers(list(range(c.shape[0])), "logical_count row")
    return LayerHistory(str(d), "zepp-recorder", fe, fk, layers, counts=c[:, None, None, :], sources="none",
                        notes=("load.json sums over ranks: no source ranks",))


# ---------------------------------------------------------------- entry point


def read_history(path, model: str | None = None, num_experts: int | None = None, top_k: int | None = None,
                 allow_duplicates: bool = False) -> LayerHistory:
    """Read an engine's expert history (every layer) into a :class:`LayerHistory`; the format
    is recognised from the path (see the module docstring). ``model``: the preset the history
    was recorded with (layer count, experts, top-k), strongly recommended."""
    from zepp.model import model_preset

    spec = model_preset(model) if model is not None else None
    if spec is not None:
        spec = spec.with_(num_experts=num_experts, top_k=top_k)
    p = Path(path)
    if p.is_dir():
        if (p / "meta_info.json").exists():
            return _trtllm(p, spec, num_experts, top_k, allow_duplicates)
        pts = sorted(p.glob("*.pt"))
        if pts and not any(_LAYER_TXT.match(f.name) for f in p.iterdir()):
            objs = [torch_load(input_file(f)) for f in pts]
            return _sglang(pts, objs, spec, num_experts, top_k, allow_duplicates)
        return _zepp_dir(p, spec, num_experts, top_k, allow_duplicates)
    p = input_file(p, "history file", ".txt, .pt, .npz, or a folder")
    suffix = p.suffix.lower()
    if suffix in (".txt", ".trace", ""):
        from zepp.traces.formats import read_trace

        t = read_trace(p, num_experts=_spec_e(spec, num_experts), top_k=top_k or (spec.top_k if spec else None),
                       allow_duplicates=allow_duplicates)
        return LayerHistory(str(p), "text", t.num_experts, t.top_k, None, (t,), token_ranks=(None,),
                            notes=("one layer's trace: its placement is used for every MoE layer",))
    if suffix in (".pt", ".pth", ".npz"):
        obj = npz_load(p) if suffix == ".npz" else torch_load(p)
        if isinstance(obj, dict) and "expert_load_window" in obj:
            return _vllm(p, obj, spec, num_experts, top_k)
        if isinstance(obj, dict) and ("logical_count" in obj or "records" in obj):
            return _sglang([p], [obj], spec, num_experts, top_k, allow_duplicates)
        raise ZeppInputError(f"{p}: not a known history (keys {describe_keys(obj)}); expected an SGLang dump "
                             f"('logical_count' or 'records') or a vLLM load window ('expert_load_window')")
    raise ZeppInputError(f"{p}: unknown history format {suffix!r}; give a .txt trace, an SGLang .pt dump, a vLLM "
                         f".pt/.npz window, or a folder (TensorRT-LLM statistics, zepp recorder, SGLang per-rank dumps)")


def history_from_traces(traces: list[Trace], layers: tuple[int, ...], source: str, fmt: str = "synthetic") -> LayerHistory:
    """A tokens-form history from in-memory traces (synthetic multi-layer traces)."""
    if not traces:
        raise ZeppInputError("history_from_traces: no traces")
    e = traces[0].num_experts
    return LayerHistory(source, fmt, e, traces[0].top_k, tuple(layers), tuple(traces),
                        token_ranks=tuple(None for _ in traces))
