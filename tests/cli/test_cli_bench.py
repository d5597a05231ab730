"""``zepp bench``: the documented JSON schema, written as configurations finish, ``--resume``,
bit-identical repeats, signals (bad options: ``tests/cli/test_cli_bad_inputs.py``)."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from zepp import registry
from zepp.cli.bench import bench
from zepp.cli import main
from zepp.sim.measured import measured_ms

SMALL = ["--nodes", "1", "--models", "k2", "--budgets", "1", "--iters", "2", "--warmup", "1", "--jobs", "1"]


def write_traces(root, rng, dirs=(("k2", 384), ("qwen3", 128))):
    for sub, experts in dirs:
        d = root / sub
        d.mkdir(parents=True)
        for window in ("pool", "eval"):
            ids = np.argsort(rng.random((300, experts)), axis=1)[:, :8]
            ids[:, :7].sort(axis=1)
            (d / f"{window}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")


def test_bench_json_schema(tmp_path):
    write_traces(tmp_path / "traces", np.random.default_rng(0))
    out = tmp_path / "b.json"
    res = CliRunner().invoke(bench, ["--traces", str(tmp_path / "traces"), *SMALL, "--json", str(out),
                                     "--plot", str(tmp_path / "b.png")])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data) == {"rows", "geomean_speedup", "geomean_speedup_paper"}
    assert len(data["rows"]) == 1
    row = data["rows"][0]
    assert set(row) == {"cluster", "nodes", "gpus_per_node", "model", "budget_mb", "latency_ms", "lower_bound_ms",
                        "measured_ms", "variant", "run", "best_baseline", "zepp_best"}
    assert (row["cluster"], row["nodes"], row["model"], row["budget_mb"]) == ("a100", 1, "k2", 1.0)
    variants = registry.SYSTEMS["zepp"].best_of
    assert set(row["latency_ms"]) == set(registry.PAPER_BASELINES) | {"zepp", *variants}
    best_variant = min(variants, key=lambda s: row["latency_ms"][s])
    assert row["latency_ms"]["zepp"] == row["latency_ms"][best_variant] and row["variant"]["zepp"] == best_variant
    assert all(v >= row["lower_bound_ms"] for v in row["latency_ms"].values())
    assert set(row["measured_ms"]) == set(registry.PAPER_BASELINES)
    assert all(v is None for v in row["measured_ms"].values())
    best = min(row["latency_ms"][s] for s in registry.PAPER_BASELINES)
    assert data["geomean_speedup"] == data["geomean_speedup_paper"] == best / row["latency_ms"]["zepp"]
    assert row["best_baseline"] == min(registry.PAPER_BASELINES, key=row["latency_ms"].get)
    assert row["zepp_best"] in {"zepp", *variants} and row["latency_ms"][row["zepp_best"]] == row["latency_ms"]["zepp"]
    assert (tmp_path / "b.png").stat().st_size > 0
    assert "speedup" in res.output and "1 configuration," in res.output


def test_repeat_is_bit_identical_and_resume_skips_stored_rows(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["--nodes", "1", "--models", "qwen", "--budgets", "1,2", "--iters", "2", "--warmup", "1",
            "--systems", "a2av,zepp-overlap"]
    r1 = CliRunner().invoke(bench, [*args, "--json", str(a), "--jobs", "1"])
    r2 = CliRunner().invoke(bench, [*args, "--json", str(b), "--jobs", "2"])
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    la = [r["latency_ms"] for r in json.loads(a.read_text())["rows"]]
    assert la == [r["latency_ms"] for r in json.loads(b.read_text())["rows"]]  # every digit, any worker count
    # keep only the first configuration, as if the run had been killed after it
    data = json.loads(a.read_text())
    data["rows"] = data["rows"][:1]
    a.write_text(json.dumps(data))
    a.with_name("a.detail.json").unlink()
    r3 = CliRunner().invoke(bench, [*args, "--json", str(a), "--jobs", "1", "--resume"])
    assert r3.exit_code == 0, r3.output
    assert "1 of 2 configurations already" in r3.output
    assert [r["latency_ms"] for r in json.loads(a.read_text())["rows"]] == la
    # stored with another seed: not reused, and the run says it simulates it again
    r4 = CliRunner().invoke(bench, [*args, "--json", str(a), "--jobs", "1", "--resume", "--seed", "1"])
    assert r4.exit_code == 0, r4.output
    assert "0 of 2 configurations already" in r4.output and "2 stored with other run settings" in r4.output
    assert all(r["run"]["seed"] == 1 for r in json.loads(a.read_text())["rows"])


def test_measured_cells_come_from_the_paper():
    m = measured_ms("a100", 4, "k2", 1)
    assert m["a2av"] == 5.36 and m["comet+eplb"] == 3.68
    assert measured_ms("a100", 32, "k2", 64)["a2av"] == 368.6
    assert measured_ms("h100", 4, "qwen", 1)["a2av"] is None


def test_a_users_measured_figures_give_the_models_error_on_zepp(tmp_path, capsys):
    """``--measured``: the user's Zepp figure of a configuration gives its own error column (the
    simulated ms over it), the JSON rows keep the paper's figures only, and a configuration the
    run did not simulate is named on stderr."""
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"rows": [
        {"cluster": "a100", "nodes": 1, "model": "qwen", "budget_mb": 0.5, "ms": {"zepp-overlap": 2.0, "a2av": 4.0}},
        {"cluster": "a100", "nodes": 2, "model": "qwen", "budget_mb": 0.5, "ms": {"zepp": 1.0}}]}))
    out_json = tmp_path / "b.json"
    main(["bench", "--nodes", "1", "--models", "qwen", "--budgets", "0.5", "--iters", "1", "--warmup", "0",
          "--systems", "a2av,zepp-overlap", "--jobs", "1", "--measured", str(f), "--json", str(out_json)])
    out, err = capsys.readouterr()
    head = next(line for line in out.splitlines() if line.startswith("| cluster"))
    row = next(line for line in out.splitlines() if line.startswith("| a100 | 1x4 | qwen | 0.5 |"))
    cell = dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in row.split("|")]))
    stored = json.loads(out_json.read_text())["rows"][0]
    want = stored["latency_ms"]["zepp-overlap"] / 2.0 - 1
    assert cell["model err on Zepp"] == f"{want:+.0%} (zepp-overlap)"
    assert cell["model err on best"] == f"{stored['latency_ms']['a2av'] / 4.0 - 1:+.0%}"
    assert stored["measured_ms"]["a2av"] is None and "zepp-overlap" not in stored["measured_ms"]
    assert "1 configuration(s)" in err and "'a100', 2, 4, 'qwen', 0.5" in err


def test_todays_clusters_run_their_deepep_systems(capsys):
    main(["bench", "--cluster", "h200-8", "--gpus-per-node", "8", "--nodes", "1", "--models", "qwen", "--budgets",
          "0.5", "--iters", "1", "--warmup", "0", "--systems", "sglang-deepep,zepp-deepep", "--jobs", "1"])
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("| cluster"))
    assert "sglang-deepep ms" in head and "zepp-deepep ms" in head
    row = next(line for line in out.splitlines() if line.startswith("| h200-8 | 1x8 | qwen | 0.5 |"))
    assert len(row.split("|")) == len(head.split("|"))
    # today's systems are baselines too: the best one is named, Zepp's speedup over it shown
    cell = dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in row.split("|")]))
    # (a meta-system's variants run too: the fastest of them may be the one named)
    assert cell["best baseline"] in ("sglang-deepep", *registry.SYSTEMS["sglang-deepep"].best_of)
    speedup, zepp_name = cell["speedup"].split("x (")
    assert float(speedup) > 0 and zepp_name.rstrip(")") in ("zepp-deepep", *registry.SYSTEMS["zepp-deepep"].best_of)
    assert "over the fastest simulated baseline per row" in out


def test_missing_traces_folder_names_what_it_looked_for(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--traces", str(tmp_path / "missing")])
    assert info.value.code == 2
    assert "not a directory" in capsys.readouterr().err
    write_traces(tmp_path / "t", np.random.default_rng(1), dirs=(("k2", 384),))
    with pytest.raises(SystemExit) as info:
        main(["bench", "--traces", str(tmp_path / "t"), "--models", "qwen", "--nodes", "1"])
    assert info.value.code == 2
    assert "pool.txt" in capsys.readouterr().err


def _start_bench(tmp_path, *extra):
    """A ``zepp bench`` long enough to be interrupted, and its two worker processes once both run."""
    import subprocess
    import sys

    from procs import default_sigint, wait_until

    proc = subprocess.Popen([sys.executable, "-m", "zepp.cli", "bench", "--nodes", "16", "--models", "k2",
                             "--budgets", "16", "--jobs", "2", "--json", str(tmp_path / "x.json"), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_sigint)
    workers = []

    def started():  # both children run the worker (forked and executed)
        workers[:] = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == proc.pid
                      and b"zepp.sim.bench_pool" in _cmdline(int(p))]
        return len(workers) >= 2 or proc.poll() is not None

    wait_until(started, poll_s=0.2)
    assert len(workers) == 2, f"the bench did not start its two workers ({workers})"
    return proc, workers


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_signal_ends_every_worker(tmp_path, sig):
    """SIGTERM, Ctrl-C or SIGKILL (the out-of-memory killer's) to ``zepp bench`` ends its worker
    processes too: none outlives it holding the caller's pipe (reading it reaches its end), and
    SIGINT/SIGTERM end with one line, exit code 130/143, nothing left beside the output."""
    import signal

    from procs import alive, wait_until

    proc, workers = _start_bench(tmp_path)
    proc.send_signal(getattr(signal, sig))
    err = proc.stderr.read().decode()  # returns once every holder of the pipe has ended
    proc.wait()
    # killed ones may take a moment to finish dying (the test's timeout bounds the wait)
    wait_until(lambda: not [w for w in workers if alive(w)])
    if sig != "SIGKILL":
        assert proc.returncode in {"SIGTERM": (143,), "SIGINT": (130, -2)}[sig], err  # -2: a shell's 130 too
        last = [s for s in err.replace("\r", "\n").splitlines() if s.strip()][-1]
        assert last.startswith("zepp: terminated" if sig == "SIGTERM" else "zepp: interrupted"), err
        assert "Traceback" not in err and os.listdir(tmp_path) == [], (err, os.listdir(tmp_path))


def test_a_worker_killed_ends_the_run_with_one_line(tmp_path):
    """A worker killed from outside (out of memory) ends ``zepp bench`` with one line naming what it
    was simulating, exit code 2, and no other worker left (a pool would wait for its result forever)."""
    import signal

    from procs import alive, wait_until

    proc, workers = _start_bench(tmp_path)
    os.kill(workers[0], signal.SIGKILL)
    err = proc.stderr.read().decode()
    proc.wait()
    last = [s for s in err.replace("\r", "\n").splitlines() if s.strip()][-1]
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert last.startswith("zepp: error: a zepp bench worker process was killed by signal 9 (SIGKILL, out of "
                           "memory?) while simulating a100 16x4 k2 16MB"), last
    wait_until(lambda: not [w for w in workers if alive(w)])


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ppid(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is gone
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_a_second_run_on_the_same_json_is_refused_while_the_first_writes(tmp_path, capsys):
    """Two runs never interleave their rows in one file: the second is one line naming the first."""
    proc, _ = _start_bench(tmp_path)
    try:
        with pytest.raises(SystemExit) as info:
            main(["bench", *SMALL, "--systems", "a2av", "--json", str(tmp_path / "x.json")])
        err = capsys.readouterr().err.strip()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert info.value.code == 2 and err == (f"zepp: error: --json {str(tmp_path / 'x.json')!r} is being written by "
                                            f"another zepp run (pid {proc.pid}); wait for it to end or choose "
                                            f"another path"), err
