"""The benchmark table's logic without simulating: jobs (``zepp.sim.bench_jobs``), units of work
and their weights (``bench_units``), speedups and model error (``bench_rows``), the JSON file and
what a resumed run reuses (``bench_table``; ``zepp bench`` end to end:
``tests/cli/test_cli_bench.py``)."""

import json

import pytest

from zepp import registry
from zepp.errors import ZeppInputError
from zepp.sim import bench_jobs, bench_rows, bench_table, bench_units
from zepp.sim.mechanics import MECHANICS

JOB = dict(cluster="a100", nodes=4, gpus_per_node=4, model="k2", budget_mb=1.0, iters=2, warmup=1, seed=0,
           traces=None)


def test_systems_to_run_puts_each_variant_before_its_meta_system_once():
    run = bench_jobs.systems_to_run(["a2av", "zepp", "zepp-overlap", "sglang-deepep"])
    assert run[0] == "a2av" and run.count("zepp-overlap") == 1
    for meta in ("zepp", "sglang-deepep"):
        variants = registry.variants(meta, "sim")
        assert set(variants) <= set(run) and max(run.index(v) for v in variants) < run.index(meta)


def test_units_keep_zepps_family_each_meta_system_and_each_shared_routing_together():
    systems = bench_jobs.systems_to_run(["a2av", "comet", "epic", "eplb", "sglang-deepep", "zepp"])
    units = bench_units.units_of(JOB, systems)
    assert sorted(s for u in units for s in u) == sorted(systems)  # every system in exactly one unit
    zepp_unit = next(u for u in units if "zepp" in u)
    assert set(zepp_unit) == {s for s in systems if registry.SYSTEMS[s].placement == "zepp"}
    deepep = next(u for u in units if "sglang-deepep" in u)
    assert set(deepep) == {"sglang-deepep", *registry.SYSTEMS["sglang-deepep"].best_of}
    # a2av and comet route the same way (home placement and routing): one unit routes their batches once
    assert ["a2av", "comet"] in units and ["epic"] in units and ["eplb"] in units


def test_unit_weight_is_each_mechanics_simulation_cost():
    w = {s: bench_units.unit_weight(JOB, [s]) for s in ("a2av", "eplb", "fast")}
    assert w["eplb"] / w["a2av"] == pytest.approx(MECHANICS["eplb-staged"].sim_cost)
    assert w["fast"] / w["a2av"] == pytest.approx(MECHANICS["fast"].sim_cost)
    assert bench_units.unit_weight(JOB, ["zepp"]) == 0.0  # a meta-system simulates nothing of its own
    bigger = dict(JOB, nodes=8)
    assert bench_units.unit_weight(bigger, ["a2av"]) > w["a2av"]
    units = bench_units.all_units([dict(JOB, systems=["a2av", "eplb"])])
    assert [u["systems"] for u in units] == [["eplb"], ["a2av"]]  # largest first


def test_speedup_and_model_error_against_the_fastest_baseline():
    r = dict(latency_ms={"a2av": 6.0, "fast": 4.0, "zepp": 2.0, "zepp-overlap": 2.0},
             measured_ms={"a2av": 5.0, "fast": 5.0})
    assert bench_rows.speedup(r) == 2.0
    assert bench_rows.model_error(r) == ("fast", pytest.approx(-0.2))
    assert bench_rows.model_error(dict(r, measured_ms={"fast": None})) == ("fast", None)
    assert bench_rows.speedup(dict(r, latency_ms={"zepp": 1.0})) is None
    assert bench_rows.speedup(r, paper=True) == 2.0
    assert bench_rows.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    assert bench_rows.geomean([None]) is None


def test_todays_systems_count_as_baselines_and_zepps_fastest_system_is_zepp():
    """Every system of the run that is not Zepp's is a baseline (today's included); Zepp is the
    fastest zepp* system; the paper's figure (zepp against its seven) stays available."""
    r = dict(cluster="h200-8", nodes=2, gpus_per_node=8, model="k2", budget_mb=0.5, lower_bound_ms=0.5,
             latency_ms={"a2av": 6.0, "sglang-deepep": 3.0, "sglang-lp": 2.5, "sglang-lp-ll": 2.5, "zepp": 4.0,
                         "zepp-deepep": 2.0, "zepp-deepep-ll": 2.0}, measured_ms={"a2av": None})
    assert bench_rows.best_baseline(r) == "sglang-lp" and bench_rows.zepp_best(r) == "zepp-deepep"
    assert bench_rows.speedup(r) == 2.5 / 2.0
    assert bench_rows.best_baseline(r, paper=True) == "a2av" and bench_rows.speedup(r, paper=True) == 6.0 / 4.0
    assert bench_rows.model_error(r) == ("sglang-lp", None)
    line = bench_rows.format_table([r], list(r["latency_ms"])).splitlines()[2]
    assert line.endswith("| sglang-lp | 1.25x (zepp-deepep) | not measured | 0.50 |")
    slower = dict(r, latency_ms=dict(r["latency_ms"], **{"zepp-deepep": 5.0, "zepp-deepep-ll": 5.0}))
    assert bench_rows.zepp_best(slower) == "zepp" and bench_rows.speedup(slower) == 2.5 / 4.0
    assert bench_rows.speedup(dict(r, latency_ms={"zepp": 1.0})) is None


def test_format_table_shows_baselines_first_and_the_speedup(tmp_path):
    r = dict(cluster="a100", nodes=4, gpus_per_node=4, model="k2", budget_mb=1.0, lower_bound_ms=1.0,
             latency_ms={"a2av": 6.0, "zepp": 2.0}, measured_ms={"a2av": 5.0})
    out = bench_rows.format_table([r], ["zepp", "a2av"]).splitlines()
    assert out[0].index("a2av ms") < out[0].index("zepp ms")
    assert out[2] == "| a100 | 4x4 | k2 | 1 | 6.00 | 2.00 | a2av | 3.00x | +20% | 1.00 |"


def test_resume_reuses_only_rows_run_with_the_same_settings(tmp_path):
    path = tmp_path / "b.json"
    jobs = bench_jobs.make_jobs(["a100"], [4], 4, ["k2"], [1.0, 4.0], ["a2av"], 2, 1, 0, None)
    rows = [bench_rows.assemble_row(j, {"a2av": dict(median_ms=m, floor_ms=1.0, variant=None)})
            for j, m in zip(jobs, (3.0, 5.0))]
    bench_table.write_json(path, rows)
    data = json.loads(path.read_text())
    assert [r["latency_ms"] for r in data["rows"]] == [{"a2av": 3.0}, {"a2av": 5.0}]
    assert bench_table.detail_path(path).is_file()
    assert bench_table.stored_rows(jobs, path) == json.loads(bench_table.detail_path(path).read_text())
    more_iters = bench_jobs.make_jobs(["a100"], [4], 4, ["k2"], [1.0, 4.0], ["a2av"], 3, 1, 0, None)
    assert bench_table.stored_rows(more_iters, path) == []
    # already stored: nothing is simulated, the file holds the same rows
    assert bench_table.run_table(jobs, bench_table.stored_rows(jobs, path), 1, path, progress=False) == rows
    path.write_text("{not json")
    bench_table.detail_path(path).unlink()
    with pytest.raises(ZeppInputError, match="--resume: cannot read"):
        bench_table.stored_rows(jobs, path)
