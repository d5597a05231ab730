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

zepp's :class:`~zepp.planner.types.Placement` ``slot_expert [R, S]`` is one layer's row, slot
``r * S + s`` at row ``r``, column ``s``.

What SGLang records (its expert distribution recorder, ``--expert-distribution-recorder-mode``),
read by :func:`read_dumps` (through :func:`zepp.interop.history.read_history`): ``stat``
(``logical_count [steps, layers, E]``, one file: rank 0 writes it, summed over ranks),
``per_pass`` (``records[*].global_physical_count [layers, P]``) and ``per_token``
(``records[*].topk_ids_of_layer [layers, T, k]``), one file per rank, physical ids mapped to
logical ones through the dump's ``last_physical_to_logical_map [layers, P]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import describe_keys, input_file
from zepp.interop.base_history import HistoryRequest
from zepp.interop.common import check_rows, load_obj, save_json
from zepp.planner.types import Placement
from zepp.traces.formats.arrays import check_ids, int_array, npz_load, torch_load, whole_counts
from zepp.traces.formats.sglang_dumps import sglang_topk
from zepp.traces.layer_history import LayerHistory, bin_steps
from zepp.traces.trace import Trace

__all__ = [
    "load_hint", "placement_to_physical_map", "write_init_expert_location", "read_placement", "write_logical_count",
    "write_engine", "read_engine", "check_file_object", "is_dump", "has_dumps", "read_dumps", "read_dump_file",
    "read_dump_folder",
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
    p = Path(path)
    if p.suffix.lower() == ".npz":
        obj = npz_load(input_file(p, "expert-location file", ".json, .pt or .npz"))
    else:
        p, obj = load_obj(p, (".json", ".pt"))
    if not isinstance(obj, dict) or KEY not in obj:
        raise ZeppInputError(f"{p}: no {KEY!r} (found {describe_keys(obj)})")
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


def load_hint(out: str, ep) -> str:
    """How SGLang is started with the file ``out`` of ``ep``."""
    return (f"SGLang: --init-expert-location {out} --ep-num-redundant-experts {ep.redundant} "
            f"(EP size {ep.ranks}; without --enable-eplb, which would re-plan it)")


# ---------------------------------------------------------------- what SGLang records


def is_dump(obj) -> bool:
    """An expert-distribution dump: ``logical_count`` (stat mode) or ``records`` (per_pass / per_token)."""
    return isinstance(obj, dict) and ("logical_count" in obj or "records" in obj)


def has_dumps(d: Path) -> bool:
    """A folder holding ``.pt`` files (one dump per rank)."""
    return any(d.glob("*.pt"))


def read_dump_folder(d: Path, req: HistoryRequest) -> LayerHistory:
    """Every ``*.pt`` dump of folder ``d`` (one per rank), read by :func:`read_dumps`."""
    paths = sorted(d.glob("*.pt"))
    return read_dumps(paths, [torch_load(input_file(f)) for f in paths], req)


def read_dump_file(p: Path, obj, req: HistoryRequest) -> LayerHistory:
    """One dump ``obj`` (loaded from ``p``), read by :func:`read_dumps`."""
    return read_dumps([p], [obj], req)


def read_dumps(paths: list[Path], objs: list, req: HistoryRequest) -> LayerHistory:
    """Every layer of SGLang expert-distribution dumps ``objs`` (loaded from ``paths``): one
    stat-mode dump, or per_pass / per_token dumps, one per rank."""
    source = str(paths[0].parent if len(paths) > 1 else paths[0])
    if isinstance(objs[0], dict) and "logical_count" in objs[0]:
        if len(objs) > 1:
            raise ZeppInputError(f"{source}: more than one stat-mode dump; give one file (rank 0 writes it)")
        return _stat_history(paths[0], objs[0], source, req)
    dumps = _RankDumps(req)
    for p, obj in zip(paths, objs):
        dumps.add(p, obj)
    return dumps.history(source, several=len(paths) > 1)


def _stat_history(p: Path, obj: dict, source: str, req: HistoryRequest) -> LayerHistory:
    """``logical_count [steps, layers, E]`` (or ``[layers, E]``): counts without source ranks."""
    notes: list[str] = []
    lc = whole_counts(obj["logical_count"], f"{p}: logical_count")
    if lc.ndim == 2:
        lc = lc[None]
    if lc.ndim != 3:
        raise ZeppInputError(f"{p}: logical_count must be [steps, layers, E], got shape {lc.shape}")
    e = req.experts or lc.shape[2]
    if lc.shape[2] != e:
        raise ZeppInputError(f"{p}: logical_count has {lc.shape[2]} experts, the model {e}")
    layers = req.model_layers(lc.shape[1], str(p), "logical_count")
    c = bin_steps(lc, 0).transpose(1, 0, 2)[:, :, None, :]  # [L, B, 1, E]
    keep = req.moe_rows(layers, c)
    if len(keep) < len(layers):
        notes.append(f"{len(layers) - len(keep)} dense or empty layer row(s) skipped")
    notes.append("stat mode sums over ranks: no source ranks")
    return LayerHistory(source, "sglang-stat", e, req.k, tuple(layers[i] for i in keep), counts=c[keep],
                        sources="none", notes=tuple(notes))


MAX_RANK = 1 << 16  # ranks a dump may name: [0, MAX_RANK)


def _rank_of(p: Path, recs: list[dict], default: int) -> int:
    """The rank every record of one per-rank dump names (``default`` when none does)."""
    ranks = []
    for r in recs:
        v = r.get("rank", default)
        if hasattr(v, "numel") and v.numel() == 1 and not v.is_floating_point():
            v = v.item()  # a 0-d integer tensor
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_RANK:
            raise ZeppFileError(f"rank must be an integer in [0, {MAX_RANK}), got {repr(v)[:40]}", p,
                                f"records[{len(ranks)}].rank", "give the dump SGLang wrote for that rank")
        ranks.append(v)
    if len(set(ranks)) > 1:
        raise ZeppFileError(f"records of ranks {sorted(set(ranks))[:4]} in one file", p, "records[*].rank",
                            "give one file per rank")
    return ranks[0]


class _RankDumps:
    """per_pass / per_token dumps, one file per rank, added in the order given: the first file
    sets the mode and the layer count; the last one's map sets the expert count."""

    def __init__(self, req: HistoryRequest):
        self.req = req
        self.per_token: bool | None = None
        self.n_layers: int | None = None
        self.num_experts: int | None = None
        self.ranks: list[int] = []
        self.tokens: dict[int, list[tuple[int, np.ndarray]]] = {}  # layer row -> per file (rank, ids [T, k])
        self.counts: list[np.ndarray] = []  # per file [passes, L, E]
        self.first_map: np.ndarray | None = None  # every rank's file holds the same map
        self.k: int | None = None  # per_token: the ids per token row, the same in every file

    def add(self, p: Path, obj) -> None:
        """Check dump ``obj`` (file ``p``) and keep its ids or counts in logical experts."""
        m = self._physical_map(p, obj)
        self.num_experts = self.req.experts or int(m.max()) + 1
        recs = [r for r in obj["records"] if isinstance(r, dict)]
        if not recs:
            raise ZeppInputError(f"{p}: 'records' is empty; record some forward passes before dumping")
        has_tok = all("topk_ids_of_layer" in r for r in recs)
        if self.per_token is not None and has_tok != self.per_token:
            raise ZeppFileError("a per_pass dump among per_token ones (or the reverse)", p, "records",
                                "give the files of one recording (one --expert-distribution-recorder-mode)")
        self.per_token = has_tok
        rank = _rank_of(p, recs, len(self.ranks))
        self.ranks.append(rank)
        if self.per_token:
            self._add_tokens(p, recs, m, rank)
        else:
            self._add_counts(p, recs, m)

    def _physical_map(self, p: Path, obj) -> np.ndarray:
        """``last_physical_to_logical_map [L, P]`` of a dump, checked against the other files'."""
        if not isinstance(obj, dict) or not isinstance(obj.get("records"), (list, tuple)):
            raise ZeppInputError(f"{p}: not an SGLang expert-distribution dump (keys {describe_keys(obj)}); expected "
                                 f"'logical_count' (stat mode) or 'records' (per_pass / per_token mode)")
        if "last_physical_to_logical_map" not in obj:
            raise ZeppInputError(f"{p}: no 'last_physical_to_logical_map'; the recorded ids are physical and cannot "
                                 f"be mapped to logical experts without it")
        m = int_array(obj["last_physical_to_logical_map"], f"{p}: last_physical_to_logical_map", "logical ids",
                      lo=0, hi=self.req.experts)
        if m.ndim != 2:
            raise ZeppInputError(f"{p}: last_physical_to_logical_map must be [layers, P], got shape {m.shape}")
        self.n_layers = m.shape[0] if self.n_layers is None else self.n_layers
        if m.shape[0] != self.n_layers:
            raise ZeppInputError(f"{p}: {m.shape[0]} layers, other ranks' files {self.n_layers}")
        if self.first_map is None:
            self.first_map = m
        elif m.shape != self.first_map.shape or not np.array_equal(m, self.first_map):
            raise ZeppFileError(f"the map differs from the first rank file's (shape {m.shape}, the first "
                                f"{self.first_map.shape})", p, "last_physical_to_logical_map",
                                "every rank of one run dumps the same map: give the files of one recording")
        return m

    def _add_tokens(self, p: Path, recs: list[dict], m: np.ndarray, rank: int) -> None:
        for li in range(self.n_layers):
            parts = [sglang_topk({"topk_ids_of_layer": r["topk_ids_of_layer"],
                                  "last_physical_to_logical_map": m}, str(p), li) for r in recs]
            widths = sorted({q.shape[1] for q in parts} | ({self.k} if self.k is not None else set()))
            if len(widths) > 1:
                raise ZeppFileError(f"records of top-{widths[0]} and top-{widths[1]} ids in layer {li}", p,
                                    "topk_ids_of_layer", "give the files of one recording")
            ids = np.concatenate(parts)
            self.k = ids.shape[1]
            self.tokens.setdefault(li, []).append((rank, ids))

    def _add_counts(self, p: Path, recs: list[dict], m: np.ndarray) -> None:
        rows = []
        for j, r in enumerate(recs):
            if "global_physical_count" not in r:
                raise ZeppInputError(f"{p}: record {j} has no 'global_physical_count' (keys {describe_keys(r)})")
            g = whole_counts(r["global_physical_count"], f"{p}: record {j}: global_physical_count")
            if g.shape != m.shape:
                raise ZeppInputError(f"{p}: record {j}: global_physical_count has shape {g.shape}, the map "
                                     f"{m.shape}")
            logical = np.zeros((self.n_layers, self.num_experts), dtype=np.int64)
            np.add.at(logical, (np.arange(self.n_layers)[:, None], m), g)  # physical -> logical
            rows.append(logical)
        self.counts.append(np.stack(rows))

    def history(self, source: str, several: bool) -> LayerHistory:
        """The files' history, ranks in ascending order (``several``: more than one file)."""
        if len(set(self.ranks)) != len(self.ranks):
            raise ZeppInputError(f"{source}: two files claim the same rank ({sorted(self.ranks)}); give one file "
                                 f"per rank")
        layers = self.req.model_layers(self.n_layers, source, "last_physical_to_logical_map")
        order = np.argsort(self.ranks)
        if self.per_token:
            return self._token_history(source, layers, order, several)
        return self._count_history(source, layers, order, several)

    def _token_history(self, source: str, layers: tuple[int, ...], order: np.ndarray, several: bool) -> LayerHistory:
        spec, e = self.req.spec, self.num_experts
        traces, token_ranks, kept = [], [], []
        for li in range(self.n_layers):
            if spec is not None and layers[li] not in spec.moe_layers:
                continue
            pieces = [self.tokens[li][j] for j in order]
            ids = np.concatenate([a for _, a in pieces])
            if ids.shape[0] == 0:
                continue
            ek = check_ids(ids, e, self.req.top_k, f"{source} (layer {layers[li]})", "row (0-based)",
                           self.req.allow_duplicates)
            traces.append(Trace(ids.astype(np.int32), ek, f"{source}:layer{layers[li]}"))
            token_ranks.append(np.concatenate([np.full(len(a), j, dtype=np.int64) for j, (_, a) in enumerate(pieces)]))
            kept.append(layers[li])
        if not traces:
            raise ZeppInputError(f"{source}: no MoE layer holds any token")
        if not several:
            token_ranks = [None] * len(traces)
        return LayerHistory(source, "sglang-per-token", e, traces[0].top_k, tuple(kept), tuple(traces),
                            sources="ranks" if several else "none", token_ranks=tuple(token_ranks))

    def _count_history(self, source: str, layers: tuple[int, ...], order: np.ndarray, several: bool) -> LayerHistory:
        notes = []
        passes = {c.shape[0] for c in self.counts}
        steps = min(passes)
        if len(passes) > 1:
            notes.append(f"ranks recorded different pass counts {sorted(passes)}; the first {steps} of each are used")
        arr = np.stack([self.counts[j][:steps] for j in order], axis=2)  # [passes, L, S, E]
        c = bin_steps(arr, 0).transpose(1, 0, 2, 3)  # [L, B, S, E]
        keep = self.req.moe_rows(layers, c)
        return LayerHistory(source, "sglang-per-pass", self.num_experts, self.req.k, tuple(layers[i] for i in keep),
                            counts=c[keep], sources="ranks" if several else "none", notes=tuple(notes))
