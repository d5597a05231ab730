"""Checkpoint checks before any rank starts (``zepp.serve.ckpt_check``) on layouts the probe table
(``tests/cli/test_cli_bad_inputs.py``) does not build: good checkpoints of an aliased architecture
and of the stacked expert layout pass, a stacked tensor of the wrong shape is named; NaN weights
are refused by the reader a rank uses, and the launcher turns a rank's bad-input exit into one line."""

from __future__ import annotations

import json
import struct

import pytest
import torch

pytest.importorskip("transformers")

from zepp.errors import RankFailure, ZeppInputError  # noqa: E402
from zepp.launch.ranks import bad_input_found_by_ranks  # noqa: E402
from zepp.serve.checkpoint import Checkpoint  # noqa: E402
from zepp.serve.ckpt_check import check_tensors, read_config_json, read_header  # noqa: E402
from zepp.serve.loader import read_config  # noqa: E402
from zepp.serve.tiny import make_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return make_checkpoint(str(tmp_path_factory.mktemp("mixtral") / "ck"), "mixtral", experts=4, layers=2)


def _stacked_copy(src, dst) -> dict:
    """``src`` rewritten with transformers 5's stacked expert tensors; returns the tensors."""
    from safetensors.torch import load_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    t = load_file(str(src / "model.safetensors"))
    out = {k: v for k, v in t.items() if ".experts." not in k}
    for layer in range(2):
        src_p, p = f"model.layers.{layer}.block_sparse_moe.experts", f"model.layers.{layer}.mlp.experts"
        w = [(t[f"{src_p}.{e}.w1.weight"], t[f"{src_p}.{e}.w3.weight"], t[f"{src_p}.{e}.w2.weight"]) for e in range(4)]
        out[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u, _ in w])
        out[f"{p}.down_proj"] = torch.stack([d for _, _, d in w])
    return out


def test_good_checkpoints_pass_aliased_and_stacked(mixtral, tmp_path):
    from pathlib import Path

    from safetensors.torch import save_file

    read_config_json(mixtral)
    check_tensors(mixtral, read_config(mixtral))  # block_sparse_moe on disk, w1/w3/w2 per expert
    stacked = _stacked_copy(Path(mixtral), tmp_path / "stacked")
    save_file(stacked, str(tmp_path / "stacked" / "model.safetensors"))
    check_tensors(tmp_path / "stacked", read_config(tmp_path / "stacked"))
    key = "model.layers.1.mlp.experts.down_proj"
    stacked[key] = stacked[key][:3]  # one expert fewer than config.json says
    save_file(stacked, str(tmp_path / "stacked" / "model.safetensors"))
    with pytest.raises(ZeppInputError, match=f"tensor {key} has shape \\(3, "):
        check_tensors(tmp_path / "stacked", read_config(tmp_path / "stacked"))


def test_header_is_read_without_the_tensors(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 2), "b": torch.zeros(5, dtype=torch.bfloat16)}, str(tmp_path / "m.safetensors"))
    assert read_header(tmp_path / "m.safetensors") == {"a": ("F32", (3, 2)), "b": ("BF16", (5,))}
    raw = (tmp_path / "m.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    assert sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in head.items() if k != "__metadata__") == 34


def test_nan_weights_are_refused_naming_the_tensor(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text("{}")
    bad = torch.ones(4, 6, 5)
    bad[2, 0, 0] = float("inf")
    save_file({"w": torch.tensor([1.0, float("nan")]), "ok": torch.ones(2), "m.experts.gate_up_proj": bad},
              str(tmp_path / "model.safetensors"))
    ck = Checkpoint(tmp_path)
    assert torch.equal(ck.read("ok"), torch.ones(2))
    with pytest.raises(ZeppInputError, match="tensor w holds NaN or Inf"):
        ck.read("w")
    assert torch.equal(ck.read_row("m.experts.gate_up_proj", 1), torch.ones(6, 5))
    with pytest.raises(ZeppInputError, match=r"tensor m.experts.gate_up_proj\[2\] holds NaN or Inf"):
        ck.read_row("m.experts.gate_up_proj", 2)


def test_bad_input_a_rank_found_becomes_one_line():
    errs = ["zepp generate rank 0: communication failed (peer)", "zepp generate rank 1: error: f: tensor w holds NaN"]
    exc = RankFailure("x", first=1, codes=[3, 4], errs=errs, culprits=[1])
    assert bad_input_found_by_ranks(exc) == "f: tensor w holds NaN (found by rank 1)"
    died = RankFailure("x", first=1, codes=[3, 17], errs=errs, culprits=[1])
    assert bad_input_found_by_ranks(died) is None  # a crash stays a crash (exit 3)
    mixed = RankFailure("x", first=0, codes=[5, 4], errs=errs, culprits=[0, 1])
    assert bad_input_found_by_ranks(mixed) is None
