"""Fuzzing every reader (``tests/files/fuzzing.py``): valid files mutated as a careless or
hostile user would (types, nesting, sizes, truncation, encodings), each read must keep the
contract: a valid result, or one ``ZeppInputError`` line naming the file, within 10 s; never
another exception, never a hang. What a reader accepts is also checked to be usable (a history's
top-k within its experts, a cluster's figures finite, a config transformers can build)."""

from __future__ import annotations

import functools
import json
import math
import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import FUZZ, HOSTILE, holds_contract, mutated_bytes, mutated_value

OLMOE_LOAD = {"logical_count": [[3] * 64 for _ in range(16)], "experts": 64, "top_k": 8, "layers": 16,
              "system": "a2av", "nodes": 1, "gpus_per_node": 2}
CLUSTER = {"base": "h100-8", "nodes": 2, "nic_bw": 4.6e10, "name": "mine", "weight_copy_bw": None}
PROMPTS = {"input_ids": [[1, 2, 3], [4, 5]], "max_new_tokens": [2, 3]}
CONFIG = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
          "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6,
          "rope_theta": 1e6, "max_position_embeddings": 512, "tie_word_embeddings": False, "norm_topk_prob": True,
          "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "float32", "bos_token_id": 0,
          "eos_token_id": 1}
META = {"num_experts": 64, "num_experts_per_token": 6}


def check_history(h) -> None:
    """What a reader returns as a history is usable: top-k within the experts, shapes agreeing."""
    assert isinstance(h.num_experts, int) and h.num_experts >= 1
    assert h.top_k is None or 1 <= h.top_k <= h.num_experts
    if h.counts is not None:
        assert h.counts.ndim == 4 and h.counts.shape[-1] == h.num_experts and h.counts.dtype == np.int64
    h.describe()


def read_maybe_mangled(data, p, model: str) -> None:
    """Read the history file ``p`` (its bytes mutated, or not) as ``model``'s: the contract holds."""
    from zepp.interop.history import read_history

    if data.draw(st.booleans()):
        p.write_bytes(data.draw(mutated_bytes(p.read_bytes())))
    h = holds_contract(lambda: read_history(p, model=model), str(p))
    if h is not None:
        check_history(h)


@FUZZ
@given(case=mutated_value(CLUSTER), suffix=st.sampled_from([".json", ".yaml"]))
def test_cluster_file(tmp_path_factory, case, suffix):
    from zepp.cluster import load_cluster_file

    p = tmp_path_factory.mktemp("c") / ("c" + suffix)
    p.write_text(case[0])
    c = holds_contract(lambda: load_cluster_file(p), str(p))
    if c is not None:
        assert all(math.isfinite(getattr(c, f)) for f in ("nvlink_bw", "nic_bw", "peak_flops", "hbm_bw"))
        assert c.name.isprintable() and c.nodes >= 1


@FUZZ
@given(raw=mutated_bytes(json.dumps(CLUSTER).encode()))
def test_cluster_file_bytes(tmp_path_factory, raw):
    from zepp.cluster import load_cluster_file

    p = tmp_path_factory.mktemp("c") / "c.yaml"
    p.write_bytes(raw)
    holds_contract(lambda: load_cluster_file(p), str(p))


@FUZZ
@given(case=mutated_value(PROMPTS))
def test_prompt_file(tmp_path_factory, case):
    from zepp.cli.generate import read_requests

    p = tmp_path_factory.mktemp("p") / "prompts.json"
    p.write_text(case[0])
    got = holds_contract(lambda: read_requests(str(p), 128, 4), str(p))
    if got is not None:
        reqs, per = got
        assert all(isinstance(t, int) and 0 <= t < 128 for r in reqs for t in r)
        assert len(per) == len(reqs) and all(1 <= m <= 4 for m in per)


@functools.cache
def _transformers_loaded(d) -> None:
    """Build the valid config's skeleton once (imports transformers and torch's compiler stack:
    slow on a loaded machine, and no part of what a bad config costs)."""
    from zepp.serve.loader import moe_shape, read_config

    (d / "config.json").write_text(json.dumps(CONFIG))
    moe_shape(read_config(d))


@FUZZ
@given(case=mutated_value(CONFIG))
def test_checkpoint_config(tmp_path_factory, case):
    from zepp.serve.ckpt_check import read_config_json
    from zepp.serve.loader import moe_shape, read_config

    _transformers_loaded(tmp_path_factory.getbasetemp())
    d = tmp_path_factory.mktemp("ck")
    (d / "config.json").write_text(case[0])
    if holds_contract(lambda: read_config_json(d), str(d)) is not None:  # accepted: transformers builds it
        holds_contract(lambda: moe_shape(read_config(d)), str(d), "model type", "model 'served'")


@FUZZ
@given(case=mutated_value(OLMOE_LOAD))
def test_recorder_load_json(tmp_path_factory, case):
    from zepp.interop.history import read_history

    d = tmp_path_factory.mktemp("rec")
    (d / "load.json").write_text(case[0])
    h = holds_contract(lambda: read_history(d, model="olmoe"), str(d))
    if h is not None:
        check_history(h)


@FUZZ
@given(case=mutated_value(META))
def test_trtllm_meta(tmp_path_factory, case):
    from safetensors.numpy import save_file

    from zepp.interop.history import read_history

    d = tmp_path_factory.mktemp("trt")
    (d / "meta_info.json").write_text(case[0])
    save_file({f"0_{layer}": np.full(64, 2, np.int32) for layer in range(1, 27)}, str(d / "rank0.safetensors"))
    h = holds_contract(lambda: read_history(d, model="deepseek-v2-lite"), str(d))
    if h is not None:
        check_history(h)


