"""Engine histories in, engine placement files out: every format read, written, checked against
the engine's loading rules (../shared/INTEROP.md, SGLang's expert_location.py) and read back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zepp.cli import main
from zepp.errors import ZeppInputError
from zepp.interop.history import read_history
from zepp.interop import read_placement_file, write_placement
from zepp.interop.layers import physical_experts, plan_layers
from zepp.model import model_preset

torch = pytest.importorskip("torch")

MODEL = "deepseek-v2-lite"  # 27 layers, the first dense, 64 experts, top-6
SPEC = model_preset(MODEL)
E, K = SPEC.num_experts, SPEC.top_k


def run_cli(argv, capsys):
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def skewed_counts(rng, steps, layers, e, dense=(0,)):
    pop = rng.pareto(1.2, size=(layers, e)) + 0.05
    c = rng.poisson(pop[None] * 40, size=(steps, layers, e)).astype(np.int64)
    c[:, list(dense)] = 0
    return c


def copies_per_node(row, nodes):
    node = np.arange(row.size) // (row.size // nodes)
    return np.bincount(node * E + row, minlength=nodes * E).reshape(nodes, E)


# ---------------------------------------------------------------- SGLang


def test_place_on_sglang_stat_dump_writes_what_sglang_loads(tmp_path, capsys):
    rng = np.random.default_rng(0)
    lc = skewed_counts(rng, 4, SPEC.num_layers, E)
    torch.save({"rank": 0, "logical_count": torch.from_numpy(lc), "average_utilization_rate_over_window": 0.5},
               tmp_path / "expert_distribution_recorder_1.pt")
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


def test_sglang_per_token_dumps_map_physical_to_logical(tmp_path):
    rng = np.random.default_rng(1)
    p = 80
    p2l = np.stack([np.concatenate([rng.permutation(E), rng.integers(0, E, p - E)]) for _ in range(SPEC.num_layers)])
    logical = {}
    for rank in range(2):
        recs = []
        for fp in range(2):
            lid = np.stack([np.argsort(rng.random((5, E)), axis=1)[:, :K] for _ in range(SPEC.num_layers)])
            # physical ids: one physical copy of each chosen logical expert
            inv = np.argsort(p2l[:, :E], axis=1)  # logical -> a physical id holding it
            phys = np.take_along_axis(inv[:, None, :].repeat(5, 1), lid, axis=2)
            phys[:, -1] = -1  # a padded token row
            recs.append({"forward_pass_id": fp, "rank": rank, "gatherer_key": "primary",
                         "global_physical_count": torch.zeros(SPEC.num_layers, p, dtype=torch.int32),
                         "topk_ids_of_layer": torch.from_numpy(phys.astype(np.int32))})
            logical.setdefault(rank, []).append(lid[:, :-1])
        torch.save({"records": recs, "last_physical_to_logical_map": torch.from_numpy(p2l)},
                   tmp_path / f"expert_distribution_recorder_7_{rank}.pt")
    h = read_history(tmp_path, MODEL)
    assert h.format == "sglang-per-token" and h.form == "tokens" and h.layers == SPEC.moe_layers
    want = np.concatenate([np.concatenate(logical[r], axis=1) for r in range(2)], axis=1)  # [L, rows, k]
    assert np.array_equal(h.tokens[0].topk_ids, want[1])
    assert h.token_ranks[0].tolist() == [0] * 8 + [1] * 8
    hist, how = h.node_demand(0, 2, 1)  # 2 ranks recorded, 2 planned: the recorded ranks count
    assert "recorded ranks" in how and hist.sum() == 16 * K


def test_sglang_per_pass_counts_per_rank(tmp_path):
    rng = np.random.default_rng(2)
    p = 72
    p2l = np.tile(np.arange(p) % E, (SPEC.num_layers, 1))
    for rank in range(2):
        recs = [{"forward_pass_id": i, "rank": rank,
                 "global_physical_count": torch.from_numpy(rng.integers(0, 5, (SPEC.num_layers, p)))} for i in range(3)]
        torch.save({"records": recs, "last_physical_to_logical_map": torch.from_numpy(p2l)}, tmp_path / f"d_{rank}.pt")
    h = read_history(tmp_path, MODEL)
    assert h.format == "sglang-per-pass" and h.sources == "ranks" and h.counts.shape == (26, 3, 2, E)
    g = torch.load(tmp_path / "d_0.pt")["records"][0]["global_physical_count"].numpy()
    assert h.counts[0, 0, 0, 0] == g[1, 0] + g[1, 64]  # physical 0 and 64 both hold logical 0
    assert "recorded source ranks grouped" in h.node_demand(0, 2, 4)[1]


# ---------------------------------------------------------------- TensorRT-LLM


def _trtllm_stats(d: Path, rng, raw=False):
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "meta_info.json").write_text(json.dumps({"num_experts": E, "num_experts_per_token": K}))
    for r in range(4):
        data = {}
        for it in range(3):
            for layer in SPEC.moe_layers:
                ids = np.argsort(rng.random((6, E)) ** (1 + (np.arange(E) < 4) * 5), axis=1)[:, :K]
                data[f"{it}_{layer}"] = ids.astype(np.int32) if raw else np.bincount(ids.ravel(), minlength=E).astype(
                    np.int32)
        save_file(data, str(d / (f"rank{r}_raw.safetensors" if raw else f"rank{r}.safetensors")))


@pytest.mark.parametrize("raw", [False, True])
def test_trtllm_statistics_to_load_balancer_yaml(tmp_path, capsys, raw):
    import yaml

    _trtllm_stats(tmp_path / "stats", np.random.default_rng(3), raw)
    h = read_history(tmp_path / "stats", MODEL)
    assert h.format == ("trtllm-raw" if raw else "trtllm") and h.layers == SPEC.moe_layers
    assert (h.form == "tokens") == raw and h.sources == "ranks"
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


# ---------------------------------------------------------------- vLLM


def test_vllm_window_to_eplb_maps_and_ascend_json(tmp_path, capsys):
    rng = np.random.default_rng(4)
    m = len(SPEC.moe_layers)
    p2l = np.tile(np.concatenate([np.arange(E), np.arange(8)]), (m, 1))
    window = rng.integers(0, 9, size=(12, m, E + 8)).astype(np.int32)
    torch.save({"expert_load_window": torch.from_numpy(window), "physical_to_logical_map": torch.from_numpy(p2l)},
               tmp_path / "w.pt")
    h = read_history(tmp_path / "w.pt", MODEL)
    assert h.format == "vllm" and h.counts.shape == (m, 10, 1, E)
    np.savez(tmp_path / "w.npz", expert_load_window=window, physical_to_logical_map=p2l)
    assert np.array_equal(read_history(tmp_path / "w.npz", MODEL).counts, h.counts)
    np.savez(tmp_path / "f.npz", expert_load_window=window + 0.5, physical_to_logical_map=p2l)
    with pytest.raises(ZeppInputError, match=r"expert_load_window: counts must be integers, found \d+\.5 at index \[0, 0, 0\]"):
        read_history(tmp_path / "f.npz", MODEL)
    assert h.counts[0, :, 0, 3].sum() == window[:, 0, 3].sum() + window[:, 0, E + 3].sum()
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


# ---------------------------------------------------------------- zepp recorder and text


def test_zepp_recorder_folder_and_round_trip_every_format(tmp_path):
    rng = np.random.default_rng(5)
    d = tmp_path / "rec"
    d.mkdir()
    for i in range(3):  # MoE layer ordinals, as zepp.serve's recorder writes them
        ids = np.argsort(rng.random((200, E)), axis=1)[:, :K]
        (d / f"layer_{i:03d}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
    h = read_history(d, MODEL)
    assert h.format == "zepp-recorder" and h.layers == SPEC.moe_layers[:3]
    ep, _ = plan_layers(h, SPEC, 2, 4, 16, "zepp")
    assert sorted(ep.maps) == list(SPEC.moe_layers) and "without records" in ep.notes[0]
    for fmt, suffix in (("sglang", ".json"), ("sglang", ".pt"), ("trtllm", ".yaml"), ("vllm", ".pt"),
                        ("vllm", ".json"), ("zepp", ".json")):
        f = tmp_path / f"p_{fmt}{suffix}"
        write_placement(f, ep, fmt)
        assert read_placement_file(f, fmt, SPEC, 2, 4).same_as(ep), (fmt, suffix)
    # load.json only, as zepp.serve.rank.write_record writes it
    from zepp.serve.rank import write_record

    lc = rng.integers(0, 9, (len(SPEC.moe_layers), E))
    write_record(str(tmp_path / "rec2"), [[] for _ in SPEC.moe_layers], lc,
                 {"experts": E, "top_k": K, "layers": len(SPEC.moe_layers)})
    for f in (tmp_path / "rec2").glob("layer_*.txt"):
        f.unlink()  # empty traces: keep only the histogram
    h2 = read_history(tmp_path / "rec2", MODEL)
    assert h2.form == "counts" and h2.sources == "none" and h2.layers == SPEC.moe_layers
    assert np.array_equal(h2.counts[:, 0, 0], lc)


def test_text_trace_is_one_layer_for_every_moe_layer(tmp_path):
    rng = np.random.default_rng(6)
    ids = np.argsort(rng.random((300, E)), axis=1)[:, :K]
    (tmp_path / "t.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
    h = read_history(tmp_path / "t.txt", MODEL)
    ep, how = plan_layers(h, SPEC, 2, 4, 8, "eplb")
    assert len({tuple(v) for v in ep.maps.values()}) == 1 and len(ep.maps) == len(SPEC.moe_layers)


# ---------------------------------------------------------------- bad input: one line each


def test_redundant_must_divide(capsys, tmp_path):
    with pytest.raises(ZeppInputError, match=r"64 experts \+ 5 redundant = 69 physical experts, not divisible by the 8 "
                                             r"GPUs.*use --redundant 0 or 8"):
        physical_experts(64, 8, 5)
    code, _, err = run_cli(["place", "--history", "synthetic", "--model", MODEL, "--nodes", "2", "--gpus-per-node", "4",
                            "--redundant", "5", "--format", "sglang", "--out", str(tmp_path / "x.json")], capsys)
    assert code == 2 and err.count("\n") == 1 and "not divisible by the 8 GPUs" in err
    assert not (tmp_path / "x.json").exists()


def test_float_slots_in_placement_files_refused(tmp_path):
    from zepp.interop.sglang import read_placement

    row = (np.arange(72) % E).tolist()
    bad = [list(row) for _ in range(SPEC.num_layers)]
    bad[3][5] = 5.5
    (tmp_path / "f.json").write_text(json.dumps({"physical_to_logical_map": bad}))
    with pytest.raises(ZeppInputError, match=r"logical expert ids must be integers, found 5\.5 at index \[3, 5\]"):
        read_placement_file(tmp_path / "f.json", "sglang", SPEC, 2, 4)
    torch.save({"physical_to_logical_map": torch.tensor([[0.0, 1.5, 2.0, 3.0]])}, tmp_path / "f.pt")
    with pytest.raises(ZeppInputError, match=r"found 1\.5.*refused rather than truncated"):
        read_placement(tmp_path / "f.pt", num_experts=4, ranks=2, gpus_per_node=1)


def test_sglang_rules_refuse_extra_keys_rows_and_missing_experts(tmp_path):
    from zepp.interop.sglang import check_file_object

    row = np.arange(72) % E
    good = np.tile(row, (SPEC.num_layers, 1))
    check_file_object({"physical_to_logical_map": good}, "f", SPEC.num_layers, E, 8)
    with pytest.raises(ZeppInputError, match="no other key may be present"):
        check_file_object({"physical_to_logical_map": good, "logical_count": 1}, "f", SPEC.num_layers, E, 8)
    with pytest.raises(ZeppInputError, match="one per model layer"):
        check_file_object({"physical_to_logical_map": good[1:]}, "f", SPEC.num_layers, E, 8)
    with pytest.raises(ZeppInputError, match="not divisible by the 16 GPUs"):
        check_file_object({"physical_to_logical_map": good}, "f", SPEC.num_layers, E, 16)
    g2 = good.copy()
    g2[4, g2[4] == 9] = 10
    with pytest.raises(ZeppInputError, match="layer 4 has no copy of expert 9"):
        check_file_object({"physical_to_logical_map": g2}, "f", SPEC.num_layers, E, 8)


def test_trtllm_rules(tmp_path):
    from zepp.interop.trtllm import check_file_object

    row = (np.arange(72) % E).tolist()
    ok = {"num_slots": 72, "layer_updates_per_iter": 0, "initial_global_assignments": {1: row}}
    check_file_object(ok, "f", SPEC, 8)
    for change, needle in (({"num_slots": 70}, "not divisible by the EP size 8"),
                           ({"initial_global_assignments": {0: row}}, "layer 0 is not a MoE layer"),
                           ({"initial_global_assignments": {1: row[:-1]}}, "must list num_slots = 72"),
                           ({"extra": 1}, "unknown field")):
        with pytest.raises(ZeppInputError, match=needle):
            check_file_object({**ok, **change}, "f", SPEC, 8)


def test_history_errors_name_the_field(tmp_path):
    d = tmp_path / "trt"
    d.mkdir()
    (d / "meta_info.json").write_text(json.dumps({"num_experts": E, "num_experts_per_token": 1.5}))
    with pytest.raises(ZeppInputError, match=r"meta_info.json: field 'num_experts_per_token' must be a positive integer"):
        read_history(d, MODEL)
    torch.save({"expert_load_window": torch.zeros(2, 3, 4)}, tmp_path / "w.pt")
    with pytest.raises(ZeppInputError, match="no 'physical_to_logical_map'"):
        read_history(tmp_path / "w.pt")
    torch.save({"records": [{"rank": 0}]}, tmp_path / "r.pt")
    with pytest.raises(ZeppInputError, match="no 'last_physical_to_logical_map'"):
        read_history(tmp_path / "r.pt")


# ---------------------------------------------------------------- clusters and trace folders


def test_cluster_presets_and_file(tmp_path):
    from zepp.cluster import cluster_preset, load_cluster_file

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


@pytest.mark.parametrize("model", ["deepseek-v3", "mixtral", "qwen"])
def test_load_model_traces_any_preset(tmp_path, model):
    from zepp.traces import load_model_traces

    spec = model_preset(model)
    rng = np.random.default_rng(0)
    sub = tmp_path / ("qwen3" if model == "qwen" else model)
    sub.mkdir()
    for w in ("pool", "eval"):
        ids = np.argsort(rng.random((50, spec.num_experts)), axis=1)[:, :spec.top_k]
        (sub / f"{w}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
    pool, ev = load_model_traces(tmp_path, model)
    assert pool.num_experts == spec.num_experts and ev.top_k == spec.top_k


@pytest.mark.parametrize("nodes, gpus, experts, extra", [(2, 4, 64, 2), (4, 4, 128, 3), (3, 2, 48, 1)])
def test_total_redundancy_zepp_equals_place_zepp_where_both_apply(nodes, gpus, experts, extra):
    """place_zepp_slots (any slots per GPU) gives zepp.planner.placement.place_zepp's placement when E
    is a multiple of the GPU count, and works where it is not (E = 128 on 24 GPUs)."""
    from zepp.interop.layers import place_zepp_slots
    from zepp.planner.placement import place_zepp

    h = np.random.default_rng(nodes).integers(0, 100, (nodes, experts))
    a = place_zepp(h, gpus, extra)
    b = place_zepp_slots(h, gpus, experts // (nodes * gpus) + extra)
    assert np.array_equal(a.slot_expert, b.slot_expert)
    c = place_zepp_slots(np.random.default_rng(0).integers(0, 100, (3, 128)), 8, 6)  # 144 slots, 128 experts
    assert (c.slot_expert >= 0).all() and c.replica_count.min() == 1
    per_node = np.zeros((3, 128), int)
    for r in range(24):
        np.add.at(per_node[r // 8], c.slot_expert[r], 1)
    assert per_node.max() == 1
