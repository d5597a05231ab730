"""Engine placement files out: every format written, checked against the engine's loading rules
(../shared/INTEROP.md, SGLang's expert_location.py) and read back; placements with redundancy
counted in total, as the engines count it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine_recordings import E, MODEL, SPEC, recorder_folder
from zepp.errors import ZeppInputError
from zepp.interop import read_placement_file, write_placement
from zepp.interop.history import read_history
from zepp.interop.layers import physical_experts, plan_layers
from zepp.planner.types import Placement
from zepp.traces import read_load_histogram


def test_every_format_round_trips(tmp_path):
    pytest.importorskip("torch")
    recorder_folder(tmp_path / "rec", np.random.default_rng(5))
    ep, _ = plan_layers(read_history(tmp_path / "rec", MODEL), SPEC, 2, 4, 16, "zepp")
    for fmt, suffix in (("sglang", ".json"), ("sglang", ".pt"), ("trtllm", ".yaml"), ("vllm", ".pt"),
                        ("vllm", ".json"), ("zepp", ".json")):
        f = tmp_path / f"p_{fmt}{suffix}"
        write_placement(f, ep, fmt)
        assert read_placement_file(f, fmt, SPEC, 2, 4).same_as(ep), (fmt, suffix)


# ---------------------------------------------------------------- SGLang


@pytest.mark.parametrize("suffix", [".json", ".pt"])
def test_sglang_placement_round_trip(tmp_path, suffix):
    if suffix == ".pt":
        pytest.importorskip("torch")
    from zepp.interop.sglang import read_placement, write_init_expert_location, write_logical_count

    pl = Placement(np.array([[0, 1, 4], [2, 3, 0], [4, 5, 1], [6, 7, 2]]), 8, gpus_per_node=2)
    write_init_expert_location(tmp_path / f"loc{suffix}", pl, layers=3)
    back = read_placement(tmp_path / f"loc{suffix}", num_experts=8, ranks=4, gpus_per_node=2, layer=2)
    assert np.array_equal(back.slot_expert, pl.slot_expert)
    with pytest.raises(ZeppInputError, match="do not split evenly over 5 ranks"):
        read_placement(tmp_path / f"loc{suffix}", num_experts=8, ranks=5, gpus_per_node=1)
    write_logical_count(tmp_path / f"c{suffix}", np.array([3, 1, 2]), layers=2)
    assert read_load_histogram(tmp_path / f"c{suffix}", layer=1).tolist() == [3, 1, 2]


def test_sglang_refuses_empty_slots(tmp_path):
    from zepp.interop.sglang import write_init_expert_location

    pl = Placement(np.array([[0, 1], [2, -1]]), 3, gpus_per_node=1)
    with pytest.raises(ZeppInputError, match=r"1 empty slot\(s\) \(first: rank 1, slot 1\)"):
        write_init_expert_location(tmp_path / "x.json", pl)


def test_float_slots_in_placement_files_refused(tmp_path):
    torch = pytest.importorskip("torch")
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


def test_sglang_rules_refuse_extra_keys_rows_and_missing_experts():
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


# ---------------------------------------------------------------- TensorRT-LLM


def test_trtllm_rules():
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


# ---------------------------------------------------------------- redundancy in total


def test_redundant_must_divide():
    with pytest.raises(ZeppInputError, match=r"64 experts \+ 5 redundant = 69 physical experts, not divisible by the 8 "
                                             r"GPUs.*use --redundant 0 or 8"):
        physical_experts(64, 8, 5)


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
