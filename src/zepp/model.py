"""MoE layer shapes: expert count, top-k, hidden and FFN sizes, and the token budget rule."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class MoESpec:
    """One MoE layer: ``num_experts`` experts of ``hidden -> ffn -> hidden``, top-``top_k``."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    dtype_bytes: int = 2  # BF16 activations and weights
    num_layers: int = 1  # the model's num_hidden_layers, dense layers included
    first_dense: int = 0  # leading dense layers (DeepSeek's first_k_dense_replace)
    moe_every: int = 1  # MoE layer every n-th layer after them (Llama 4's interleave_moe_layer_step)
    expert_groups: int = 1  # DeepSeek-V3's n_group (EPLB's num_groups)

    def __post_init__(self) -> None:
        for field in ("num_experts", "top_k", "hidden", "ffn", "dtype_bytes", "num_layers", "moe_every",
                      "expert_groups"):
            value = getattr(self, field)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ZeppInputError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if isinstance(self.first_dense, bool) or int(self.first_dense) != self.first_dense or \
                not 0 <= self.first_dense < self.num_layers:
            raise ZeppInputError(f"model {self.name!r}: first_dense must be an integer in [0, num_layers), "
                                 f"got {self.first_dense!r}")
        if self.top_k > self.num_experts:
            raise ZeppInputError(
                f"model {self.name!r}: top_k={self.top_k} exceeds num_experts={self.num_experts}; lower --topk"
            )

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Model layer indices of the MoE layers (``first_dense``, then every ``moe_every``-th;
        with ``moe_every = 2`` the MoE layers are the odd ones after the dense prefix, as in
        Llama 4 Maverick)."""
        start = self.first_dense + self.moe_every - 1
        return tuple(range(start, self.num_layers, self.moe_every))

    @property
    def row_bytes(self) -> int:
        """Bytes of one hidden-state row (one token) on the wire."""
        return self.hidden * self.dtype_bytes

    @property
    def expert_weight_bytes(self) -> int:
        """Bytes of one expert's two weight matrices (``w1 [H, F]`` and ``w2 [F, H]``)."""
        return 2 * self.hidden * self.ffn * self.dtype_bytes

    @property
    def flops_per_row(self) -> int:
        """FLOPs of one row through one expert (two GEMMs, 2 FLOPs per multiply-add)."""
        return 4 * self.hidden * self.ffn

    def tokens_for_budget(self, mb: float) -> int:
        """Tokens per GPU for a message budget of ``mb`` MB, counted before top-k duplication.

        ``round(mb * 2**20 / (2 * hidden) / top_k) * top_k`` (PAPER.md section 3): 1/4/16 MB give
        72/296/1168 tokens for ``k2`` and 128/512/2048 for ``qwen``.
        """
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not math.isfinite(mb) or not mb > 0:
            raise ZeppInputError(f"budget must be a positive, finite number of MB, got {mb!r}")
        tokens = round(mb * 2**20 / (2 * self.hidden) / self.top_k) * self.top_k
        if tokens < 1:
            smallest = self.top_k * 2 * self.hidden / 2**20 / 2
            raise ZeppInputError(
                f"budget {mb} MB is too small for one token of model {self.name!r} "
                f"(hidden {self.hidden}, top-{self.top_k}); use a budget above {smallest:.4g} MB"
            )
        return tokens

    def with_(self, **changes) -> "MoESpec":
        """A copy with some fields replaced; ``None`` values are ignored."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes)


_PRESETS: dict[str, MoESpec] = {
    spec.name: spec
    for spec in (
        # layer counts: PAPER.md section 5 where it gives them, else the models' public configs
        # (num_hidden_layers, first_k_dense_replace, interleave_moe_layer_step, n_group)
        MoESpec("k2", num_experts=384, top_k=8, hidden=7168, ffn=2048, num_layers=61, first_dense=1),
        MoESpec("qwen", num_experts=128, top_k=8, hidden=4096, ffn=1536, num_layers=94),
        MoESpec("qwen3-30b", num_experts=128, top_k=8, hidden=2048, ffn=768, num_layers=48),
        MoESpec("deepseek-v3", num_experts=256, top_k=8, hidden=7168, ffn=2048, num_layers=61, first_dense=3,
                expert_groups=8),
        MoESpec("deepseek-v2-lite", num_experts=64, top_k=6, hidden=2048, ffn=1408, num_layers=27, first_dense=1),
        MoESpec("llama4-maverick", num_experts=128, top_k=1, hidden=5120, ffn=8192, num_layers=48, moe_every=2),
        MoESpec("mixtral", num_experts=8, top_k=2, hidden=4096, ffn=14336, num_layers=32),
        MoESpec("olmoe", num_experts=64, top_k=8, hidden=2048, ffn=1024, num_layers=16),
    )
}

PRESET_NAMES = tuple(_PRESETS)

# The folder of ../shared/traces that holds each model's recorded ids.
TRACE_DIR_OF = {"k2": "k2", "qwen": "qwen3"}
# Other folder names accepted for a preset in a trace directory (besides the preset's own name).
TRACE_DIR_ALIASES = {name: (d,) for name, d in TRACE_DIR_OF.items() if d != name}


def trace_dirs(name: str) -> tuple[str, ...]:
    """Folder names looked for, in order, for preset ``name`` in a ``--traces`` directory."""
    model_preset(name)
    return (name, *TRACE_DIR_ALIASES.get(name, ()))


def model_preset(name: str, **overrides) -> MoESpec:
    """The named model preset with optional field overrides (``experts``/``num_experts``,
    ``topk``/``top_k``, ``hidden``, ``ffn``); ``None`` overrides are ignored."""
    if name not in _PRESETS:
        raise ZeppInputError(f"unknown model preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    aliases = {"experts": "num_experts", "topk": "top_k"}
    changes = {aliases.get(k, k): v for k, v in overrides.items()}
    unknown = set(changes) - {f.name for f in dataclasses.fields(MoESpec)}
    if unknown:
        raise ZeppInputError(f"unknown model field(s) {sorted(unknown)}; use experts, topk, hidden, ffn")
    return _PRESETS[name].with_(**changes)