def _safetensors_file(p):
    from safetensors.numpy import save_file

    save_file({"a": np.ones((2, 3), np.float32), "b": np.arange(4, dtype=np.int64)}, str(p), metadata={"k": "v"})
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


@FUZZ
@given(data=st.data())
def test_safetensors_header(tmp_path_factory, data):
    from zepp.files import read_safetensors_header

    p = tmp_path_factory.mktemp("st") / "model.safetensors"
    head, body = _safetensors_file(p)
    if data.draw(st.booleans()):
        text = data.draw(mutated_value(head))[0].encode()
        p.write_bytes(struct.pack("<Q", len(text)) + text + body)
    else:
        p.write_bytes(data.draw(mutated_bytes(p.read_bytes())))
    got = holds_contract(lambda: read_safetensors_header(p), str(p))
    if got is not None:
        assert all(isinstance(k, str) and len(v) == 2 for k, v in got.items())


@FUZZ
@given(data=st.data())
def test_vllm_npz(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("v") / "window.npz"
    dtype = data.draw(st.sampled_from(["int64", "int32", "uint8", "float64", "bool", "complex64", "U2"]))
    shape = data.draw(st.sampled_from([(4, 16, 64), (16, 64), (4, 7, 64), (4, 16, 32), (0, 16, 64), (4, 16, 64, 1)]))
    w = np.ones(shape, dtype=dtype)
    m = np.tile(np.arange(64), (16, 1)).astype(data.draw(st.sampled_from(["int64", "float32", "int8"])))
    np.savez(p, expert_load_window=w, physical_to_logical_map=m)
    read_maybe_mangled(data, p, "olmoe")


@FUZZ
@given(data=st.data())
def test_sglang_per_pass(tmp_path_factory, data):
    import torch

    p = tmp_path_factory.mktemp("sg") / "rank0.pt"
    rec = {"rank": data.draw(st.one_of(st.just(0), HOSTILE)),
           "global_physical_count": torch.ones((27, 72), dtype=data.draw(st.sampled_from(
               [torch.int64, torch.int32, torch.float32, torch.float64, torch.bool])))}
    m = torch.arange(72).remainder(64).repeat(data.draw(st.sampled_from([27, 5])), 1)
    obj = {"records": [rec], "last_physical_to_logical_map": m}
    key = data.draw(st.sampled_from([None, "records", "last_physical_to_logical_map"]))
    if key is not None:
        obj[key] = data.draw(HOSTILE)
    torch.save(obj, p)
    read_maybe_mangled(data, p, "deepseek-v2-lite")


@FUZZ
@given(data=st.data())
def test_text_trace(tmp_path_factory, data):
    from zepp.traces import read_trace

    p = tmp_path_factory.mktemp("t") / "trace.txt"
    rows = np.argsort(np.random.default_rng(0).random((30, 16)), axis=1)[:, :2]
    p.write_bytes(data.draw(mutated_bytes("".join(f"{a} {b}\n" for a, b in rows).encode())))
    t = holds_contract(lambda: read_trace(p), str(p))
    if t is not None:
        assert t.topk_ids.min() >= 0 and t.topk_ids.max() < t.num_experts


@FUZZ
@given(case=mutated_value({"rows": [{"cluster": "a100", "nodes": 1, "gpus_per_node": 4, "model": "k2",
                                      "budget_mb": 1.0, "latency_ms": {"a2av": 1.5}, "lower_bound_ms": 0.1,
                                      "measured_ms": None, "variant": {},
                                      "run": {"systems": ["a2av"], "iters": 1, "warmup": 0, "seed": 0,
                                              "traces": None}}]}))
def test_resume_file(tmp_path_factory, case):
    from zepp.sim.bench_table import load_resume

    p = tmp_path_factory.mktemp("r") / "bench.json"
    p.write_text(case[0])
    rows = holds_contract(lambda: load_resume(p), str(p))
    if rows is not None:
        assert all(isinstance(r, dict) for r in rows)


@FUZZ
@given(data=st.data())
def test_sglang_rank_folder(tmp_path_factory, data):
    """Two ranks' dumps of one recording, the second changed: its mode, map, rank or top-k."""
    import torch

    from zepp.interop.history import read_history

    d = tmp_path_factory.mktemp("sgdir")
    per_token = data.draw(st.booleans())
    for r in range(2):
        changed = r == 1
        e = data.draw(st.sampled_from([64, 60])) if changed else 64
        k = data.draw(st.sampled_from([6, 4])) if changed else 6
        m = torch.arange(72).remainder(e).repeat(data.draw(st.sampled_from([27, 26])) if changed else 27, 1)
        mode = data.draw(st.booleans()) if changed else per_token
        rec = ({"topk_ids_of_layer": torch.randint(0, 72, (27, 5, k))} if mode
               else {"global_physical_count": torch.ones((27, 72), dtype=torch.int64)})
        rec["rank"] = data.draw(st.sampled_from([1, 0, 2])) if changed else 0
        torch.save({"records": [rec], "last_physical_to_logical_map": m}, d / f"rank{r}.pt")
    h = holds_contract(lambda: read_history(d, model=data.draw(st.sampled_from([None, "deepseek-v2-lite"]))), str(d))
    if h is not None:
        check_history(h)
