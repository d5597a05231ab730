"""The one launch path (``zepp.launch.ranks``) and its wait-and-kill loop (``RankGroup.wait``),
with small stdlib child processes instead of torch ranks: a rank that dies, hangs or is killed
from outside ends the run with a ``RankFailure`` naming it (and not the peers that only noticed),
nothing outlives the launcher (also after ``kill -9``), the report comes back, torchrun's rank
runs in-process. The same path with real torch ranks is tested once per command:
``tests/runtime/test_runtime_dist.py`` (``zepp run``), ``tests/cli/test_cli_generate.py``
(``zepp generate``), ``tests/emulate/test_emulate_run.py`` (``--emulate``).

No test here depends on timing: a "hung" rank never ends by itself, a peer that "notices"
waits for a file the failing rank (or the test) writes, and every wait is bounded by pytest's
timeout, not by a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zepp.errors import RankFailure
from zepp.launch import ranks
from zepp.launch.processes import RankGroup
from procs import alive as _alive, wait_until as _wait_until

# A rank program: ``python -m zepp_fake_rank CONFIG.json``; ``cfg["behaviour"][RANK]``:
#   ok     rank 0 writes its environment as the report; exit 0
#   die    write the marker ``died`` next to the report, exit 17 (zepp's fault-injection code)
#   notice wait for the marker, then exit 3 (zepp's "a peer failed" code)
#   gaveup exit 3 at once (a peer whose collective timed out)
#   hang   sleep until killed
FAKE_RANK = '''
import json, os, sys, time

def run_in_process(cfg):
    rank = int(os.environ["RANK"])
    what = cfg["behaviour"][rank]
    marker = os.path.join(os.path.dirname(cfg["out"]), "died")
    if what == "die":
        open(marker, "w").close()
        os._exit(17)
    if what == "notice":
        while not os.path.exists(marker):
            time.sleep(0.01)
        print(f"fake rank {rank}: communication failed (a peer died)", file=sys.stderr, flush=True)
        return 3
    if what == "gaveup":
        print(f"fake rank {rank}: communication failed (timed out)", file=sys.stderr, flush=True)
        return 3
    if what == "hang":
        time.sleep(3600)
    if rank == 0:
        with open(cfg["out"], "w") as f:
            json.dump({"env": dict(os.environ), "out": cfg["out"]}, f)
    return 0

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.exit(run_in_process(json.load(f)))
'''
MODULE = "zepp_fake_rank"


@pytest.fixture
def fake_rank(tmp_path, monkeypatch):
    """The fake rank module importable here and in every child (``PYTHONPATH``)."""
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(FAKE_RANK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _cfg(*behaviour: str, timeout: float = 60.0) -> dict:
    return {"nodes": len(behaviour), "gpus_per_node": 1, "timeout": timeout, "behaviour": list(behaviour)}


def test_report_of_rank_zero_and_the_ranks_environment(fake_rank):
    """Every rank gets its identity, the file-store rendezvous in the run's temp folder, loopback
    gloo/NCCL, its threads, and no MASTER_PORT; the temp folder is gone afterwards."""
    os.environ["MASTER_PORT"] = "29500"  # a launcher started by torchrun: the ranks must not inherit it
    try:
        rep = ranks.spawn_local(MODULE, _cfg("ok", "ok", "ok"), threads=2, env={"EXTRA": "1"})
    finally:
        del os.environ["MASTER_PORT"]
    env = rep["env"]
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "3", "0", "1")
    assert env["ZEPP_STORE_FILE"].startswith(os.path.dirname(rep["out"]))
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo" and env["MASTER_ADDR"] == "127.0.0.1"
    assert env["ZEPP_THREADS"] == env["OMP_NUM_THREADS"] == "2" and env["EXTRA"] == "1"
    assert "MASTER_PORT" not in env
    assert not os.path.exists(os.path.dirname(rep["out"]))


def test_dead_rank_is_named_and_the_peer_that_noticed_is_not(fake_rank):
    with pytest.raises(RankFailure) as info:
        ranks.spawn_local(MODULE, _cfg("notice", "die"))
    exc = info.value
    assert exc.codes == [3, 17] and exc.culprits == [1] and exc.hung == [], str(exc)
    head = str(exc).splitlines()[0]
    assert head.startswith("rank 1 died (fault injection)") and "rank 0 saw" not in head, head
    assert "rank 0: fake rank 0: communication failed" in str(exc)  # each rank's stderr tail


def test_hung_rank_is_killed_after_the_grace_and_reported_as_a_hang(fake_rank):
    """A peer gives up (its collective timed out: exit 3); the rank that never ends is killed
    ``grace`` seconds later and blamed, the peer is not."""
    with pytest.raises(RankFailure) as info:
        ranks.spawn_local(MODULE, _cfg("hang", "gaveup"), grace=0.3)
    exc = info.value
    assert exc.codes == [-signal.SIGKILL, 3] and exc.hung == [0] and exc.culprits == [0], str(exc)
    assert str(exc).startswith("rank 0 hung (still running 0.3 s after rank 1 failed) and was killed by the "
                               "launcher (first to fail: rank 1; exit codes by rank: [-9, 3])"), str(exc)


def test_rank_killed_from_outside_is_reported_with_its_signal(tmp_path):
    """Not the launcher's kill: reported as the signal, never as a hang."""
    flag = tmp_path / "killed"
    notice = f"import os, sys, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\nsys.exit(3)"
    cmds = [[sys.executable, "-c", notice], [sys.executable, "-c", "import time; time.sleep(3600)"]]
    with RankGroup(cmds, [dict(os.environ)] * 2) as group:
        os.kill(group.procs[1].pid, signal.SIGKILL)
        flag.touch()
        res = group.wait(grace=600)
    assert res.returncodes == [3, -signal.SIGKILL] and not res.timed_out
    assert res.failure().culprits == [1] and res.failure().hung == []
    assert str(res.failure()).startswith("rank 1 was killed by signal 9 (SIGKILL), not by the launcher")


