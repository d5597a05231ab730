"""``zepp place``: options checked before any work (one line each), the report's figures, and
the report JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zepp.cli import main

BASE = ["place", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2",
        "--redundant", "4", "--format", "zepp"]


def run_cli(argv, capsys):
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("extra, needle", [
    (["--out", "/nonexistent-dir/p.json"], "folder /nonexistent-dir does not exist"),
    (["--budget-mb", "inf"], "--budget-mb must be a finite number"),
    (["--heldout", "1.5"], "--heldout must lie in [0, 1)"),
    (["--policy", "best"], "--policy 'best': choose one of home, zepp, eplb"),
    (["--routing", "fastest"], "--routing 'fastest'"),
    (["--dispatch", "a2av", "--combine", "reduce"], "needs a relay or zepp dispatch"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'"),
    (["--relaxation", "nan"], "--relaxation must be a finite number"),
])
def test_bad_options_are_one_line_before_any_work(tmp_path, capsys, extra, needle):
    argv = BASE + (["--out", str(tmp_path / "p.json")] if "--out" not in extra else []) + extra
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert "history:" not in out  # nothing was read or planned
    assert not (tmp_path / "p.json").exists()


def test_wrong_suffix_for_format(tmp_path, capsys):
    code, _, err = run_cli(BASE[:-1] + ["trtllm", "--out", str(tmp_path / "p.json")], capsys)
    assert code == 2 and "--format trtllm writes .yaml or .yml files" in err


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
