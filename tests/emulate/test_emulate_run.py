"""``zepp run --emulate``: the runtime over an emulated 2-node cluster, its NIC counters, faults.

Needs root and network namespaces (skipped with the reason otherwise). Every test uses its own
namespace prefix (the ``netns_prefix`` fixture), so parallel sessions on one machine do not
collide, and checks that nothing is left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from zepp.emulate import inventory as inv
from zepp.emulate import host_check
from procs import alive as _alive
from procs import default_sigint

OK, REASON = host_check.availability()
needs_netns = pytest.mark.skipif(not OK, reason=REASON or "emulated cluster available")
pytestmark = pytest.mark.netns

# K2's routing shape with 64 experts: batches from a seeded Zipf trace (instant) instead of the
# built-in K2 traces, which every rank would synthesise (seconds of CPU per process)
SMALL = ["--nodes", "2", "--gpus-per-node", "2", "--model", "k2", "--experts", "64", "--hidden", "64", "--ffn", "32",
         "--tokens", "128"]
# the fault and signal tests need two nodes, not two ranks per node: half the processes to start
SMALL1 = ["--nodes", "2", "--gpus-per-node", "1", "--model", "k2", "--experts", "64", "--hidden", "64",
          "--ffn", "32", "--tokens", "128"]


def _zepp_run(args):
    return subprocess.run([sys.executable, "-m", "zepp.cli", "run", *args], capture_output=True, text=True)


@needs_netns
def test_one_zepp_layer_over_the_emulated_cluster(tmp_path, netns_prefix):
    """The real launcher path: one correct zepp layer; each NIC's counter carries at least the
    planner's inter-node payload of that rank and at most a small margin more (headers, ACKs,
    the barrier, the metadata all-gather); the cluster is gone afterwards."""
    prefix = netns_prefix("er")
    out = tmp_path / "r.json"
    p = _zepp_run([*SMALL, "--systems", "zepp-overlap,zepp-swap", "--iters", "1", "--warmup", "0", "--check",
                   "--emulate",
                      "--emulate-prefix", prefix, "--json", str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "emulated cluster: 2 nodes x 2 ranks" in p.stdout
    rep = json.loads(out.read_text())
    s = rep["systems"]["zepp-overlap"]
    assert s["correct"] and s["bytes_match"]
    em = rep["emulate"]["systems"]["zepp-overlap"]
    tx, planned = np.array(em["nic_tx"]), np.array(em["planned_nic"])
    assert planned.sum() == sum(s["bytes_per_iter"]["planned_dispatch_nic"]) + sum(
        s["bytes_per_iter"]["planned_combine_nic"])
    assert planned.min() > 0
    meta_per_rank = em["metadata_nic"] / len(tx)
    assert np.all(tx >= planned), (tx, planned)
    # wire overhead: ~3% headers at MTU 9000, ACKs, one barrier, a few KB of connection noise
    assert np.all(tx <= 1.08 * (planned + meta_per_rank) + 16384), (tx, planned, meta_per_rank)
    # a swapping system: counters measured, planned figures left out (its placement lives in the ranks)
    sw = rep["emulate"]["systems"]["zepp-swap"]
    assert sw["planned_nic"] is None and min(sw["nic_tx"]) > 0 and rep["systems"]["zepp-swap"]["correct"]
    assert inv.list_namespaces(prefix) == []


@needs_netns
def test_killed_rank_mid_layer_ends_the_run(netns_prefix):
    """``--emulate`` end to end when a rank dies: exit 3 naming it, the cluster torn down."""
    prefix = netns_prefix("ek")
    fault = json.dumps({"rank": 1, "system": "zepp-overlap", "iter": 1, "mode": "die"})
    p = _zepp_run([*SMALL1, "--systems", "zepp-overlap", "--iters", "2", "--warmup", "0", "--timeout", "10",
                       "--emulate", "--emulate-prefix", prefix, "--fault", fault])
    assert p.returncode == 3, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "rank 1 died" in p.stderr and "torn down" in p.stderr
    assert inv.list_namespaces(prefix) == []


@needs_netns
def test_node_off_the_network_mid_layer_ends_the_run(netns_prefix):
    """The NIC of node 1 goes down at the start of rank 1's second layer: every rank ends with a
    communication error (the collective timeout), the launcher raises, the cluster is gone."""
    from zepp.emulate.launcher import run_emulated
    from zepp.errors import RankFailure
    from zepp.runtime.worker import default_config

    prefix = netns_prefix("en")
    cfg = default_config()
    cfg.update(nodes=2, gpus_per_node=1, model="k2", experts=64, hidden=64, ffn=32, tokens=128, systems=["zepp-overlap"], iters=3,
               warmup=0, check=False, timeout=6.0)
    with pytest.raises(RankFailure) as ei:
        run_emulated(cfg, rate_mbit=1000, prefix=prefix, nic_fault=(1, 1))
    msg = str(ei.value)
    assert "communication failed" in msg and "NICs of node 1 were taken down" in msg, msg
    assert inv.list_namespaces(prefix) == []


@pytest.mark.parametrize("command", ["run", "generate"])
def test_emulate_without_netns_is_one_clear_message(monkeypatch, capfd, command):
    """Checked with the options, before any rank starts (``generate``: before the checkpoint is read)."""
    from zepp.cli import main as zepp_main

    monkeypatch.setattr(host_check, "_AVAILABLE", (False, "the emulated cluster needs root (network namespaces, veth, tc); "
                                                  "run as root"))
    args = SMALL if command == "run" else ["--checkpoint", "/nonexistent-zepp-checkpoint", "--input-ids", "x.json"]
    with pytest.raises(SystemExit) as info:
        zepp_main([command, *args, "--emulate"])
    err = capfd.readouterr().err
    assert info.value.code == 2 and err.splitlines() == ["zepp: error: --emulate: emulated cluster unavailable: the "
                                                         "emulated cluster needs root (network namespaces, veth, tc); "
                                                         "run as root"], err


@needs_netns
def test_ctrl_c_tears_the_cluster_down(netns_prefix):
    """SIGINT to ``zepp run --emulate`` mid-run: the launcher exits, no namespace and no rank is left."""
    import signal

    prefix = netns_prefix("ec")
    p = subprocess.Popen([sys.executable, "-m", "zepp.cli", "run", *SMALL1, "--systems", "zepp-overlap", "--iters", "100000",
                          "--emulate", "--emulate-prefix", prefix], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         # SIGINT may be ignored in a background job's children; the test needs it
                         preexec_fn=default_sigint)
    try:
        while len(inv.list_namespaces(prefix)) < 3:  # 2 ranks + the switch
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.2)
        pids = []
        while not pids:
            pids = [int(x) for ns in inv.list_namespaces(prefix) for x in subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]
            time.sleep(0.2)
        assert pids, "no rank process started"
        p.send_signal(signal.SIGINT)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0
    assert inv.list_namespaces(prefix) == []
    while [pid for pid in pids if _alive(pid)]:  # the launcher reaped them; pytest's timeout bounds this
        time.sleep(0.05)
