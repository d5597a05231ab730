"""The launcher hardened: nothing of anyone else's is touched, nothing listens where it should
not, no input gets past the launcher unchecked, nothing is left behind, and failures are
reported as what they were. One test (or group) per finding of a review (issue 11); each failed
on the code before.

The namespace tests need root and ``ip netns`` (skipped with the reason otherwise); each uses
its own prefix (the ``netns_prefix`` fixture). Runs that must be ended from outside use
``--iters 100000`` (they would take half an hour) and a private ``TMPDIR``, so the test sees
exactly the temp folders of its run. How failures are reported, and that nothing outlives a
killed launcher, is ``test_launch_ranks.py`` (small stdlib ranks); every bad option of every
command is ``tests/cli/test_cli_bad_inputs.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from zepp.emulate import inventory as inv
from zepp.emulate import topology as topo
from zepp.cli.cluster import cluster
from procs import alive as _alive, wait_until as _wait_until

OK, REASON = topo.availability()
needs_netns = pytest.mark.skipif(not OK, reason=REASON or "emulated cluster available")
needs_ss = pytest.mark.skipif(shutil.which("ss") is None, reason="needs `ss` (iproute2) to see sockets")
SRC = Path(__file__).resolve().parents[2] / "src" / "zepp"
TINY = ["--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--experts", "8", "--topk", "2",
        "--hidden", "16", "--ffn", "8", "--tokens", "8", "--warmup", "0", "--systems", "a2av"]


def _descendants(pid: int) -> list[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ranks_of(launcher: int, module: str = "zepp.runtime.worker") -> dict[int, int]:
    """RANK -> pid of the launcher's rank processes running ``module``."""
    return {int(_environ(p).get("RANK", -1)): p for p in _descendants(launcher) if module in _cmdline(p)}


def _listeners() -> list[tuple[str, set[int]]]:
    """(local address:port, owning pids) of every listening TCP socket (``ss -ltnpH``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [(line.split()[3], {int(p) for p in re.findall(r"pid=(\d+)", line)}) for line in out.splitlines()
            if line.strip()]


def _start(args, tmpdir: Path) -> subprocess.Popen:
    tmpdir.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "zepp.cli", "run", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmpdir)))


def _wait_ranks(p: subprocess.Popen, world: int, module: str = "zepp.runtime.worker") -> dict[int, int]:
    while True:
        assert p.poll() is None, p.stderr.read()
        ranks = _ranks_of(p.pid, module)
        if len(ranks) == world:
            return ranks
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# ownership: only zepp's namespaces, only that cluster's


@needs_netns
@pytest.mark.netns
def test_down_leaves_a_namespace_zepp_did_not_make(netns_prefix):
    """A namespace made by hand with the prefix (``{prefix}-foreign``, a process inside) keeps its
    process and survives ``zepp cluster down``, which says it skipped it."""
    prefix = netns_prefix("ho")
    foreign = f"{prefix}-foreign"
    subprocess.run(["ip", "netns", "add", foreign], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", foreign, "sleep", "600"], start_new_session=True)
    try:
        runner = CliRunner()
        res = runner.invoke(cluster, ["up", "--nodes", "1", "--gpus-per-node", "1", "--prefix", prefix])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cluster, ["down", "--prefix", prefix])
        assert res.exit_code == 0, res.output
        assert "removed 2 namespaces" in res.output and "skipped 1 namespaces" in res.output, res.output
        assert foreign in res.output
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert foreign in names and sleeper.poll() is None
        assert inv.list_namespaces(prefix) == []
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["ip", "netns", "del", foreign])


@needs_netns
@pytest.mark.netns
def test_two_clusters_coexist_and_up_refuses_a_prefix_in_use(netns_prefix, capfd):
    """Two prefixes live side by side; ``up`` (and ``run --emulate``) on a prefix in use say so
    and leave the cluster as it was; ``down`` of one leaves the other; ``--replace`` replaces."""
    from zepp.cli import main as zepp_main

    a, b = netns_prefix("ha"), netns_prefix("hb")
    runner = CliRunner()
    try:
        for p in (a, b):
            res = runner.invoke(cluster, ["up", "--nodes", "1", "--gpus-per-node", "2", "--prefix", p])
            assert res.exit_code == 0, res.output
        id_a = inv.status(a)["record"]["id"]
        assert inv.status(a)["complete"] and inv.status(b)["complete"]
        res = runner.invoke(cluster, ["up", "--nodes", "1", "--gpus-per-node", "2", "--prefix", a])
        assert res.exit_code != 0 and "in use" in res.output and "zepp cluster down" in res.output, res.output
        capfd.readouterr()
        with pytest.raises(SystemExit) as info:  # refused before any rank starts
            zepp_main(["run", *TINY, "--iters", "1", "--emulate", "--emulate-prefix", a])
        err = capfd.readouterr().err
        assert info.value.code == 2 and "in use" in err, err
        st = inv.status(a)
        assert st["complete"] and st["record"]["id"] == id_a, st
        assert runner.invoke(cluster, ["down", "--prefix", a]).exit_code == 0
        assert inv.list_namespaces(a) == [] and inv.status(b)["complete"]
        id_b = inv.status(b)["record"]["id"]
        res = runner.invoke(cluster, ["up", "--nodes", "1", "--gpus-per-node", "2", "--prefix", b, "--replace"])
        assert res.exit_code == 0, res.output
        assert inv.status(b)["complete"] and inv.status(b)["record"]["id"] != id_b
    finally:
        inv.down(a)
        inv.down(b)


@needs_netns
@pytest.mark.netns
def test_status_does_not_call_a_half_built_cluster_complete(netns_prefix):
    prefix = netns_prefix("hh")
    runner = CliRunner()
    try:
        assert runner.invoke(cluster, ["up", "--nodes", "2", "--gpus-per-node", "2", "--prefix", prefix]).exit_code == 0
        subprocess.run(["ip", "netns", "del", f"{prefix}-n1r1"], check=True)
        text = runner.invoke(cluster, ["status", "--prefix", prefix]).output
        assert "INCOMPLETE" in text and f"missing namespaces: {prefix}-n1r1" in text, text
        assert json.loads(runner.invoke(cluster, ["status", "--prefix", prefix, "--json"]).output)["complete"] is False
        res = runner.invoke(cluster, ["check", "--prefix", prefix])
        assert res.exit_code != 0 and "incomplete" in res.output, res.output
    finally:
        inv.down(prefix)


# ---------------------------------------------------------------------------------------------
# nothing exposed


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A running ``zepp run`` (2 ranks): its listening sockets and its ranks' environments,
    then SIGTERM to the launcher; returns what was seen."""
    tmpdir = tmp_path_factory.mktemp("live") / "tmp"
    p = _start([*TINY, "--iters", "100000"], tmpdir)
    try:
        ranks = _wait_ranks(p, 2)
        tree = set()

        def mine():
            tree.update([p.pid, *_descendants(p.pid)])
            return [(addr, pids) for addr, pids in _listeners() if pids & tree]

        _wait_until(lambda: all(any(r in pids for _, pids in mine()) for r in ranks.values()))
        seen = {"listeners": mine(), "env": {r: _environ(pid) for r, pid in ranks.items()}, "ranks": ranks}
        p.send_signal(signal.SIGTERM)
        seen["returncode"] = p.wait()
        _wait_until(lambda: not any(_alive(pid) for pid in ranks.values()))
        seen["tmp_left"] = sorted(os.listdir(tmpdir))
        return seen
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@needs_ss
def test_run_listens_on_loopback_only(live_run):
    """Every listening socket of the run (rendezvous, gloo) is bound to the loopback device."""
    assert live_run["listeners"], "no listening socket seen"
    for addr, _ in live_run["listeners"]:
        assert addr.startswith("127.") or addr.startswith("[::1]"), live_run["listeners"]


