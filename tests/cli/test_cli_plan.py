"""``zepp plan`` end to end: the table, --json, --dump, and one clear error per bad trace file (bad options:
``tests/cli/test_cli_bad_inputs.py``)."""

import json

import numpy as np
import pytest

from clirun import run_cli


def write_trace(tmp_path, rows, name="t.txt"):
    path = tmp_path / name
    path.write_text("".join(" ".join(map(str, r)) + "\n" for r in rows))
    return str(path)


def small_trace(tmp_path, experts=16, k=2, n=400, seed=0):
    rng = np.random.default_rng(seed)
    rows = [rng.choice(experts, size=k, replace=False) for _ in range(n)]
    return write_trace(tmp_path, rows)


SMALL = ["--model", "olmoe", "--experts", "16", "--topk", "2", "--hidden", "64", "--nodes", "2",
         "--gpus-per-node", "2", "--budget-mb", "0.01", "--iters", "2"]


def test_plan_table_json_and_dump(tmp_path, capsys):
    trace = small_trace(tmp_path)
    out_json, dump = tmp_path / "plan.json", tmp_path / "dump"
    code, out, err = run_cli(["plan", *SMALL, "--trace", trace, "--history", trace, "--systems", "all",
                              "--json", str(out_json), "--dump", str(dump)], capsys)
    assert code == 0, err
    assert "every plan validated" in out
    from zepp.registry import SYSTEMS, names_for, variants

    for system in names_for("plan"):  # "all" = every system plan supports; a meta-system = its variants
        if SYSTEMS[system].best_of:
            assert f"\n{system} " not in out
            assert all(f"\n{v} " in out for v in variants(system, "plan"))
        else:
            assert f"\n{system} " in out
    assert "\nzepp " not in out
    payload = json.loads(out_json.read_text())
    rows = {r["system"]: r for r in payload["systems"]}
    assert payload["tokens_per_gpu"] == 82  # round(0.01 * 2**20 / 128 / 2) * 2
    assert rows["zepp-overlap"]["busiest_nic_bytes"] <= rows["a2av"]["busiest_nic_bytes"]
    # The dump is checkable without zepp: each entry's slot holds its expert.
    data = np.load(dump / "zepp-overlap_iter1.npz")
    ids, slot, slot_expert = data["topk_ids"], data["slot"], data["slot_expert"]
    assert ids.shape == slot.shape == (4, 82, 2)
    assert (slot_expert.ravel()[slot] == ids).all()


def test_plan_on_real_trace(traces_dir, capsys):
    code, out, err = run_cli(["plan", "--model", "qwen", "--nodes", "2", "--budget-mb", "1", "--iters", "1",
                              "--history", str(traces_dir / "qwen3" / "pool.txt"),
                              "--trace", str(traces_dir / "qwen3" / "eval.txt"), "--systems", "zepp,a2av,relay"],
                             capsys)
    assert code == 0, err
    assert "128 tokens/GPU" in out


@pytest.mark.parametrize("rows, extra_args, message", [
    ([[0, 1], [2, 99]], [], r"line 2.*99"),  # id out of range
    ([[0, 1], [2, 3, 4], [1, 2]], [], r"line 2"),  # ragged row
    ([[0, 1, 2], [2, 3, 4]], [], r"3 ids|k|top"),  # wrong k (model is top-2)
    ([], [], r"empty"),  # empty file
])
def test_bad_trace_gives_one_clear_error(tmp_path, capsys, rows, extra_args, message):
    trace = write_trace(tmp_path, rows)
    code, out, err = run_cli(["plan", *SMALL, "--trace", trace, *extra_args], capsys)
    assert code == 2
    assert "Traceback" not in err
    assert err.startswith("zepp: error:") and len(err.strip().splitlines()) == 1
    assert "t.txt" in err
    import re
    assert re.search(message, err), err


def test_simulated_time_where_the_cluster_has_network_figures(tmp_path, capsys):
    """``sim_ms`` on the preset's network (fitted a100, DeepEP's published h100-8 through a
    cluster file's base), none for a cluster the simulator has no figures for."""
    trace = small_trace(tmp_path)
    (tmp_path / "mine.yaml").write_text("nodes: 2\n")
    (tmp_path / "based.yaml").write_text("base: h100-8\n")
    sim = {}
    for name, extra in (("a100", []), ("mine", ["--cluster-file", str(tmp_path / "mine.yaml")]),
                        ("based", ["--cluster-file", str(tmp_path / "based.yaml")])):
        out_json = tmp_path / f"{name}.json"
        code, _, err = run_cli(["plan", *SMALL, "--trace", trace, "--systems", "a2av,fast", *extra,
                                "--json", str(out_json)], capsys)
        assert code == 0, err
        sim[name] = {r["system"]: r["sim_ms"] for r in json.loads(out_json.read_text())["systems"]}
    assert sim["a100"]["a2av"] > 0 and sim["based"]["a2av"] > 0 and sim["mine"]["a2av"] is None
    assert sim["a100"]["fast"] is None  # its special phases replace the FlowPlan's phases
