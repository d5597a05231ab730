"""Zepp's table files for the engines (``zepp.interop.engine_tables``): written per MoE layer beside
the placement, read back equal, and every bad file one ``ZeppInputError`` naming the file and the
field (the plug-ins read them with ``read_tables``; tests/engines installs them in the engines)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from zepp.errors import ZeppInputError
from zepp.interop.engine_tables import plan_tables, read_tables, table_path, table_routing, write_tables
from zepp.interop.layers import plan_layers
from zepp.model import model_preset
from zepp.traces.synthetic import synthetic_history

NODES, GPN, REDUNDANT = 2, 4, 8


@pytest.fixture(scope="module")
def planned():
    spec = model_preset("olmoe")
    hist = synthetic_history("olmoe", seed=0)
    ep, _ = plan_layers(hist, spec, NODES, GPN, REDUNDANT, "zepp")
    return hist, ep


def test_table_files_sit_beside_the_placement():
    assert table_path("sglang", "/a/p.json").name == "p.zepp-table.json"
    assert table_path("sglang", "/a/p.pt").name == "p.zepp-table.pt"
    assert table_path("vllm", "/a/p.pt").name == "p.zepp-table.pt"
    assert table_path("vllm", "/a/p.json") is None  # vLLM-Ascend's file: no plug-in reads a table
    assert table_path("trtllm", "/a/p.yaml") is None and table_path("zepp", "/a/p.json") is None
    assert table_routing("sglang", 64) == "sglang-table" and table_routing("sglang", 4096) == "sglang-table-prefill"
    assert table_routing("vllm", 256) == "vllm-table" and table_routing("vllm", 257) == "vllm-table-prefill"


@pytest.mark.parametrize("fmt,suffix,tokens", [("sglang", ".json", 64), ("sglang", ".pt", 4096), ("vllm", ".pt", 64)])
def test_tables_written_read_back_equal(planned, tmp_path, fmt, suffix, tokens):
    hist, ep = planned
    tables = plan_tables(fmt, hist, ep, 0.25, tokens)
    p = tmp_path / f"t{suffix}"
    write_tables(p, fmt, ep, tables)
    back = read_tables(p)
    layers = sorted(ep.maps)
    assert back["layers"] == layers and back["ep_size"] == NODES * GPN
    assert np.array_equal(back["physical_to_logical_map"], np.stack([ep.maps[l] for l in layers]))
    if fmt == "sglang":
        assert np.array_equal(back["logical_to_rank_dispatch_physical_map"],
                              np.stack([tables[l].slot for l in layers], 1))
    else:
        assert back["objective"] == "nic" and back["width"] == 1024
        assert np.array_equal(back["counts"][0, :, :, :tables[layers[0]].counts.shape[2]], tables[layers[0]].counts)


def _sglang_file(planned, tmp_path) -> dict:
    hist, ep = planned
    p = tmp_path / "good.json"
    write_tables(p, "sglang", ep, plan_tables("sglang", hist, ep, 0.25, 64))
    return json.loads(p.read_text())


def _vllm_obj(planned, tmp_path) -> dict:
    hist, ep = planned
    p = tmp_path / "good.pt"
    write_tables(p, "vllm", ep, plan_tables("vllm", hist, ep, 0.25, 64))
    return torch.load(p)


def _refused(tmp_path, obj, match: str, suffix: str = ".json") -> None:
    p = tmp_path / f"bad{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps(obj))
    else:
        torch.save(obj, p)
    with pytest.raises(ZeppInputError, match=match) as exc:
        read_tables(p)
    assert str(p) in str(exc.value) and "\n" not in str(exc.value)


def test_bad_sglang_tables_are_named(planned, tmp_path):
    good = _sglang_file(planned, tmp_path)
    _refused(tmp_path, {"physical_to_logical_map": good["physical_to_logical_map"]}, "not a zepp table file")
    _refused(tmp_path, {k: v for k, v in good.items() if k != "layers"}, "missing: layers")
    _refused(tmp_path, dict(good, extra=1), "unexpected: extra")
    _refused(tmp_path, dict(good, ep_size=0), "ep_size must be an integer >= 1")
    _refused(tmp_path, dict(good, layers=good["layers"][:-1]), "layers must list each MoE layer once")
    m = np.array(good["logical_to_rank_dispatch_physical_map"])
    _refused(tmp_path, dict(good, logical_to_rank_dispatch_physical_map=m[:, :, :-1].tolist()), "has shape")
    wrong = m.copy()
    wrong[0, 0, 0] = wrong[0, 0, 1]  # expert 0's entry points at expert 1's copy
    _refused(tmp_path, dict(good, logical_to_rank_dispatch_physical_map=wrong.tolist()),
             "rank 0, layer row 0, expert 0 points at a physical slot that holds another expert")
    _refused(tmp_path, dict(good, logical_to_rank_dispatch_physical_map=(m + 0.5).tolist()), "integer")


def test_bad_vllm_tables_are_named(planned, tmp_path):
    good = _vllm_obj(planned, tmp_path)
    _refused(tmp_path, dict(good, objective="speed"), "objective must be one of nic, rows", ".pt")
    _refused(tmp_path, dict(good, width=1000), "width must be a power of two", ".pt")
    _refused(tmp_path, dict(good, relaxation=float("nan")), "relaxation must be a number", ".pt")
    counts = good["counts"].clone()
    counts[0, 0, 0, 0] += 1
    _refused(tmp_path, dict(good, counts=counts), "sum to 1", ".pt")
    _refused(tmp_path, dict(good, choices=good["choices"][:, :, :-1]), "must both be", ".pt")
