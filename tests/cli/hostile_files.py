"""Hostile input files for the reading section of the bad-input table (issue 29's families):
each fixture is a valid file of its kind broken one way, made in the case's folder.

``make(kind, spec, tmp, tiny)`` for the placeholders ``{KIND:SPEC}`` of ``KINDS``; called by
``refusal.materialise``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

DEEP = "[" * 5000 + "]" * 5000
LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
YAML_TEXTS = {  # cluster files
    "laughs": LAUGHS + "nodes: *i\n", "laughs_name": LAUGHS + "name: *i\n", "octal": "gpus_per_node: 010",
    "octal_nodes": "nodes: 02", "base60": "nic_msg_cost: 1:30", "base_list": "base: [a100]",
    "base_map": "base: {a100: 1}", "huge_int": "nic_bw: " + "9" * 400, "huge_nodes": "nodes: " + "9" * 400,
    "name_escape": 'name: "a\\x1b[31mred"', "name_nul": 'name: "a\\0b"', "name_bidi": 'name: "a\\u202eb"',
    "deep": "name: " + "[" * 100 + "]" * 100, "dup_nested": "base: h100-8\nname: a\nname: b",
}
JSON_TEXTS = {  # cluster files in JSON
    "deep": '{"name": ' + DEEP + "}", "huge_int": '{"nic_bw": ' + "9" * 400 + "}", "inf": '{"nic_bw": 1e400}',
}
KINDS = ("yaml", "cjson", "deep", "ptext", "ckdup", "ckfifo", "rec", "sglang", "vllm", "trt", "fifojson")


def _ck(tiny: Path, tmp: Path) -> Path:
    d = tmp / "ck"
    shutil.copytree(tiny, d)
    return d


def _recorder(tmp: Path, load: dict | str | None, layer_files: int = 0) -> str:
    """A zepp recorder folder for olmoe (64 experts, top-8): ``layer_files`` traces and ``load``."""
    d = tmp / "rec"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(layer_files):
        ids = np.argsort(rng.random((40, 64)), axis=1)[:, :8]
        (d / f"layer_{i:03d}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
    if load is not None:
        (d / "load.json").write_text(load if isinstance(load, str) else json.dumps(load))
    return str(d)


def _load(rows=16, experts=64, **fields) -> dict:
    return {"logical_count": [[3] * experts for _ in range(rows)], "experts": experts, "top_k": 8, **fields}


RECORDERS = {
    "topk_gt_experts": lambda t: _recorder(t, _load(top_k=65)),
    "layers_field": lambda t: _recorder(t, _load(layers=3)),
    "unknown_key": lambda t: _recorder(t, _load(xperts=3)),
    "dup_key": lambda t: _recorder(t, json.dumps(_load())[:-1] + ', "top_k": 8}'),
    "topk_vs_model": lambda t: _recorder(t, _load(top_k=2)),
    "vs_traces_topk": lambda t: _recorder(t, _load(rows=2, top_k=4), layer_files=2),
    "vs_traces_experts": lambda t: _recorder(t, _load(rows=2, experts=32), layer_files=2),
    "vs_traces_layers": lambda t: _recorder(t, _load(rows=5), layer_files=2),
    "deep": lambda t: _recorder(t, '{"logical_count": ' + DEEP + "}"),
    "fifo": lambda t: (lambda d: (os.mkfifo(Path(d) / "load.json"), d)[1])(_recorder(t, None)),
}


def _sglang(tmp: Path, spec: str) -> str:
    """An SGLang per_pass dump of deepseek-v2-lite (27 layers, 64 experts, 72 slots) whose rank is ``spec``."""
    import torch

    rank = {"string": "zero", "list": [1, 2], "float": 1.5, "negative": -1, "huge": 10**30,
            "tensor": torch.tensor([0, 1])}[spec]
    m = torch.arange(72).remainder(64).repeat(27, 1)
    rec = {"rank": rank, "global_physical_count": torch.ones((27, 72), dtype=torch.int64)}
    p = tmp / "rank0.pt"
    torch.save({"records": [rec], "last_physical_to_logical_map": m}, p)
    return str(p)


def _vllm(tmp: Path, spec: str) -> str:
    """A vLLM load window for olmoe (16 MoE layers, 64 experts) broken as ``spec`` says."""
    w, m = np.ones((4, 16, 64), np.int64), np.tile(np.arange(64), (16, 1))
    if spec == "layers":
        w, m = w[:, :7], m[:7]
    elif spec == "experts":
        w, m = w[..., :32], m[:, :32]
    elif spec == "strings":
        w = np.full((4, 16, 64), "a")
    elif spec == "bool":
        w = w.astype(bool)
    p = tmp / "window.npz"
    np.savez(p, expert_load_window=w, physical_to_logical_map=m)
    return str(p)


def _trt(tmp: Path, meta: str) -> str:
    """TensorRT-LLM statistics of olmoe (64 experts, top-8) whose meta_info.json is ``meta``."""
    from safetensors.numpy import save_file

    d = tmp / "trt"
    d.mkdir()
    (d / "meta_info.json").write_text(meta)
    save_file({f"0_{layer}": np.full(64, 2, np.int32) for layer in range(16)}, str(d / "rank0.safetensors"))
    return str(d)


TRT_META = {"deep": '{"num_experts": 64, "num_experts_per_token": 8, "x": ' + DEEP + "}",
            "topk_gt": '{"num_experts": 64, "num_experts_per_token": 80}',
            "dup": '{"num_experts": 64, "num_experts": 64, "num_experts_per_token": 8}',
            "string": '{"num_experts": "64", "num_experts_per_token": 8}'}


def _deep(spec: str, tmp: Path, tiny: Path | None) -> str:
    """A file of kind ``spec`` holding a value nested 5000 deep."""
    if spec == "prompts":
        (tmp / "prompts.json").write_text('{"input_ids": ' + DEEP + "}")
        return str(tmp / "prompts.json")
    if spec == "resume":
        (tmp / "bench.json").write_text('{"rows": ' + DEEP + "}")
        return str(tmp / "bench.json")
    d = _ck(tiny, tmp)
    if spec == "config":
        (d / "config.json").write_text('{"x": ' + DEEP + "}")
    elif spec == "index":
        (d / "model.safetensors.index.json").write_text('{"weight_map": ' + DEEP + "}")
    else:  # the safetensors header
        st = d / "model.safetensors"
        raw = st.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        head = ('{"__metadata__": {"a": ' + DEEP + "}}").encode()
        st.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n:])
    return str(d)


def _ck_fifo(spec: str, tmp: Path, tiny: Path) -> str:
    d = _ck(tiny, tmp)
    name = {"weights": "extra.safetensors", "index": "model.safetensors.index.json"}[spec]
    os.mkfifo(d / name)
    return str(d)


def _file(tmp: Path, name: str, text: str) -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


def make(kind: str, spec: str, tmp: Path, tiny: Path | None) -> str:
    """The fixture ``{kind:spec}`` made in ``tmp`` (``tiny``: the tiny checkpoint, for copies)."""
    if kind == "yaml":
        return _file(tmp, "c.yaml", YAML_TEXTS[spec] + "\n")
    if kind == "cjson":
        return _file(tmp, "c.json", JSON_TEXTS[spec])
    if kind == "deep":
        return _deep(spec, tmp, tiny)
    if kind == "ptext":  # an --input-ids file's text
        return _file(tmp, "prompts.json", {"dup": '{"input_ids": [[1]], "input_ids": [[2, 3]]}',
                                           "unknown": '{"input_ids": [[1, 2]], "max_new_token": [5]}',
                                           "huge": '{"input_ids": [[' + "9" * 30 + "]]}",
                                           "nan": '{"input_ids": [[1]], "max_new_tokens": [NaN]}'}[spec])
    if kind == "ckdup":  # config.json naming hidden_size twice
        d = _ck(tiny, tmp)
        text = (d / "config.json").read_text().rstrip()
        (d / "config.json").write_text(text[:-1] + ', "hidden_size": 64}')
        return str(d)
    if kind == "ckfifo":
        return _ck_fifo(spec, tmp, tiny)
    if kind == "rec":
        return RECORDERS[spec](tmp)
    if kind == "sglang":
        return _sglang(tmp, spec)
    if kind == "vllm":
        return _vllm(tmp, spec)
    if kind == "trt":
        return _trt(tmp, TRT_META[spec])
    if kind == "fifojson":
        os.mkfifo(tmp / spec)
        return str(tmp / spec)
    raise AssertionError(f"unknown fixture {kind}")
