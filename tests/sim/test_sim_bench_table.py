"""The benchmark table's logic (``zepp.sim.bench_table``) without simulating: jobs, units of work
and their weights, speedups and model error, the JSON file and what a resumed run reuses
(``zepp bench`` end to end: ``tests/cli/test_cli_bench.py``)."""

import json

import pytest

from zepp import registry
from zepp.errors import ZeppInputError
from zepp.sim import bench_table as table
from zepp.sim.mechanics import MECHANICS

JOB = dict(cluster="a100", nodes=4, gpus_per_node=4, model="k2", budget_mb=1.0, iters=2, warmup=1, seed=0,
           traces=None)


def test_systems_to_run_puts_each_variant_before_its_meta_system_once():
    run = table.systems_to_run(["a2av", "zepp", "zepp-overlap", "sglang-deepep"])
    assert run[0] == "a2av" and run.count("zepp-overlap") == 1
    for meta in ("zepp", "sglang-deepep"):
        variants = registry.variants(meta, "sim")
        assert set(variants) <= set(run) and max(run.index(v) for v in variants) < run.index(meta)


def test_units_keep_zepps_family_and_each_meta_system_together():
    systems = table.systems_to_run(["a2av", "comet", "sglang-deepep", "zepp"])
    units = table.units_of(JOB, systems)
    assert sorted(s for u in units for s in u) == sorted(systems)  # every system in exactly one unit
    zepp_unit = next(u for u in units if "zepp" in u)
    assert set(zepp_unit) == {s for s in systems if registry.SYSTEMS[s].placement == "zepp"}
    deepep = next(u for u in units if "sglang-deepep" in u)
    assert set(deepep) == {"sglang-deepep", *registry.SYSTEMS["sglang-deepep"].best_of}
    assert ["a2av"] in units and ["comet"] in units


def test_unit_weight_is_each_mechanics_simulation_cost():
    w = {s: table.unit_weight(JOB, [s]) for s in ("a2av", "eplb", "fast")}
    assert w["eplb"] / w["a2av"] == pytest.approx(MECHANICS["eplb-staged"].sim_cost)
    assert w["fast"] / w["a2av"] == pytest.approx(MECHANICS["fast"].sim_cost)
    assert table.unit_weight(JOB, ["zepp"]) == 0.0  # a meta-system simulates nothing of its own
    bigger = dict(JOB, nodes=8)
    assert table.unit_weight(bigger, ["a2av"]) > w["a2av"]
    units = table.all_units([dict(JOB, systems=["a2av", "eplb"])])
    assert [u["systems"] for u in units] == [["eplb"], ["a2av"]]  # largest first


def test_speedup_and_model_error_against_the_fastest_baseline():
    r = dict(latency_ms={"a2av": 6.0, "fast": 4.0, "zepp": 2.0, "zepp-overlap": 2.0},
             measured_ms={"a2av": 5.0, "fast": 5.0})
    assert table.speedup(r) == 2.0
    assert table.model_error(r) == ("fast", pytest.approx(-0.2))
    assert table.model_error(dict(r, measured_ms={"fast": None})) == ("fast", None)
    assert table.speedup(dict(r, latency_ms={"zepp": 1.0})) is None
    assert table.speedup(r, paper=True) == 2.0
    assert table.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    assert table.geomean([None]) is None


def test_todays_systems_count_as_baselines_and_zepps_fastest_system_is_zepp():
    """Every system of the run that is not Zepp's is a baseline (today's included); Zepp is the
    fastest zepp* system; the paper's figure (zepp against its seven) stays available."""
    r = dict(cluster="h200-8", nodes=2, gpus_per_node=8, model="k2", budget_mb=0.5, lower_bound_ms=0.5,
             latency_ms={"a2av": 6.0, "sglang-deepep": 3.0, "sglang-lp": 2.5, "sglang-lp-ll": 2.5, "zepp": 4.0,
                         "zepp-deepep": 2.0, "zepp-deepep-ll": 2.0}, measured_ms={"a2av": None})
    assert table.best_baseline(r) == "sglang-lp" and table.zepp_best(r) == "zepp-deepep"
    assert table.speedup(r) == 2.5 / 2.0
    assert table.best_baseline(r, paper=True) == "a2av" and table.speedup(r, paper=True) == 6.0 / 4.0
    assert table.model_error(r) == ("sglang-lp", None)
    line = table.format_table([r], list(r["latency_ms"])).splitlines()[2]
    assert line.endswith("| sglang-lp | 1.25x (zepp-deepep) | not measured | 0.50 |")
    slower = dict(r, latency_ms=dict(r["latency_ms"], **{"zepp-deepep": 5.0, "zepp-deepep-ll": 5.0}))
    assert table.zepp_best(slower) == "zepp" and table.speedup(slower) == 2.5 / 4.0
    assert table.speedup(dict(r, latency_ms={"zepp": 1.0})) is None


def test_format_table_shows_baselines_first_and_the_speedup(tmp_path):
    r = dict(cluster="a100", nodes=4, gpus_per_node=4, model="k2", budget_mb=1.0, lower_bound_ms=1.0,
             latency_ms={"a2av": 6.0, "zepp": 2.0}, measured_ms={"a2av": 5.0})
    out = table.format_table([r], ["zepp", "a2av"]).splitlines()
    assert out[0].index("a2av ms") < out[0].index("zepp ms")
    assert out[2] == "| a100 | 4x4 | k2 | 1 | 6.00 | 2.00 | a2av | 3.00x | +20% | 1.00 |"


def test_resume_reuses_only_rows_run_with_the_same_settings(tmp_path):
    path = tmp_path / "b.json"
    jobs = table.make_jobs(["a100"], [4], 4, ["k2"], [1.0, 4.0], ["a2av"], 2, 1, 0, None)
    rows = [table.assemble_row(j, {"a2av": dict(median_ms=m, floor_ms=1.0, variant=None)})
            for j, m in zip(jobs, (3.0, 5.0))]
    table.write_json(path, rows)
    data = json.loads(path.read_text())
    assert [r["latency_ms"] for r in data["rows"]] == [{"a2av": 3.0}, {"a2av": 5.0}]
    assert table.detail_path(path).is_file()
    assert table.stored_rows(jobs, path) == json.loads(table.detail_path(path).read_text())
    more_iters = table.make_jobs(["a100"], [4], 4, ["k2"], [1.0, 4.0], ["a2av"], 3, 1, 0, None)
    assert table.stored_rows(more_iters, path) == []
    # already stored: nothing is simulated, the file holds the same rows
    assert table.run_table(jobs, table.stored_rows(jobs, path), 1, path, progress=False) == rows
    path.write_text("{not json")
    table.detail_path(path).unlink()
    with pytest.raises(ZeppInputError, match="--resume: cannot read"):
        table.stored_rows(jobs, path)
