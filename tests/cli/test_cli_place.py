"""``zepp place``: the file each engine loads
written from its own recording, the report's figures, and the report JSON (bad options: ``tests/cli/test_cli_bad_inputs.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clirun import run_cli
from engine_recordings import E, MODEL, SPEC, copies_per_node, sglang_stat_dump, trtllm_stats, vllm_window

BASE = ["place", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2",
        "--redundant", "4", "--format", "zepp"]


def test_report_figures_and_json(tmp_path, capsys):
    rep = tmp_path / "r.json"
    code, out, err = run_cli(BASE + ["--out", str(tmp_path / "p.json"), "--report", str(rep), "--iters", "1",
                                     "--budget-mb", "0.5"], capsys)
    assert code == 0, err
    assert "synthetic:olmoe/pool(profile=qwen" in out  # the skew profile is named
    assert f"wrote {rep}" in out and "held-out window" in out
    d = json.loads(rep.read_text())
    figs = d["figures"]
    assert {f["config"] for f in figs} == {"eplb", "engine+zepp-place", "zepp-route", "zepp-full"}
    assert {f["window"] for f in figs} == {"history", "held-out"}
    assert len({f["layer"] for f in figs}) == 16  # every OLMoE layer
    for f in figs:
        assert f["busiest_nic_bytes"] > 0 and f["busiest_gpu_rows"] > 0
        assert f["inter_node_bytes"] >= f["busiest_nic_bytes"]
        # the first --sim-layers (default 2) layers are simulated on the cluster
        assert (f["sim_ms"] is not None) == (f["layer"] in (0, 1)) and (f["sim_ms"] is None or f["sim_ms"] > 0)
    assert "sim layer ms: zepp.sim on h100-8 with DeepEP's published network figures" in out
    # the "x eplb" column of the eplb rows is 1.00 by construction; zepp's routing never costs
    # more NIC bytes than the engine's choice on the same placement by more than noise
    tot = {}
    for f in figs:
        if f["window"] == "held-out":
            tot[f["config"]] = tot.get(f["config"], 0) + f["busiest_nic_bytes"]
    assert tot["zepp-route"] <= 1.02 * tot["engine+zepp-place"]


def test_place_is_deterministic(tmp_path, capsys):
    for name in ("a.json", "b.json"):
        code, _, err = run_cli(BASE + ["--out", str(tmp_path / name), "--no-report"], capsys)
        assert code == 0, err
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    d = json.loads((tmp_path / "a.json").read_text())
    assert d["format"] == "zepp-placement/1" and d["num_physical"] == 68
    rows = np.array(d["layers"]["0"])
    assert rows.shape == (4, 17)


# ---------------------------------------------------------------- each engine's file from its own recording


def test_place_on_sglang_stat_dump_writes_what_sglang_loads(tmp_path, capsys):
    pytest.importorskip("torch")
    lc = sglang_stat_dump(tmp_path / "expert_distribution_recorder_1.pt", np.random.default_rng(0))
    out = tmp_path / "loc.json"
    code, text, err = run_cli(["place", "--history", str(tmp_path / "expert_distribution_recorder_1.pt"),
                               "--model", MODEL, "--nodes", "2", "--gpus-per-node", "4", "--redundant", "16",
                               "--format", "sglang", "--out", str(out), "--no-report"], capsys)
    assert code == 0, err
    assert "no source ranks" in text and "every node assumed to ask for each expert in equal share" in text
    assert f"wrote {out} (sglang, zepp placement, read back identical)" in text
    assert "no expert has two copies on one node" in text
    obj = json.loads(out.read_text())
    # SGLang's rules: exactly one key (it is splatted into init_by_mapping), one row per model
    # layer, ints, P = E + redundant divisible by the EP size, every expert in every row
    assert list(obj) == ["physical_to_logical_map"]
    m = np.array(obj["physical_to_logical_map"])
    assert m.dtype.kind == "i" and m.shape == (SPEC.num_layers, E + 16) and m.shape[1] % 8 == 0
    assert all(set(row.tolist()) == set(range(E)) for row in m)
    assert m[0].tolist() == (np.arange(E + 16) % E).tolist()  # dense layer: SGLang's trivial row
    load = lc.sum(axis=0)
    for layer in SPEC.moe_layers:
        per_node = copies_per_node(m[layer], 2)
        assert per_node.max() == 1  # Zepp's rule: never two copies of an expert on one node
        copies = per_node.sum(axis=0)
        hot = np.argsort(-load[layer])[:8]
        assert copies[hot].min() == 2 and copies.min() == 1  # hot experts have the extra copies


@pytest.mark.parametrize("raw", [False, True])
def test_place_on_trtllm_statistics_writes_the_load_balancer_yaml(tmp_path, capsys, raw):
    pytest.importorskip("torch")
    import yaml

    trtllm_stats(tmp_path / "stats", np.random.default_rng(3), raw)
    out = tmp_path / "lb.yaml"
    code, text, err = run_cli(["place", "--history", str(tmp_path / "stats"), "--model", MODEL, "--nodes", "2",
                               "--gpus-per-node", "4", "--redundant", "8", "--format", "trtllm", "--out", str(out),
                               "--iters", "1", "--budget-mb", "0.2"], capsys)
    assert code == 0, err
    y = yaml.safe_load(out.read_text())
    assert set(y) == {"num_slots", "initial_global_assignments", "layer_updates_per_iter"}
    assert y["num_slots"] == 72 and y["num_slots"] % 8 == 0 and y["layer_updates_per_iter"] == 0
    assert sorted(y["initial_global_assignments"]) == list(SPEC.moe_layers)  # MoE layers only, model index
    for row in y["initial_global_assignments"].values():
        assert len(row) == 72 and set(row) == set(range(E))
        assert copies_per_node(np.array(row), 2).max() == 1
    assert "what it buys" in text and "held-out window" in text and "busiest NIC MiB" in text


def test_place_on_vllm_window_writes_eplb_maps_and_ascend_json(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    window, p2l = vllm_window(np.random.default_rng(4))
    m = len(SPEC.moe_layers)
    torch.save({"expert_load_window": torch.from_numpy(window), "physical_to_logical_map": torch.from_numpy(p2l)},
               tmp_path / "w.pt")
    for suffix in (".pt", ".json"):
        out = tmp_path / f"v{suffix}"
        code, text, err = run_cli(["place", "--history", str(tmp_path / "w.pt"), "--model", MODEL, "--nodes", "2",
                                   "--gpus-per-node", "4", "--redundant", "16", "--format", "vllm", "--out", str(out),
                                   "--no-report"], capsys)
        assert code == 0, err
    maps = torch.load(tmp_path / "v.pt")
    assert sorted(maps) == ["logical_replica_count", "logical_to_physical_map", "physical_to_logical_map"]
    pm, lp, cnt = (maps[k].numpy() for k in ("physical_to_logical_map", "logical_to_physical_map",
                                             "logical_replica_count"))
    assert pm.shape == (m, 80) and lp.shape == (m, E, 17) and cnt.shape == (m, E)
    for layer in range(m):  # vLLM's rule: replica r of expert e is its r-th physical slot, ascending
        for e in range(E):
            slots = np.flatnonzero(pm[layer] == e)
            assert lp[layer, e, :cnt[layer, e]].tolist() == slots.tolist() and (lp[layer, e, cnt[layer, e]:] == -1).all()
    asc = json.loads((tmp_path / "v.json").read_text())
    assert asc["moe_layer_count"] == m and len(asc["layer_list"]) == m
    dev = asc["layer_list"][0]["device_list"]
    assert len(dev) == 8 and sum(dev[0]["device_expert"] == pm[0][:10].tolist() for _ in [0]) == 1
