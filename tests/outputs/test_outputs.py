"""``zepp.outputs``: an output is written whole or not at all, never through a link or into a
device, never over an input or another output, by one run at a time; a full disk is one line.
(The commands' refusals are rows of ``tests/cli/test_cli_bad_inputs.py``; a killed ``zepp bench``
is ``tests/cli/test_cli_bench_kill.py``.)"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from zepp.outputs import OutputError, Place, claim_outputs, release_claims, replacing, write_json, write_text
from zepp.outputs.claims import lock_path


def _names(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_a_write_replaces_the_file_whole_and_keeps_its_mode(tmp_path):
    p = tmp_path / "out.json"
    p.write_text("old")
    p.chmod(0o640)
    write_json(p, {"a": [1, 2]})
    assert json.loads(p.read_text()) == {"a": [1, 2]} and (p.stat().st_mode & 0o777) == 0o640
    assert _names(tmp_path) == ["out.json"]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, SystemExit, ValueError])
def test_a_write_that_fails_leaves_the_previous_file_and_no_temporary_one(tmp_path, failure):
    p = tmp_path / "fig.png"
    p.write_text("previous")
    with pytest.raises(failure):
        with replacing(p, "--plot") as tmp:
            with open(tmp, "w") as f:
                f.write("half of a new fi")
            raise failure()
    assert p.read_text() == "previous" and _names(tmp_path) == ["fig.png"]


def test_a_full_disk_is_one_line_naming_the_option_and_nothing_is_replaced(tmp_path, monkeypatch):
    p = tmp_path / "b.json"
    p.write_text("previous")
    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputError, match=r"^--json '.*b.json' could not be written \(No space left on device\); "
                                          r"the previous file is left as it was"):
        write_text(p, "x" * 100, "--json")
    monkeypatch.undo()
    assert p.read_text() == "previous" and _names(tmp_path) == ["b.json"]


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs root and mount namespaces (a small tmpfs of its own)")
def test_bench_json_on_a_full_tmpfs_is_one_line_exit_2_and_the_old_file_stays(tmp_path):
    """A real full disk: a 64 KiB tmpfs, mounted in a mount namespace of the test's own (gone with
    it), filled up to its last page; ``zepp bench --json`` there must fail with one line."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    bench = [sys.executable, "-m", "zepp.cli", "bench", "--nodes", "1", "--models", "k2", "--budgets", "1", "--iters",
             "1", "--warmup", "0", "--systems", "a2av", "--jobs", "1", "--json", f"{mnt}/b.json"]
    script = (f"mount -t tmpfs -o size=64k tmpfs {mnt} && echo previous > {mnt}/b.json && "
              f"(dd if=/dev/zero of={mnt}/fill bs=4096 count=64 2>/dev/null; true) && "
              f"{' '.join(bench)} 2>{tmp_path}/err >/dev/null; echo \"rc=$?\"; tail -n 1 {tmp_path}/err; "
              f"cat {mnt}/b.json; ls -a {mnt}")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True).stdout.splitlines()
    assert out[0] == "rc=2", out
    assert out[1].startswith("zepp: error: --json (its .detail.json)") and "No space left on device" in out[1], out
    assert out[2] == "previous", out  # the old file, whole
    assert [n for n in out[3:] if "zepp" in n] == [], out  # no temporary file, no lock left


def test_an_output_is_never_an_input_or_another_output(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text("0 1\n")
    os.link(trace, tmp_path / "hard.txt")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "t.txt").write_text("0 1\n")
    os.symlink(tmp_path / "sub" / "deep", tmp_path / "lnk")  # lnk/.. is sub/, not tmp_path
    rec = tmp_path / "rec"
    cases = [
        ([Place("--json", str(tmp_path / "hard.txt"))], [Place("--trace", str(trace))], "an input of this run"),
        ([Place("--json", str(tmp_path / "lnk") + "/../t.txt")], [Place("--trace", str(tmp_path / "sub" / "t.txt"))],
         "an input of this run"),
        ([Place("--json", str(tmp_path / "a.png")), Place("--plot", str(tmp_path / "sub" / ".." / "a.png"))], [],
         "one output would overwrite the other"),
        ([Place("--record", str(rec), folder=True, names=("load.json",)), Place("--json", str(rec / "load.json"))],
         [], "the folder of"),
        ([Place("--json", str(tmp_path / "ck" / "config.json"))], [Place("--checkpoint", str(tmp_path / "ck"),
                                                                         folder=True)], "a file in the folder of"),
    ]
    rec.mkdir()
    (tmp_path / "ck").mkdir()
    for outputs, inputs, msg in cases:
        with pytest.raises(OutputError, match=msg):
            claim_outputs(outputs, inputs)
    # a file --record does not write is not its concern
    claim_outputs([Place("--record", str(rec), folder=True, names=("load.json",)),
                   Place("--json", str(rec / "x.json"))])
    release_claims()


def test_links_pipes_and_devices_are_refused_without_opening_them(tmp_path):
    target = tmp_path / "mine.json"
    target.write_text("keep")
    os.symlink(target, tmp_path / "link.json")
    os.mkfifo(tmp_path / "pipe.json")  # opening it for writing would block
    for path, msg in ((tmp_path / "link.json", "is a symbolic link"), (tmp_path / "pipe.json", "is a named pipe"),
                      ("/dev/null", "is a character device")):
        with pytest.raises(OutputError, match=msg):
            claim_outputs([Place("--json", str(path))])
    with pytest.raises(OutputError, match="is a symbolic link"):  # also at the moment of the rename
        write_text(tmp_path / "link.json", "new")
    assert target.read_text() == "keep" and os.path.islink(tmp_path / "link.json")


HOLD = """
import sys
from zepp.outputs import Place, claim_outputs
claim_outputs([Place("--json", sys.argv[1])])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_run_on_the_same_output_is_refused_until_the_first_ends(tmp_path):
    out = str(tmp_path / "b.json")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, out], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputError, match=rf"is being written by another zepp run \(pid {holder.pid}\)"):
            claim_outputs([Place("--json", out)])
    finally:
        holder.kill()  # SIGKILL: the kernel drops its lock; the lock file stays until the next run
        holder.wait()
    assert os.path.exists(lock_path(Place("--json", out)))
    claim_outputs([Place("--json", out)])
    release_claims()
    assert _names(tmp_path) == []


def test_a_killed_runs_temporary_files_are_removed_by_the_next_claim(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".b.zepp-tmp-{dead.pid}-0a0b.json"
    mine = tmp_path / f".b.zepp-tmp-{os.getpid()}-0c0d.json"  # a live writer's: kept
    other = tmp_path / f".c.zepp-tmp-{dead.pid}-0e0f.json"  # another output's: not this claim's concern
    for p in (stale, mine, other):
        p.write_text("{")
    claim_outputs([Place("--json", str(tmp_path / "b.json"))])
    release_claims()
    assert not stale.exists() and mine.exists() and other.exists()
