"""The bad-option table of every command: one line ``zepp: error: ...`` naming the option, exit
code 2, before any work or rank starts, never a traceback, nothing written. Options that several
commands share follow one rule with one message (``zepp.launch.checks``): each such row runs on
every command that has the option and the lines must be equal. Bad file *contents* (traces,
checkpoints, histories) are tested with their readers and commands (``tests/traces``,
``tests/cli/test_cli_generate.py``, ``tests/cli/test_cli_plan.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from zepp.cli import main as zepp_main

RUN = ["run", "--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--experts", "8", "--topk", "2",
       "--hidden", "16", "--ffn", "8", "--warmup", "0", "--iters", "1", "--systems", "a2av"]
# the shared options are checked before the checkpoint is read: no checkpoint needed for them
GENERATE = ["generate", "--checkpoint", "/nonexistent-zepp-checkpoint", "--input-ids", "/nonexistent-zepp.json",
            "--nodes", "2", "--gpus-per-node", "1", "--system", "a2av"]
CLUSTER_UP = ["cluster", "up", "--nodes", "2", "--gpus-per-node", "1"]
BENCH = ["bench", "--nodes", "1", "--models", "k2", "--budgets", "1", "--iters", "2", "--warmup", "1", "--jobs", "1"]
PLAN = ["plan", "--model", "olmoe", "--experts", "16", "--topk", "2", "--hidden", "64", "--nodes", "2",
        "--gpus-per-node", "2", "--budget-mb", "0.01", "--iters", "2", "--trace", "{trace}"]
PLACE = ["place", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2",
         "--redundant", "4", "--format", "zepp", "--out", "{out}/p.json"]
TIMELINE = ["timeline", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5", "--out", "{out}/t.png"]
ABLATION = ["ablation", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5", "--iters", "2"]
BASE = {"run": RUN, "generate": GENERATE, "cluster up": CLUSTER_UP, "bench": BENCH, "plan": PLAN, "place": PLACE,
        "timeline": TIMELINE, "ablation": ABLATION}

# (options, what the line must name, the commands that have them): every command, one message
SHARED = [
    (["--nodes", "0"], "--nodes", ["run", "generate", "cluster up"]),
    (["--nodes", "200", "--gpus-per-node", "2"], "at most 256", ["run", "generate", "cluster up"]),
    (["--gpus-per-node", "65"], "--gpus-per-node", ["run", "generate", "cluster up"]),
    (["--timeout", "nan"], "--timeout", ["run", "generate"]),
    (["--timeout", "inf"], "--timeout", ["run", "generate"]),
    (["--timeout", "0"], "--timeout", ["run", "generate"]),
    (["--threads", "0"], "--threads", ["run", "generate"]),
    (["--relaxation", "nan"], "--relaxation", ["run", "generate"]),
    (["--device", "foo"], "--device", ["run", "generate"]),
    (["--rate-mbit", "500"], "add --emulate", ["run", "generate"]),
    (["--delay-ms", "5"], "add --emulate", ["run", "generate"]),
    (["--json", "/nonexistent-zepp-folder/out.json"], "does not exist", ["run", "generate"]),
    (["--json", "/proc/zepp-out.json"], "cannot be written", ["run", "generate"]),
    (["--fault", '{"rank": 9}'], "rank must be an integer in 0..1", ["run", "generate"]),
    (["--emulate", "--device", "cuda:0"], "--device", ["run", "generate"]),
    (["--emulate", "--rate-mbit", "inf"], "--rate-mbit", ["run", "generate"]),
    (["--emulate", "--delay-ms", "nan"], "--delay-ms", ["run", "generate"]),
    (["--emulate", "--emulate-prefix", "Bad-Prefix"], "prefix", ["run", "generate"]),
    (["--rate-mbit", "inf"], "--rate-mbit", ["cluster up"]),
    (["--delay-ms", "-1"], "--delay-ms", ["cluster up"]),
]

# one command's own options
OWN = [
    (["--budget-mb", "inf"], "budget", "run"),
    (["--iters", "0"], "--iters", "run"),
    (["--extra", "9"], "--extra", "run"),
    (["--systems", "nope"], "nope", "run"),
    (["--fault", "notjson"], "--fault", "run"),
    (["--fault", '{"rank": 1, "system": "eplb", "iter": 0}'], "--fault: system", "run"),
    (["--fault", '{"rank": 1, "iter": 0, "mode": "sleep"}'], "--fault: mode", "run"),
    (["--trace", "{garbage}"], "garbage.txt", "run"),
    (["--trace", "{fifo}"], "not a regular file", "run"),
    (["--history", "{garbage}"], "--history needs --trace", "run"),
    (["--max-new-tokens", "0"], "--max-new-tokens", "generate"),
    (["--fault", "notjson"], "--fault", "generate"),
    (["--fault", '{"rank": 1, "iter": 0}'], "keys rank, system, step, mode", "generate"),
    (["--system", "nope"], "unknown system", "generate"),
    (["--system", "comet"], "not supported", "generate"),
    (["--record", "/nonexistent-zepp-folder/rec"], "--record", "generate"),
    ([], "is not a folder", "generate"),  # the checkpoint
    (["--nic-mtu", "10"], "--nic-mtu", "cluster up"),
    (["--systems", "nope"], "unknown system(s) nope", "bench"),
    (["--systems", "zepp-p2p"], "not supported by this command", "bench"),
    (["--nodes", "5", "--models", "k2"], "divide", "bench"),
    (["--budgets", "inf"], "budget", "bench"),
    (["--jobs", "0"], "--jobs", "bench"),
    (["--resume"], "--resume needs --json", "bench"),
    (["--json", "/nonexistent-folder/x.json"], "does not exist", "bench"),
    (["--iters", "0"], "--iters", "bench"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'", "bench"),
    (["--systems", "zepp-overlap", "--plot", "{out}/x.png"], "--plot draws each system against", "bench"),
    (["--iters", "0"], "--iters must be an integer at least 1", "plan"),
    (["--relaxation", "nan"], "--relaxation must be a finite number", "plan"),
    (["--json", "/nonexistent-folder/p.json"], "does not exist", "plan"),
    (["--systems", "zepp,deepep"], "deepep", "plan"),
    (["--budget-mb", "0.0001"], "too small for one token", "plan"),
    (["--out", "/nonexistent-dir/p.json"], "folder '/nonexistent-dir' does not exist", "place"),
    (["--report", "/nonexistent-dir/r.json"], "--report '/nonexistent-dir/r.json': folder '/nonexistent-dir' does not exist",
     "place"),
    (["--budget-mb", "inf"], "--budget-mb must be a finite number", "place"),
    (["--heldout", "1.5"], "--heldout must lie in [0, 1)", "place"),
    (["--policy", "best"], "--policy 'best': choose one of home, zepp, eplb", "place"),
    (["--routing", "fastest"], "--routing 'fastest'", "place"),
    (["--dispatch", "a2av", "--combine", "reduce"], "needs a relay or zepp dispatch", "place"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'", "place"),
    (["--relaxation", "nan"], "--relaxation must be a finite number", "place"),
    (["--redundant", "5"], "not divisible by the 4 GPUs", "place"),
    (["--format", "trtllm"], "--format trtllm writes .yaml or .yml files", "place"),
    (["--out", "/nonexistent-folder/t.png"], "does not exist", "timeline"),
    (["--compare", "a2av,eplb,fast"], "give two systems", "timeline"),
    (["--traces", "/nonexistent-folder"], "not a directory", "timeline"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'", "timeline"),
    (["--ranks", "0,x"], "--ranks: expected a comma-separated list", "timeline"),
    (["--schedule", "drift"], "--schedule 'drift': unknown schedule; choose from stationary", "timeline"),
    (["--schedule", "drift"], "--schedule 'drift': unknown schedule; choose from stationary", "bench"),
    (["--schedule", "drift"], "--schedule 'drift': unknown schedule; choose from stationary", "plan"),
    (["--schedules", "rotating,drift"], "--schedules 'drift': unknown schedule", "ablation"),
    (["--schedules", "rotating,rotating"], "named twice", "ablation"),
    (["--period", "0"], "--period must be an integer at least 1", "ablation"),
    (["--iters", "0"], "--iters must be an integer at least 1", "ablation"),
    (["--budget-mb", "nan"], "--budget-mb must be a finite number above 0", "ablation"),
    (["--nodes", "3"], "divide", "ablation"),
    (["--json", "/nonexistent-folder/a.json"], "does not exist", "ablation"),
    (["--traces", "/nonexistent-folder"], "not a directory", "ablation"),
]
PREFIX_ONLY = [["cluster", "status", "--prefix", "Bad-Prefix"], ["cluster", "down", "--prefix", "Bad-Prefix"],
               ["cluster", "check", "--prefix", "Bad-Prefix"], ["cluster", "calibrate", "--prefix", "Bad-Prefix"]]


def _files(argv: list[str], tmp_path: Path) -> list[str]:
    """``{fifo}`` / ``{garbage}`` / ``{trace}`` replaced by a named pipe / a file that is not a trace /
    a small valid trace (16 experts, top-2); ``{out}`` by the test's own folder."""
    out = []
    for a in argv:
        a = a.replace("{out}", str(tmp_path))
        if a == "{trace}":
            a = str(tmp_path / "trace.txt")
            rows = np.argsort(np.random.default_rng(0).random((400, 16)), axis=1)[:, :2]
            Path(a).write_text("".join(f"{r[0]} {r[1]}\n" for r in rows))
        elif a == "{fifo}":
            a = str(tmp_path / "fifo.txt")
            os.mkfifo(a)
        elif a == "{garbage}":
            a = str(tmp_path / "garbage.txt")
            Path(a).write_text("hello world\nnot ids\n")
        out.append(a)
    return out


