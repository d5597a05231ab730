"""Engine histories in: every engine's recording read by ``read_history`` into one
``LayerHistory`` (its layers, form, sources, node demand), and bad recordings refused with
one line naming the file and field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine_recordings import E, K, MODEL, SPEC, recorder_folder, trtllm_stats, vllm_window
from zepp.errors import ZeppInputError
from zepp.interop.history import read_history
from zepp.interop.layers import plan_layers

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- SGLang


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


@pytest.mark.parametrize("raw", [False, True])
def test_trtllm_statistics(tmp_path, raw):
    trtllm_stats(tmp_path / "stats", np.random.default_rng(3), raw)
    h = read_history(tmp_path / "stats", MODEL)
    assert h.format == ("trtllm-raw" if raw else "trtllm") and h.layers == SPEC.moe_layers
    assert (h.form == "tokens") == raw and h.sources == "ranks"


# ---------------------------------------------------------------- vLLM


def test_vllm_load_window_pt_and_npz(tmp_path):
    window, p2l = vllm_window(np.random.default_rng(4))
    m = len(SPEC.moe_layers)
    torch.save({"expert_load_window": torch.from_numpy(window), "physical_to_logical_map": torch.from_numpy(p2l)},
               tmp_path / "w.pt")
    h = read_history(tmp_path / "w.pt", MODEL)
    assert h.format == "vllm" and h.counts.shape == (m, 10, 1, E)
    np.savez(tmp_path / "w.npz", expert_load_window=window, physical_to_logical_map=p2l)
    assert np.array_equal(read_history(tmp_path / "w.npz", MODEL).counts, h.counts)
    np.savez(tmp_path / "f.npz", expert_load_window=window + 0.5, physical_to_logical_map=p2l)
    with pytest.raises(ZeppInputError,
                       match=r"expert_load_window: counts must be integers, found \d+\.5 at index \[0, 0, 0\]"):
        read_history(tmp_path / "f.npz", MODEL)
    assert h.counts[0, :, 0, 3].sum() == window[:, 0, 3].sum() + window[:, 0, E + 3].sum()


# ---------------------------------------------------------------- zepp recorder and text


def test_zepp_recorder_folder_layer_files_and_load_json(tmp_path):
    rng = np.random.default_rng(5)
    recorder_folder(tmp_path / "rec", rng)
    h = read_history(tmp_path / "rec", MODEL)
    assert h.format == "zepp-recorder" and h.layers == SPEC.moe_layers[:3]
    ep, _ = plan_layers(h, SPEC, 2, 4, 16, "zepp")
    assert sorted(ep.maps) == list(SPEC.moe_layers) and "without records" in ep.notes[0]
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
