"""The schema ``config.json`` is checked against before any rank reads it (``check_config``).

Each field zepp's ranks or transformers use to build the model is checked where the config has
it: size fields are integers in range (``CONFIG_INTS``), real-valued fields finite numbers in
their physical range (``CONFIG_FLOATS``: a negative ``rms_norm_eps`` or a NaN ``rope_theta``
builds a model that computes garbage without a word), switches booleans (``CONFIG_BOOLS``),
and the fields that must agree with each other do (top-k within the experts, query heads a
multiple of the key/value heads, token ids within the vocabulary, ``mlp_only_layers`` within
the layers). Every refusal names the checkpoint's ``config.json`` and the field.
"""

from __future__ import annotations

import math

from zepp.errors import ZeppFileError

# size fields: (low, high); each checked where the config has it (null: not set)
CONFIG_INTS = {
    "vocab_size": (1, 1 << 24), "hidden_size": (1, 1 << 17), "num_hidden_layers": (1, 4096),
    "num_attention_heads": (1, 4096), "num_key_value_heads": (1, 4096), "head_dim": (1, 1 << 14),
    "intermediate_size": (1, 1 << 20), "moe_intermediate_size": (1, 1 << 20),
    "max_position_embeddings": (1, 1 << 24), "num_experts": (1, 1 << 16), "num_local_experts": (1, 1 << 16),
    "n_routed_experts": (1, 1 << 16), "num_experts_per_tok": (1, 1024), "n_shared_experts": (0, 1024),
    "first_k_dense_replace": (0, 4096), "shared_expert_intermediate_size": (0, 1 << 20),
    "decoder_sparse_step": (1, 4096), "sliding_window": (1, 1 << 24), "max_window_layers": (0, 4096),
    "moe_layer_freq": (1, 4096), "n_group": (1, 1 << 16), "topk_group": (1, 1 << 16),
}
# real-valued fields: (low, high, low open): epsilons above zero, angles' base above zero,
# probabilities and fractions in [0, 1]
CONFIG_FLOATS = {
    "rms_norm_eps": (0.0, 1.0, True), "layer_norm_eps": (0.0, 1.0, True), "layer_norm_epsilon": (0.0, 1.0, True),
    "rope_theta": (0.0, 1e12, True), "initializer_range": (0.0, 10.0, False),
    "attention_dropout": (0.0, 1.0, False), "hidden_dropout": (0.0, 1.0, False),
    "router_aux_loss_coef": (0.0, 1e3, False), "routed_scaling_factor": (0.0, 1e6, True),
    "partial_rotary_factor": (0.0, 1.0, True), "router_jitter_noise": (0.0, 1.0, False),
}
CONFIG_BOOLS = ("tie_word_embeddings", "norm_topk_prob", "use_cache", "attention_bias", "output_router_logits",
                "use_sliding_window", "mlp_bias")
DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "auto")
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _fail(p, field: str, what: str, value) -> None:
    raise ZeppFileError(f"{what}, got {repr(value)[:60]}", p, repr(field), "fix config.json")


def _check_scalars(p, cfg: dict) -> None:
    for key, (lo, hi) in CONFIG_INTS.items():
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            _fail(p, key, f"{key} must be an integer in [{lo}, {hi}]", v)
    for key, (lo, hi, lo_open) in CONFIG_FLOATS.items():
        v = cfg.get(key)
        if v is None:
            continue
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not (ok and (v > lo if lo_open else v >= lo) and v <= hi):
            _fail(p, key, f"{key} must be a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]", v)
    for key in CONFIG_BOOLS:
        if key in cfg and not isinstance(cfg[key], bool):
            _fail(p, key, f"{key} must be true or false", cfg[key])
    for key in ("torch_dtype", "dtype"):
        if cfg.get(key) is not None and cfg[key] not in DTYPES:
            _fail(p, key, f"{key} must be one of {', '.join(DTYPES)}", cfg[key])


def _check_agreement(p, cfg: dict) -> None:
    experts = [cfg[k] for k in EXPERT_FIELDS if cfg.get(k) is not None]
    k = cfg.get("num_experts_per_tok")
    if k is not None and experts and k > min(experts):
        _fail(p, "num_experts_per_tok", f"num_experts_per_tok exceeds the {min(experts)} experts", k)
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        _fail(p, "num_key_value_heads", f"num_key_value_heads must divide num_attention_heads ({heads})", kv)
    vocab = cfg.get("vocab_size")
    for key in TOKEN_FIELDS:
        v = cfg.get(key)
        ids = v if isinstance(v, list) else [v]
        if v is not None and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                     and (vocab is None or t < vocab) for t in ids):
            _fail(p, key, f"{key} must be a token id (or list of them) in [0, {vocab})", v)
    layers, only = cfg.get("num_hidden_layers"), cfg.get("mlp_only_layers")
    if only is not None and not (isinstance(only, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < (layers or 1 << 12) for i in only)):
        _fail(p, "mlp_only_layers", f"mlp_only_layers must list layer indices in [0, {layers})", only)


ROPE_FIELDS = ("rope_parameters", "rope_scaling")  # transformers 5 nests rope_theta in rope_parameters
ROPE_FLOATS = {"rope_theta": (0.0, 1e12), "factor": (0.0, 1e6)}  # both above zero


def _check_rope(p, cfg: dict) -> None:
    for key in ROPE_FIELDS:
        block = cfg.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            _fail(p, key, f"{key} must be a mapping (rope_type, rope_theta, ...) or null", block)
        for name, (lo, hi) in ROPE_FLOATS.items():
            v = block.get(name)
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and lo < v <= hi):
                _fail(p, f"{key}.{name}", f"{key}.{name} must be a finite number in ({lo:g}, {hi:g}]", v)
        kind = block.get("rope_type", block.get("type"))
        if kind is not None and not isinstance(kind, str):
            _fail(p, f"{key}.rope_type", f"{key}.rope_type must be a name", kind)


def check_config(p, cfg: dict) -> None:
    """Refuse a ``config.json`` mapping ``cfg`` (read from ``p``) that breaks the schema (module docstring)."""
    _check_scalars(p, cfg)
    _check_agreement(p, cfg)
    _check_rope(p, cfg)