def _error_line(argv: list[str], capfd) -> str:
    """The one line ``zepp`` prints for ``argv``, after checking it is exactly one and exit 2."""
    with pytest.raises(SystemExit) as info:
        zepp_main(argv)
    out, err = capfd.readouterr()
    assert out.strip() == "", (argv, out)  # no work started: nothing read, planned or reported
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert info.value.code == 2, (argv, info.value.code, err)
    assert len(lines) == 1 and lines[0].startswith("zepp: error: "), (argv, err)
    assert "Traceback" not in err and "worker rank" not in err and "generate rank" not in err, (argv, err)
    return lines[0]


@pytest.mark.parametrize("options,names,commands", SHARED, ids=[" ".join(o) for o, _, _ in SHARED])
def test_shared_option_is_one_line_and_the_same_everywhere(options, names, commands, capfd):
    lines = {cmd: _error_line(BASE[cmd] + options, capfd) for cmd in commands}
    for cmd, line in lines.items():
        assert names in line, (cmd, line)
    assert len(set(lines.values())) == 1, lines


@pytest.mark.parametrize("options,names,command", OWN, ids=[f"{c}: {' '.join(o)}" for o, _, c in OWN])
def test_own_option_is_one_line(options, names, command, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative default outputs (timeline.png) would land here
    before = set(os.listdir(tmp_path))
    argv = _files(BASE[command], tmp_path)
    if options[:1] and options[0] in argv:  # an option of the base given again: the row's value replaces it
        i = argv.index(options[0])
        argv = argv[:i] + argv[i + 2:]
    line = _error_line(argv + _files(options, tmp_path), capfd)
    assert names in line, line
    made = {n for n in set(os.listdir(tmp_path)) - before if n not in ("trace.txt", "fifo.txt", "garbage.txt")}
    assert not made, f"{command} wrote {made} before refusing"


@pytest.mark.parametrize("argv", PREFIX_ONLY, ids=[a[1] for a in PREFIX_ONLY])
def test_cluster_prefix_is_checked_by_every_subcommand(argv, capfd):
    assert "prefix" in _error_line(argv, capfd)
