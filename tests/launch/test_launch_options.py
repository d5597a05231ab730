"""Every bad option of every command that starts ranks or clusters (``zepp run``, ``zepp generate``,
``zepp cluster``): one line ``zepp: error: ...`` naming it, exit code 2, before any rank starts,
never a traceback. Options that several commands share follow one rule with one message
(``zepp.launch.checks``): each such row runs on every command that has the option and the lines
must be equal. ``zepp generate``'s checks of a real checkpoint and its requests are in
``tests/cli/test_cli_generate.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zepp.cli import main as zepp_main

RUN = ["run", "--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--experts", "8", "--topk", "2",
       "--hidden", "16", "--ffn", "8", "--warmup", "0", "--iters", "1", "--systems", "a2av"]
# the shared options are checked before the checkpoint is read: no checkpoint needed for them
GENERATE = ["generate", "--checkpoint", "/nonexistent-zepp-checkpoint", "--input-ids", "/nonexistent-zepp.json",
            "--nodes", "2", "--gpus-per-node", "1", "--system", "a2av"]
CLUSTER_UP = ["cluster", "up", "--nodes", "2", "--gpus-per-node", "1"]
BASE = {"run": RUN, "generate": GENERATE, "cluster up": CLUSTER_UP}

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
]
PREFIX_ONLY = [["cluster", "status", "--prefix", "Bad-Prefix"], ["cluster", "down", "--prefix", "Bad-Prefix"],
               ["cluster", "check", "--prefix", "Bad-Prefix"], ["cluster", "calibrate", "--prefix", "Bad-Prefix"]]


def _files(argv: list[str], tmp_path: Path) -> list[str]:
    """``{fifo}`` / ``{garbage}`` replaced by a named pipe / a file that is not a trace."""
    out = []
    for a in argv:
        if a == "{fifo}":
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
    err = capfd.readouterr().err
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
def test_own_option_is_one_line(options, names, command, tmp_path, capfd):
    line = _error_line(BASE[command] + _files(options, tmp_path), capfd)
    assert names in line, line


@pytest.mark.parametrize("argv", PREFIX_ONLY, ids=[a[1] for a in PREFIX_ONLY])
def test_cluster_prefix_is_checked_by_every_subcommand(argv, capfd):
    assert "prefix" in _error_line(argv, capfd)
