"""``zepp ablation`` and the ``--schedule`` option of ``zepp bench`` / ``plan`` / ``timeline``:
the drift schedule's topic mix is reported with the results (bad values: the bad-input table in
``test_cli_bad_inputs.py``)."""

from __future__ import annotations

import json

from clirun import run_cli


def test_ablation_writes_table_json_and_plot(tmp_path, capsys):
    js, png = tmp_path / "a.json", tmp_path / "a.png"
    code, out, err = run_cli(["ablation", "--model", "qwen", "--nodes", "2", "--budget-mb", "0.5", "--iters", "2",
                              "--schedules", "rotating,unseen", "--json", str(js), "--plot", str(png)], capsys)
    assert code == 0, err
    data = json.loads(js.read_text())
    assert set(data["schedules"]) == {"rotating", "unseen"}
    assert set(data["schedules"]["unseen"]) == {"comet", "overlap", "placement", "static", "swap", "swap1"}
    assert data["speedup_over_comet"]["rotating"]["comet"] == 1.0
    assert "| rotating |" in out and "unseen: speedup over comet" in out
    assert "rotating: schedule rotating (period 4): history t0+t1" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_and_plan_report_the_topic_mix(tmp_path, capsys):
    js = tmp_path / "b.json"
    code, out, err = run_cli(["bench", "--nodes", "2", "--models", "qwen", "--budgets", "0.5", "--iters", "2",
                              "--warmup", "1", "--systems", "a2av", "--jobs", "1", "--schedule", "unseen",
                              "--json", str(js)], capsys)
    assert code == 0, err
    row = json.loads(js.read_text())["rows"][0]
    assert row["schedule"] == "unseen" and len(row["topic_mix"]["topic_mix"]) == 2
    assert "a100 2x4 qwen 0.5MB unseen: schedule unseen (period 4): history" in out
    pj = tmp_path / "p.json"
    code, out, err = run_cli(["plan", "--model", "qwen", "--nodes", "2", "--budget-mb", "0.5", "--iters", "2",
                              "--systems", "a2av", "--schedule", "rotating", "--json", str(pj)], capsys)
    assert code == 0, err
    p = json.loads(pj.read_text())
    assert p["schedule"] == "rotating" and p["topic_mix"]["history_topics"] == ["t0", "t1"]
    assert "[topics t0+t1]" in p["history"] and "schedule rotating (period 4)" in out


def test_default_schedule_adds_nothing(tmp_path, capsys):
    js = tmp_path / "b.json"
    code, _, err = run_cli(["bench", "--nodes", "2", "--models", "qwen", "--budgets", "0.5", "--iters", "1",
                            "--warmup", "0", "--systems", "a2av", "--jobs", "1", "--json", str(js)], capsys)
    assert code == 0, err
    row = json.loads(js.read_text())["rows"][0]
    assert "schedule" not in row and "topic_mix" not in row


def test_case_study_timeline_draws_swap_copies_on_nvlink_only(tmp_path, capsys):
    """Under unseen demand the second batch of zepp-swap carries the swaps planned from the first:
    its weight copies are tasks of their own on NVLink links, none on a NIC, and the chart draws
    the node that receives them."""
    from zepp.sim.bench_jobs import make_config, make_jobs
    from zepp.sim.run import run_system

    png = tmp_path / "t.png"
    # a batch size where swaps pay (zepp-swap's cost gate keeps none at 0.5 MB)
    code, out, err = run_cli(["timeline", "--nodes", "2", "--model", "qwen", "--budget-mb", "16", "--schedule",
                              "unseen", "--compare", "zepp-overlap,zepp-swap", "--out", str(png)], capsys)
    assert code == 0, err
    job = make_jobs(["a100"], [2], 4, ["qwen"], [16], [], iters=1, warmup=1, seed=0, traces=None,
                    schedule="unseen")[0]
    res = run_system("zepp-swap", make_config(job), keep_timeline=True)
    tl = res.timeline
    copies = [r for r, k in zip(tl.resource, tl.kind) if k == "copy"]
    assert res.swapped_slots == [len(copies)] and copies
    assert all(r.startswith("nvl") for r in copies)
    assert f"zepp-swap: {tl.latency * 1e3:.3f} ms, weight copies: {len(copies)} on NVLink, 0 on NICs" in out
    assert "zepp-overlap: " in out and "weight copies" not in out.splitlines()[0]
    assert "drawn: batch 1, topic mix" in out and png.is_file()
