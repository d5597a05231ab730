"""The runtime over real gloo process groups (local processes): exactness against the
single-process reference, measured bytes == planner bytes for every system, and ``zepp run``
end to end, also when a rank dies mid-layer (the launcher's failure path itself, hangs included,
is tested with small non-torch ranks in ``tests/launch/test_launch_ranks.py``).

Processes are expensive on a 2-core machine, so each spawned group runs several cases, and the
commands run in this process (no extra interpreter importing torch).
"""

from __future__ import annotations

import json

import pytest

from zepp.cli import main as zepp_main
from zepp.launch.ranks import spawn_local
from zepp.runtime.worker import MODULE, default_config

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


@pytest.fixture(scope="module")
def k2_builtin(tmp_path_factory) -> dict:
    """Kimi-K2's built-in synthetic traces (what ``zepp run`` samples without ``--trace``),
    made once here and written as trace files, so the ranks read them instead of each making
    them again."""
    from zepp.traces.synthetic import synthetic_traces

    folder = tmp_path_factory.mktemp("k2")
    files = {}
    for opt, tr in zip(("history", "trace"), synthetic_traces("k2", seed=0)):
        path = folder / f"{opt}.txt"
        path.write_text("\n".join(" ".join(map(str, row)) for row in tr.topk_ids.tolist()) + "\n")
        files[opt] = str(path)
    return files


def test_two_nodes_two_ranks_all_systems(k2_builtin):
    cfg = default_config()
    cfg.update(nodes=2, gpus_per_node=2, iters=3, warmup=0, timeout=60, check=True, systems=ALL)
    cases = [
        # random skewed batches (no trace files), fp32, tight relaxation so swaps fire
        dict(model="olmoe", experts=16, topk=4, hidden=32, ffn=16, tokens=24, relaxation=0.1, label="random",
             cost_cluster=SPLIT_FIGURES),
        # Kimi-K2 ids: the built-in synthetic traces
        dict(model="k2", hidden=32, ffn=16, tokens=32, label="k2-builtin", **k2_builtin),
        # bf16 activations and weights
        dict(model="olmoe", experts=16, topk=4, hidden=32, ffn=16, tokens=16, dtype="bfloat16",
             systems=["a2av", "relay", "zepp-overlap", "zepp-p2p"], label="bf16"),
    ]
    cases.append(dict(cases[0], label="random-again",
                      systems=["zepp-overlap", "zepp-p2p", "zepp-sync", "relay", "zepp-auto"]))
    cfg["cases"] = cases
    report = spawn_local(MODULE, cfg)
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
    # every rank's record came back through the JSON exchange (gather_json), the traces named
    assert report["cases"][0]["traces"]["eval"].startswith("zipf(") and report["cases"][1]["traces"]["eval"]


def test_two_nodes_four_ranks_cli(tmp_path, capfd, traces_dir):
    """The ``zepp run`` command end to end, 8 ranks, Qwen's recorded ids."""
    out = tmp_path / "run.json"
    zepp_main(["run", "--nodes", "2", "--gpus-per-node", "4", "--model", "qwen", "--hidden", "32", "--ffn", "16",
               "--tokens", "16", "--systems", "all,zepp-sync,zepp-p2p", "--check", "--iters", "1", "--warmup", "0",
               "--history", str(traces_dir / "qwen3" / "pool.txt"), "--trace", str(traces_dir / "qwen3" / "eval.txt"),
               "--json", str(out)])  # returns: exit code 0
    stdout = capfd.readouterr().out
    assert "zepp-sync" in stdout and "NO" not in stdout
    report = json.loads(out.read_text())
    assert set(report["systems"]) == {"a2av", "eplb", "relay", "zepp-overlap", "zepp-a2av", "zepp-sync", "zepp-p2p"}
    _assert_ok(report, "qwen-2x4")


def test_dead_rank_ends_the_run(capfd):
    """``zepp run`` with a rank that dies mid-layer (exit 17): its peer notices at once (exit 3, a
    communication failure, well before the collective timeout of 600 s, which is also what tells a
    noticed death from a timeout), the command exits 3 naming the rank that died, not its peer."""
    fault = json.dumps({"rank": 1, "system": "zepp-overlap", "iter": 1, "mode": "die"})
    with pytest.raises(SystemExit) as info:
        zepp_main(["run", "--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--experts", "8", "--topk", "2",
                   "--hidden", "16", "--ffn", "8", "--tokens", "8", "--iters", "2", "--warmup", "0", "--timeout",
                   "600", "--systems", "zepp-overlap", "--fault", fault])
    err = capfd.readouterr().err
    assert info.value.code == 3, err
    head = err.splitlines()[0]
    assert head.startswith("zepp run: rank 1 died (fault injection)") and "; rank 0" not in head, err
    assert "exit codes by rank: [3, 17]" in head, err
    assert "rank 0: zepp worker rank 0: communication failed" in err and "Timed out" not in err, err