@needs_ss
def test_ranks_rendezvous_through_a_file_not_a_port(live_run):
    """No port is chosen ahead and handed to the ranks (the free-port race): the ranks meet
    through a file store in the run's temp folder, gloo binds ports the kernel picks."""
    for r, env in live_run["env"].items():
        assert "MASTER_PORT" not in env, (r, {k: v for k, v in env.items() if k.startswith("MASTER")})
        assert env.get("ZEPP_STORE_FILE", "").startswith(str(Path(env["TMPDIR"]))), env.get("ZEPP_STORE_FILE")
        assert env.get("GLOO_SOCKET_IFNAME") == "lo"


@needs_ss
def test_sigterm_of_the_launcher_ends_ranks_and_removes_its_temp_folder(live_run):
    assert live_run["returncode"] != 0
    assert live_run["tmp_left"] == []


def test_no_unpickling_of_other_processes_data():
    """The runtime, the serving ranks and the emulated cluster exchange tensors and JSON only: none
    of torch.distributed's pickle-based object collectives, no pickle module."""
    banned = {"all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
              "send_object_list", "recv_object_list"}
    found = []
    paths = sorted(p for pkg in ("runtime", "serve", "emulate", "launch") for p in (SRC / pkg).glob("*.py"))
    assert len(paths) > 30, f"the sources were not found under {SRC}"
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in banned:
                found.append(f"{path.name}:{node.lineno} {node.attr}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(n and n.split(".")[0] in ("pickle", "cPickle", "dill") for n in names):
                    found.append(f"{path.name}:{node.lineno} imports pickle")
    assert not found, found


# ---------------------------------------------------------------------------------------------
# nothing left behind, failures reported as what they were


@needs_netns
@pytest.mark.netns
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_killed_emulate_launcher_leaves_no_namespace_rank_or_temp_folder(tmp_path, how, netns_prefix):
    """``zepp run --emulate`` ended by SIGTERM (handled) or ``kill -9`` (not handled: the
    ranks' parent-death signal and the launcher's watchdog clean up)."""
    prefix = netns_prefix("hk" if how == "SIGKILL" else "ht")
    p = _start([*TINY, "--iters", "100000", "--emulate", "--emulate-prefix", prefix], tmp_path / "tmp")
    try:
        ranks = _wait_ranks(p, 2, "zepp.emulate.worker_rank")
        assert len(inv.list_namespaces(prefix)) == 3
        p.send_signal(getattr(signal, how))
        p.wait()
        _wait_until(lambda: not any(_alive(pid) for pid in ranks.values()))
        _wait_until(lambda: inv.list_namespaces(prefix) == [])
        _wait_until(lambda: os.listdir(tmp_path / "tmp") == [])
    finally:
        if p.poll() is None:
            p.kill()
        inv.down(prefix)
