"""``zepp bench --json`` writes the documented schema; bad options fail with one clear error."""

import json

import numpy as np
from click.testing import CliRunner

from zepp.bench import bench
from zepp.calibrate import measured_ms
from zepp.cli import main
from zepp.systems import SYSTEMS


def write_traces(root, rng):
    for sub, experts in (("k2", 384), ("qwen3", 128)):
        d = root / sub
        d.mkdir(parents=True)
        for window in ("pool", "eval"):
            ids = np.argsort(rng.random((300, experts)), axis=1)[:, :8]
            ids[:, :7].sort(axis=1)
            (d / f"{window}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")


def test_bench_json_schema(tmp_path):
    write_traces(tmp_path / "traces", np.random.default_rng(0))
    out = tmp_path / "b.json"
    res = CliRunner().invoke(bench, ["--traces", str(tmp_path / "traces"), "--nodes", "1", "--models", "k2",
                                     "--budgets", "1", "--iters", "2", "--warmup", "1", "--jobs", "1",
                                     "--json", str(out), "--plot", str(tmp_path / "b.png")])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data) == {"rows", "geomean_speedup"}
    assert len(data["rows"]) == 1
    row = data["rows"][0]
    assert set(row) == {"cluster", "nodes", "model", "budget_mb", "latency_ms", "lower_bound_ms", "measured_ms"}
    assert (row["cluster"], row["nodes"], row["model"], row["budget_mb"]) == ("a100", 1, "k2", 1.0)
    assert set(row["latency_ms"]) == set(SYSTEMS) | {"zepp"}
    assert row["latency_ms"]["zepp"] == min(row["latency_ms"][s] for s in ("zepp-a2av", "zepp-overlap", "zepp-swap"))
    assert all(v >= row["lower_bound_ms"] for v in row["latency_ms"].values())
    assert set(row["measured_ms"]) == {"a2av", "fast", "comet", "eplb", "epic", "moonep", "comet+eplb"}
    assert all(v is None for v in row["measured_ms"].values())
    best = min(row["latency_ms"][s] for s in SYSTEMS[:7])
    assert data["geomean_speedup"] == best / row["latency_ms"]["zepp"]
    assert (tmp_path / "b.png").stat().st_size > 0
    assert "speedup" in res.output


def test_measured_cells_come_from_the_paper():
    m = measured_ms("a100", 4, "k2", 1)
    assert m["a2av"] == 5.36 and m["comet+eplb"] == 3.68
    assert measured_ms("a100", 32, "k2", 64)["a2av"] == 368.6
    assert measured_ms("h100", 4, "qwen", 1)["a2av"] is None


def test_bad_options_fail_clearly(tmp_path, capsys):
    for args, word in ((["--systems", "nope"], "nope"), (["--nodes", "5", "--models", "k2"], "divide"),
                       (["--traces", str(tmp_path / "missing")], "not a directory")):
        try:
            main(["bench", *args])
        except SystemExit as e:
            assert e.code == 2
        assert word in capsys.readouterr().err
