"""``zepp.sim.ablation``: the arms are the rows they say they are, every arm runs on one shared
workload per schedule, and the table is the mean of the per-iteration times."""

from __future__ import annotations

import numpy as np

from zepp import registry
from zepp.sim.ablation import ARMS, arm_system, closing_note, format_table, run_ablation
from zepp.sim.bench_jobs import make_config, make_jobs
from zepp.sim.run import run_system


def test_arms_are_rows_or_documented_combinations():
    rows = registry.SYSTEMS
    assert list(ARMS) == ["comet", "overlap", "placement", "static", "swap", "swap1"]
    assert arm_system("comet") is rows["comet"] and arm_system("static") is rows["zepp-overlap"]
    assert arm_system("swap") is rows["zepp-swap"]
    ov = arm_system("overlap")
    assert (ov.placement, ov.routing) == (rows["comet"].placement, rows["comet"].routing) == ("home", "home")
    assert (ov.dispatch, ov.combine, ov.overlap, ov.mechanics) == ("zepp", "reduce", "zepp", "zepp-overlap")
    pl = arm_system("placement")
    assert (pl.placement, pl.routing) == ("zepp", "zepp")
    assert (pl.dispatch, pl.mechanics, pl.plugins) == (rows["comet"].dispatch, "comet", rows["comet"].plugins)
    s1 = arm_system("swap1")
    assert s1.adaptation == "zepp-swap-once" and s1.adaptation in registry.ADAPTATIONS
    assert {a: arm_system(a).name for a in ARMS}.keys() == ARMS.keys()


def test_swap_once_swaps_only_before_the_second_batch():
    job = make_jobs(["a100"], [2], 4, ["qwen"], [32], [], iters=8, warmup=0, seed=0, traces=None,
                    schedule="rotating")[0]
    cfg = make_config(job)
    every = run_system("zepp-swap", cfg)
    once = run_system(arm_system("swap1"), cfg)
    assert all(n == 0 for i, n in enumerate(once.swapped_slots) if i != 1)
    assert once.swapped_slots[1] == every.swapped_slots[1]
    assert sum(every.swapped_slots) > once.swapped_slots[1]  # the per-batch arm keeps swapping on drift


def test_ablation_table_is_the_mean_over_the_schedule():
    res = run_ablation("qwen", nodes=2, budget_mb=0.5, schedules=("in-history", "rotating"), iters=4)
    assert set(res["schedules"]) == {"in-history", "rotating"}
    for sched, row in res["schedules"].items():
        assert list(row) == list(ARMS)
        d = res["detail"][sched]
        for arm, ms in row.items():
            it = d["arms"][arm]["iters_ms"]
            assert len(it) == 4 and abs(ms - np.mean(it)) < 1e-3
            assert abs(res["speedup_over_comet"][sched][arm] - row["comet"] / ms) < 1e-3
        assert d["topic_mix"]["schedule"] == sched and len(d["topic_mix"]["topic_mix"]) == 4
    # the static arm is zepp-overlap on the schedule's workload, nothing else
    job = make_jobs(["a100"], [2], 4, ["qwen"], [0.5], [], iters=4, warmup=0, seed=0, traces=None,
                    schedule="rotating")[0]
    job["period"] = None
    want = np.mean(run_system("zepp-overlap", make_config(job)).latencies) * 1e3
    assert abs(res["schedules"]["rotating"]["static"] - want) < 1e-3
    table = format_table(res)
    assert table.count("\n") == 3 and "swap1 ms (x)" in table
    assert "rotating: speedup over comet" in closing_note(res)


def test_swaps_are_gated_by_the_clusters_copy_and_gemm_rates():
    """zepp-swap keeps a node's swaps only where the busiest GPU's GEMM time drops by more than
    the copies' exposed time: on drift it swaps; with NVLink a million times slower no copy can
    hide behind the GEMMs and it keeps the static placement."""
    from dataclasses import replace

    job = make_jobs(["a100"], [2], 4, ["qwen"], [32], [], iters=8, warmup=0, seed=0, traces=None,
                    schedule="rotating")[0]
    cfg = make_config(job)
    assert sum(run_system("zepp-swap", cfg).swapped_slots) > 0
    slow = replace(cfg, cluster=replace(cfg.cluster, nvlink_bw=cfg.cluster.nvlink_bw * 1e-6))
    assert sum(run_system("zepp-swap", slow).swapped_slots) == 0
