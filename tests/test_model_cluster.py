"""Model and cluster presets: the figures PAPER.md gives, overrides, and bad values."""

from __future__ import annotations

import json

import pytest

from zepp.cluster import cluster_preset, load_cluster_file
from zepp.errors import ZeppInputError
from zepp.model import PRESET_NAMES, TRACE_DIR_OF, model_preset


@pytest.mark.parametrize(
    "model, tokens",
    [
        ("k2", {1: 72, 4: 296, 16: 1168, 64: 4680}),
        ("qwen", {1: 128, 4: 512, 16: 2048, 64: 8192}),
        ("qwen3-30b", {1: 256, 4: 1024, 16: 4096}),
    ],
)
def test_tokens_for_budget_matches_paper(model, tokens):
    spec = model_preset(model)
    for mb, want in tokens.items():
        assert spec.tokens_for_budget(mb) == want


def test_presets_have_paper_shapes():
    want = {
        "k2": (384, 8, 7168, 2048),
        "qwen": (128, 8, 4096, 1536),
        "qwen3-30b": (128, 8, 2048, 768),
        "deepseek-v3": (256, 8, 7168, 2048),
        "deepseek-v2-lite": (64, 6, 2048, 1408),
        "llama4-maverick": (128, 1, 5120, 8192),
        "mixtral": (8, 2, 4096, 14336),
        "olmoe": (64, 8, 2048, 1024),
    }
    assert set(PRESET_NAMES) == set(want)
    for name, shape in want.items():
        s = model_preset(name)
        assert (s.num_experts, s.top_k, s.hidden, s.ffn) == shape
    k2 = model_preset("k2")
    assert k2.row_bytes == 7168 * 2
    assert k2.expert_weight_bytes == 2 * 7168 * 2048 * 2  # 58.7 MB per expert, as PAPER.md 7
    assert set(TRACE_DIR_OF) == {"k2", "qwen"}


def test_model_overrides_field_by_field():
    s = model_preset("k2", experts=256, topk=4, hidden=None)
    assert (s.num_experts, s.top_k, s.hidden) == (256, 4, 7168)
    assert model_preset("qwen", ffn=1024).ffn == 1024
    with pytest.raises(ZeppInputError, match="unknown model field"):
        model_preset("k2", width=3)
    with pytest.raises(ZeppInputError, match="unknown model preset 'gpt'"):
        model_preset("gpt")
    with pytest.raises(ZeppInputError, match="top_k=9 exceeds num_experts=8"):
        model_preset("mixtral", topk=9)
    with pytest.raises(ZeppInputError, match="hidden must be a positive integer"):
        model_preset("k2", hidden=0)


def test_budget_too_small_for_one_token():
    k2 = model_preset("k2")
    with pytest.raises(ZeppInputError) as exc:
        k2.tokens_for_budget(0.01)
    msg = str(exc.value)
    assert "too small for one token" in msg and "'k2'" in msg and "use a budget above" in msg
    # the suggested budget is enough
    smallest = float(msg.rsplit("above ", 1)[1].split()[0])
    assert k2.tokens_for_budget(smallest * 1.01) == 8
    for bad in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(ZeppInputError, match="positive, finite number of MB"):
            k2.tokens_for_budget(bad)


def test_cluster_presets():
    a = cluster_preset("a100", nodes=4)
    assert a.ranks == 16 and a.gpus_per_node == 4 and a.nic_bw == 25e9 and a.peak_flops == 312e12
    assert a.node_of(5) == 1 and a.local_of(5) == 1
    h = cluster_preset("h100", nodes=16)
    assert h.ranks == 64 and h.peak_flops == 989e12 and h.hbm_bw == 4.0e12
    assert a.with_(nodes=8).ranks == 32
    with pytest.raises(ZeppInputError, match="unknown cluster preset"):
        cluster_preset("tpu", nodes=4)
    with pytest.raises(ZeppInputError, match="nodes must be a positive integer"):
        cluster_preset("a100", nodes=0)