def test_overall_time_limit_kills_every_rank(tmp_path):
    cmds = [[sys.executable, "-c", "import time; time.sleep(3600)"]] * 2
    with RankGroup(cmds, [dict(os.environ)] * 2) as group:
        res = group.wait(timeout=0.3)
    assert res.timed_out and [r.hung for r in res.ranks] == [True, True]
    assert "still running at the run's time limit of 0.3 s" in res.ranks[0].why()


def test_launch_turns_a_failure_into_one_message_and_exit_code_3(fake_rank, capfd):
    with pytest.raises(SystemExit) as info:
        ranks.launch(MODULE, _cfg("notice", "die"), label="zepp test")
    assert info.value.code == 3
    err = capfd.readouterr().err
    assert err.startswith("zepp test: rank 1 died (fault injection)"), err
    assert "torn down" not in err


def test_launch_under_torchrun_runs_this_process_as_the_rank(fake_rank, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rep = ranks.launch(MODULE, _cfg("ok", "ok"), label="zepp test")
    assert rep["env"]["RANK"] == "0" and rep["env"]["WORLD_SIZE"] == "2"
    assert not os.path.exists(os.path.dirname(rep["out"]))
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as info:  # the other ranks end with their code, print nothing
        ranks.launch(MODULE, _cfg("ok", "ok"), label="zepp test")
    assert info.value.code == 0


def test_launch_hands_over_to_the_emulated_launcher():
    rep = ranks.launch("no.such.module", {}, label="zepp test", emulated=lambda: {"from": "emulated"})
    assert rep == {"from": "emulated"}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_killed_launcher_leaves_no_rank_and_no_temp_folder(fake_rank, tmp_path, how):
    """``kill -9`` of the launcher: the ranks' parent-death signal and the launcher's watchdog
    clean up; SIGTERM: the launcher's own ``with`` blocks do."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    code = f"from zepp.launch.ranks import spawn_local; spawn_local({MODULE!r}, {_cfg('hang', 'hang')!r})"
    p = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, TMPDIR=str(tmpdir)))
    try:
        _wait_until(lambda: len(_ranks_of(p.pid)) == 2)
        pids = _ranks_of(p.pid)
        p.send_signal(getattr(signal, how))
        p.wait()
        _wait_until(lambda: not any(_alive(pid) for pid in pids))
        _wait_until(lambda: os.listdir(tmpdir) == [])
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == -signal.SIGKILL if how == "SIGKILL" else p.returncode == 143


def _ranks_of(launcher: int) -> list[int]:
    """Pids of the launcher's children running the fake rank."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and MODULE.encode() in cmd:
            out.append(int(d))
    return out
