"""A checkpoint folder checked before any rank starts (``zepp generate``): ``check_checkpoint``.

- ``config.json`` parses, is a mapping, and its size fields are integers in range
  (``zepp.serve.config_schema``); its ``model_type`` is one transformers knows (one line, not transformers'
  advice);
- every ``*.safetensors`` header is read (the 8-byte little-endian length and the JSON that
  follows, never the tensors): a file that is empty, truncated or corrupt is named;
- ``model.safetensors.index.json``, when present, parses and names files that exist and hold
  the tensors it maps;
- every tensor the ranks will read (``zepp.serve.loader``: every parameter and persistent
  buffer of the model, each expert's weights in either layout) is present with the shape the
  config implies.

NaN or infinite weights are found by the rank that reads them (``Checkpoint.read``), which
refuses with one line naming the tensor.
"""

from __future__ import annotations

from pathlib import Path

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import read_json, read_safetensors_header
from zepp.serve.config_schema import check_config

def check_folder(folder) -> Path:
    """The folder as a Path; one clear error when it is not a checkpoint folder (no torch imported)."""
    p = Path(folder)
    if not p.is_dir():
        raise ZeppInputError(f"--checkpoint {str(folder)!r} is not a folder")
    if not (p / "config.json").is_file():
        raise ZeppInputError(f"--checkpoint {str(folder)!r} has no config.json")
    if not list(p.glob("*.safetensors")):
        raise ZeppInputError(f"--checkpoint {str(folder)!r} has no .safetensors files (only safetensors are read)")
    return p


def _where(folder) -> str:
    return f"--checkpoint {str(folder)!r}"


def read_config_json(folder) -> dict:
    """``config.json`` as a mapping (``zepp.files`` rules: depth, size, duplicate keys), checked
    against its schema (``zepp.serve.config_schema``) and its ``model_type`` one transformers knows."""
    p = Path(folder) / "config.json"
    try:
        cfg = read_json(p, "config.json")
    except ZeppFileError:
        raise
    except ZeppInputError as exc:
        raise ZeppInputError(f"{_where(folder)}: config.json is not valid JSON ({str(exc)[:200]}); fix or re-export "
                             f"it") from None
    if not isinstance(cfg, dict):
        raise ZeppInputError(f"{_where(folder)}: config.json must be a JSON object, got {type(cfg).__name__}")
    check_config(p, cfg)
    _check_model_type(folder, cfg.get("model_type"))
    _check_named_choices(p, cfg)
    return cfg


def _check_model_type(folder, model_type) -> None:
    from transformers import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ZeppInputError(f"{_where(folder)}: config.json model_type {model_type!r} is not an architecture "
                             f"transformers knows; zepp serves MoE causal LMs such as qwen3_moe, qwen2_moe, "
                             f"mixtral, deepseek_v3")


def _check_named_choices(p: Path, cfg: dict) -> None:
    """The fields that name one of transformers' own tables: ``hidden_act``, the rope type."""
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    act = cfg.get("hidden_act")
    if act is not None and (not isinstance(act, str) or act not in ACT2FN):
        raise ZeppFileError(f"hidden_act {repr(act)[:40]} is not an activation transformers knows", p,
                            "'hidden_act'", f"use one of {', '.join(sorted(ACT2FN)[:8])}, ...")
    for key in ("rope_parameters", "rope_scaling"):
        block = cfg.get(key) or {}
        kind = block.get("rope_type", block.get("type"))
        if kind is not None and kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
            raise ZeppFileError(f"rope type {kind[:40]!r} is not one transformers knows", p, f"{key}.rope_type",
                                f"use default or one of {', '.join(ROPE_INIT_FUNCTIONS)}")


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (dtype, shape)}`` from a safetensors file's header (``zepp.files``)."""
    return read_safetensors_header(path)


