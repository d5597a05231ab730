"""The runtime over real gloo process groups (local processes): exactness against the
single-process reference, measured bytes == planner bytes for every system, and a rank that
dies or hangs mid-layer ending the run with a clear error.

Processes are expensive on a 2-core machine, so each spawned group runs several cases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zepp.cli.run import RankFailure, spawn_local
from zepp.runtime.worker import default_config

from shared_traces import TRACES, needs_traces  # noqa: E402
ALL = ["a2av", "eplb", "relay", "zepp-overlap", "zepp-a2av", "zepp-sync", "zepp-swap", "zepp-p2p", "zepp-auto"]
# zepp-auto's cost figures for the random case: a slow NIC and free weight reads, so the choice
# splits (groups > 1: compute as long as the transfers) and the coarse-group path of the runtime runs
SPLIT_FIGURES = dict(name="slow-nic", nodes=2, gpus_per_node=2, nic_bw=1e6, hbm_bw=1e15, kernel_launch=1e-9,
                     peak_flops=1e9)


def _assert_ok(report: dict, label: str) -> None:
    for name, s in report["systems"].items():
        assert s["correct"], f"{label}/{name}: max rel err {s['max_rel_err']} (tol {report['tolerance']})"
        assert s["inputs_ok"], f"{label}/{name}: expert inputs differ from the owners' rows"
        assert s["bytes_match"], f"{label}/{name}: measured bytes != planner bytes"
        b = s["bytes_per_iter"]
        for key in ("dispatch_nic", "dispatch_nvlink", "combine_nic", "combine_nvlink"):
            assert b[f"measured_{key}"] == b[f"planned_{key}"], (label, name, key)


def _trace_files(model_dir: str) -> dict:
    pool, ev = TRACES / model_dir / "pool.txt", TRACES / model_dir / "eval.txt"
    return {"history": str(pool), "trace": str(ev)} if ev.is_file() else {}


def test_two_nodes_two_ranks_all_systems():
    cfg = default_config()
    cfg.update(nodes=2, gpus_per_node=2, iters=3, warmup=0, timeout=60, check=True, systems=ALL)
    k2 = _trace_files("k2")
    cases = [
        # random skewed batches (no trace files), fp32, tight relaxation so swaps fire
        dict(model="olmoe", experts=16, topk=4, hidden=32, ffn=16, tokens=24, relaxation=0.1, label="random",
             cost_cluster=SPLIT_FIGURES),
        # Kimi-K2 ids: the recorded traces when present, else the built-in ones
        dict(model="k2", hidden=32, ffn=16, tokens=32, label="k2-real" if k2 else "k2-builtin", **k2),
        # bf16 activations and weights
        dict(model="olmoe", experts=16, topk=4, hidden=32, ffn=16, tokens=16, dtype="bfloat16",
             systems=["a2av", "relay", "zepp-overlap", "zepp-p2p"], label="bf16"),
    ]
    cases.append(dict(cases[0], label="random-again",
                      systems=["zepp-overlap", "zepp-p2p", "zepp-sync", "relay", "zepp-auto"]))
    cfg["cases"] = cases
    report = spawn_local(cfg)
    for case, rep in zip(cases, report["cases"]):
        _assert_ok(rep, case["label"])
    rnd = report["cases"][0]["systems"]
    # the same case again: other arrival timing, bit-identical outputs (fixed wait and sum order)
    again = report["cases"][3]["systems"]
    for name in again:
        assert again[name]["output_digest"] == rnd[name]["output_digest"], name
    assert rnd["zepp-swap"]["swapped_slots"] > 0, "the swap path was not exercised"
    # zepp-auto: every rank chose the same granularity, per batch; the split path ran
    for rep in report["cases"][:2]:
        auto = rep["systems"]["zepp-auto"]
        assert auto["granularity_same_on_all_ranks"] and all(g is not None for g in auto["granularity"])
    assert any(g[0] > 1 for g in rnd["zepp-auto"]["granularity"]), rnd["zepp-auto"]["granularity"]
    # K2 with the default (a100) figures: tiny layer, weight-read bound: one GEMM, the blocking path
    assert all(g == [1, 1] for g in report["cases"][1]["systems"]["zepp-auto"]["granularity"])
    assert rnd["zepp-swap"]["swap_bytes"] > 0
    # the transports really differ: zepp crosses the NICs with fewer bytes than a2av
    k2sys = report["cases"][1]["systems"]
    nic = {n: sum(k2sys[n]["bytes_per_iter"]["measured_dispatch_nic"]) for n in ("a2av", "relay", "zepp-overlap")}
    assert nic["zepp-overlap"] < nic["a2av"] and nic["relay"] < nic["a2av"]
    assert report["cases"][2]["tolerance"] == 2e-2


def test_two_nodes_four_ranks_cli(tmp_path):
    """The ``zepp run`` command end to end, 8 ranks, Qwen ids (recorded when present)."""
    out = tmp_path / "run.json"
    files = _trace_files("qwen3")
    args = [sys.executable, "-m", "zepp.cli", "run", "--nodes", "2", "--gpus-per-node", "4", "--model", "qwen",
            "--hidden", "32", "--ffn", "16", "--tokens", "16", "--systems", "all,zepp-sync,zepp-p2p", "--check",
            "--iters", "1", "--warmup", "0", "--json", str(out)]
    for k, v in files.items():
        args += [f"--{k}", v]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "zepp-sync" in proc.stdout and "NO" not in proc.stdout
    report = json.loads(out.read_text())
    assert set(report["systems"]) == {"a2av", "eplb", "relay", "zepp-overlap", "zepp-a2av", "zepp-sync", "zepp-p2p"}
    _assert_ok(report, "qwen-2x4")


def _fault_cfg(mode: str, rank: int, timeout: float) -> dict:
    cfg = default_config()
    cfg.update(nodes=2, gpus_per_node=1, model="olmoe", experts=8, topk=2, hidden=16, ffn=8, tokens=8, iters=2,
               warmup=0, timeout=timeout, check=False, systems=["zepp-overlap"],
               fault={"rank": rank, "system": "zepp-overlap", "iter": 1, "mode": mode})
    return cfg


def test_dead_rank_ends_the_run():
    """A rank that dies mid-layer (exit 17) ends the run: its peer notices at once (exit 3, a
    communication failure, well before the collective timeout of 600 s, which is also what
    tells a noticed death from a timeout: a timeout would need 600 s)."""
    with pytest.raises(RankFailure) as info:
        spawn_local(_fault_cfg("die", rank=1, timeout=600), quiet=True)
    exc = info.value
    assert exc.culprits == [1] and exc.codes[1] == 17 and exc.codes[0] == 3, str(exc)
    assert "communication failed" in exc.errs[0] and "Timed out" not in exc.errs[0], exc.errs[0]
    assert "rank 1 died" in str(exc) and exc.hung == []


def test_hung_rank_times_out():
    """A rank that hangs mid-layer: its peer's collective times out (exit 3) and the launcher
    kills the hung rank after the grace period, reporting it as a hang (not as a signal)."""
    with pytest.raises(RankFailure) as info:
        spawn_local(_fault_cfg("hang", rank=0, timeout=4), quiet=True, grace=3)
    exc = info.value
    assert exc.codes[1] == 3 and exc.culprits == [0] and exc.codes[0] == -9 and exc.hung == [0], str(exc)
    assert "rank 0 hung (still running 3 s after rank 1 failed) and was killed by the launcher" in str(exc)
    assert "Timed out" in exc.errs[1] or "timed out" in exc.errs[1].lower(), exc.errs[1]