def test_todays_presets_and_cluster_file(tmp_path):
    h = cluster_preset("h100", 4)
    assert h.gpus_per_node == 4 and h.nvlink_bw == 370e9 / 3 and h.nic_bw == 25e9  # unchanged (weak-scaling table)
    for name, l in (("h100-8", 8), ("h200-8", 8), ("gb200-nvl72", 72)):
        c = cluster_preset(name, 2)
        assert c.gpus_per_node == l and c.nic_bw == 46e9
    (tmp_path / "c.yaml").write_text("base: h200-8\nnodes: 3\nnic_bw: 5.0e10\n")
    c = load_cluster_file(tmp_path / "c.yaml")
    assert (c.nodes, c.gpus_per_node, c.nic_bw, c.hbm_bw) == (3, 8, 5e10, 4.8e12)
    (tmp_path / "c.json").write_text(json.dumps({"nodes": 2, "gpus_per_node": 4, "nic_bw": 1e10, "nvlink_bw": 1e11,
                                                 "peak_flops": 1e15, "hbm_bw": 3e12}))
    assert load_cluster_file(tmp_path / "c.json").nic_bw == 1e10
    for text, needle in (("nodes: 2\nnic_speed: 3\n", "unknown field 'nic_speed'"),
                         ("nodes: 2\nnic_bw: fast\n", "field 'nic_bw' must be a finite number"),
                         ("nodes: 0\n", "field 'nodes' must be a positive integer"),
                         ("base: tpu\nnodes: 1\n", "field 'base': unknown preset 'tpu'"),
                         ("nodes: [1\n", "not valid YAML")):
        (tmp_path / "b.yaml").write_text(text)
        with pytest.raises(ZeppInputError, match=needle):
            load_cluster_file(tmp_path / "b.yaml")


def test_a_cluster_file_means_the_same_to_every_command(tmp_path):
    """The simulator keeps the hardware figures a cluster file sets (``plan`` and ``place`` both
    simulate through ``on_network``); a preset keeps the calibration's; fields the simulator does
    not read are named in a note; every numeric field has a stated range."""
    from zepp.cluster import _FIELDS, FIELD_RANGES
    from zepp.sim.calibrate import HARDWARE, on_network, unused_note

    (tmp_path / "c.yaml").write_text("base: a100\nnodes: 2\ngemm_eff_max: 0.3\nnic_msg_cost: 5e-5\n")
    cl = load_cluster_file(tmp_path / "c.yaml")
    sim, _ = on_network(cl)
    assert sim.gemm_eff_max == 0.3 and sim.gemm_rows_half == HARDWARE["a100"]["gemm_rows_half"]
    assert on_network(cluster_preset("a100", 2))[0].gemm_eff_max == HARDWARE["a100"]["gemm_eff_max"]
    assert on_network(cluster_preset("h200-8", 2))[0].gemm_eff_max == HARDWARE["h200-8"]["gemm_eff_max"] == 0.72
    assert "nic_msg_cost" in unused_note(cl) and unused_note(cluster_preset("a100", 2)) is None
    assert set(FIELD_RANGES) == set(_FIELDS) - {"name"}
    (tmp_path / "d.yaml").write_text("nodes: 2\nkernel_launch: -1e-6\n")
    with pytest.raises(ZeppInputError, match=r"field 'kernel_launch' must be a finite number in \[0, 0.01\]"):
        load_cluster_file(tmp_path / "d.yaml")


def test_readme_lists_every_cluster_file_field_with_its_range():
    from pathlib import Path

    from zepp.cluster import FIELD_RANGES, field_ranges_markdown

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert field_ranges_markdown() in readme, "README's cluster-file table differs from zepp.cluster.FIELD_RANGES"
    assert all(f"| `{k}` |" in field_ranges_markdown() for k in FIELD_RANGES)