def tensor_table(folder) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of the checkpoint: through its index file when present (which
    must parse and name files that exist and hold the tensors it maps), else every file's header."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if not (index.exists() or index.is_symlink()):  # present but not a regular file: refused by read_json
        table = {}
        for fn in sorted(folder.glob("*.safetensors")):
            table.update(read_header(fn))
        return table
    try:
        obj = read_json(index, "safetensors index")
    except ZeppFileError:
        raise
    except ZeppInputError:
        obj = None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise ZeppInputError(f"{index}: not a safetensors index (a JSON object with 'weight_map': {{tensor: file}}); "
                             f"fix or remove it")
    headers, table = {}, {}
    for name, fn in wm.items():
        p = folder / fn
        if Path(fn).name != fn or not p.is_file():
            raise ZeppInputError(f"{index}: tensor {name!r} is mapped to {fn!r}, which is not a file of the "
                                 f"checkpoint folder; fix the index")
        if fn not in headers:
            headers[fn] = read_header(p)
        if name not in headers[fn]:
            raise ZeppInputError(f"{index}: tensor {name!r} is mapped to {fn!r}, which does not hold it; fix the index")
        table[name] = headers[fn][name]
    return table


_PER_EXPERT = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def _resolve(table: dict, name: str) -> str | None:
    """The checkpoint's name for module tensor ``name`` (``zepp.serve.checkpoint.ALIASES``)."""
    from zepp.serve.checkpoint import ALIASES

    if name in table:
        return name
    for new, old in ALIASES:
        if name.replace(new, old) in table:
            return name.replace(new, old)
    return None


def _check_experts(folder, table: dict, prefix: str, E: int, F: int, H: int) -> None:
    """Every expert of the block at ``prefix``: stacked ``[E, 2F, H]`` / ``[E, H, F]``, or per
    expert ``[F, H]`` (gate, up) and ``[H, F]`` (down) in either naming."""
    gu, dn = _resolve(table, f"{prefix}.gate_up_proj"), _resolve(table, f"{prefix}.down_proj")
    if gu is not None and dn is not None:
        for key, want in ((gu, (E, 2 * F, H)), (dn, (E, H, F))):
            _same_shape(folder, key, table[key], want)
        return
    for e in range(E):
        names = None
        for g, u, d in _PER_EXPERT:
            keys = [_resolve(table, f"{prefix}.{e}.{w}.weight") for w in (g, u, d)]
            if keys[0] is not None:
                names = keys
                break
        if names is None or None in names:
            raise ZeppInputError(f"{folder}: no weights of expert {e} of {prefix} (config.json implies "
                                 f"{E} experts per MoE layer); the config does not match the stored weights")
        for key, want in zip(names, ((F, H), (F, H), (H, F))):
            _same_shape(folder, key, table[key], want)


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")  # what a weight may be stored as


def _same_shape(folder, key: str, entry: tuple, want: tuple) -> None:
    """Tensor ``key`` (``entry``: its ``(dtype, shape)``) is a floating-point tensor of shape ``want``."""
    dtype, have = entry
    if dtype not in FLOAT_DTYPES:
        raise ZeppInputError(f"{folder}: tensor {key} is stored as {dtype}, not floating point; the checkpoint's "
                             f"weights must be {', '.join(FLOAT_DTYPES)}: re-export it")
    if tuple(have) != tuple(want):
        raise ZeppInputError(f"{folder}: tensor {key} has shape {tuple(have)}, config.json implies {tuple(want)}; "
                             f"the config does not match the stored weights")


def check_tensors(folder, config) -> None:
    """Every tensor a rank reads is in the checkpoint with the shape ``config`` implies."""
    from zepp.serve.loader import persistent_shapes

    table = tensor_table(folder)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for name, shape in persistent_shapes(config).items():
        if name.endswith(".experts.gate_up_proj"):
            E, F2, H = shape
            _check_experts(folder, table, name.rsplit(".", 1)[0], E, F2 // 2, H)
            continue
        if name.endswith(".experts.down_proj"):
            continue  # checked with gate_up_proj
        key = _resolve(table, name)
        if key is None:
            if tied and name.endswith("lm_head.weight"):
                continue
            raise ZeppInputError(f"{folder}: no tensor {name} in the checkpoint, which config.json implies; the config "
                                 f"does not match the stored weights")
        _same_shape(folder, key, table[key], shape)
