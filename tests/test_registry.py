"""One table of systems: every command accepts exactly the registry names it supports, with one
meaning, and the README's table is the registry's."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from zepp import registry
from zepp.cli import cli, main
from zepp.errors import ZeppInputError

README = Path(__file__).resolve().parents[1] / "README.md"
COMMAND_OF = {"plan": "plan", "sim": "bench", "runtime": "run"}


def test_rows_name_known_stage_choices_and_the_paper_columns():
    for s in registry.SYSTEMS.values():
        assert s.placement in registry.PLACEMENTS and s.routing in registry.ROUTINGS
        assert s.dispatch in registry.DISPATCHES and s.combine in registry.COMBINES
        assert s.summary and s.stands_for
    from zepp.sim.measured import system_columns

    assert set(registry.PAPER_BASELINES) == set(system_columns())


def test_stage_tables_are_the_planner_stages_own_records():
    """Each stage owns one table of records (name, meaning, function, flags, torch twin) in its
    package; the registry reads them and every row's records are its properties."""
    from zepp.planner import adaptation, flows, overlap, placement, routing
    from zepp.planner.choices import Choice, ChoiceTable

    assert registry.PLACEMENTS is placement.PLACEMENTS and registry.ROUTINGS is routing.ROUTINGS
    assert registry.DISPATCHES is flows.DISPATCHES and registry.COMBINES is flows.COMBINES
    assert registry.OVERLAPS is overlap.OVERLAPS and registry.ADAPTATIONS is adaptation.ADAPTATIONS
    for field, _, table in registry.STAGE_TABLES:
        assert isinstance(table, ChoiceTable) and table
        for name, c in table.items():
            assert isinstance(c, Choice) and c.name == name
            assert isinstance(c.meaning, str) and c.meaning and "\n" not in c.meaning
    for s in registry.SYSTEMS.values():
        assert s.routing_choice is registry.ROUTINGS[s.routing] and s.overlap_choice is registry.OVERLAPS[s.overlap]
        assert s.swaps == registry.ADAPTATIONS[s.adaptation].swaps
    assert registry.SYSTEMS["zepp-swap"].swaps and not registry.SYSTEMS["zepp-overlap"].swaps
    with pytest.raises(ZeppInputError, match="unknown routing 'nope'; choose one of home"):
        registry.ROUTINGS.choice("nope")


@pytest.mark.parametrize("executor", registry.EXECUTORS)
def test_parse_accepts_exactly_the_supported_names(executor):
    for name, s in registry.SYSTEMS.items():
        if s.supports(executor):
            assert registry.parse_systems(name, executor) == [name]
        else:
            with pytest.raises(ZeppInputError, match="not supported by this command"):
                registry.parse_systems(name, executor)
    with pytest.raises(ZeppInputError, match="unknown system"):
        registry.parse_systems("deepep-ll", executor)


def test_meta_system_expands_to_its_supported_variants():
    assert registry.parse_systems("zepp", "plan", expand=True) == ["zepp-a2av", "zepp-overlap", "zepp-auto"]  # no swaps
    assert registry.parse_systems("zepp", "runtime", expand=True) == list(registry.SYSTEMS["zepp"].best_of)


def test_help_texts_list_the_registry_names():
    for executor, command in COMMAND_OF.items():
        res = CliRunner().invoke(cli, [command, "--help"])
        assert res.exit_code == 0
        text = "".join(res.output.split())  # click wraps long lines, also at hyphens
        for name in registry.names_for(executor):
            assert name in text, (command, name)


def _fails(args, capsys, word):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err
    return err


def test_plan_walks_the_registry(tmp_path, capsys):
    out = tmp_path / "p.json"
    main(["plan", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2", "--budget-mb", "0.05", "--iters", "1",
          "--systems", "all", "--json", str(out)])
    rows = {r["system"]: r for r in json.loads(out.read_text())["systems"]}
    expected = [v for n in registry.names_for("plan") for v in registry.variants(n, "plan")]
    assert set(rows) == set(expected)
    for name, r in rows.items():  # each row planned with its registry stage choices
        s = registry.SYSTEMS[name]
        assert (r["placement"], r["routing"], r["dispatch"], r["combine"]) == (s.placement, s.routing, s.dispatch,
                                                                               s.combine)
    capsys.readouterr()
    _fails(["plan", "--systems", "comet"], capsys, "runs in: sim")


def test_bench_and_timeline_walk_the_registry(tmp_path, capsys):
    out = tmp_path / "b.json"
    main(["bench", "--nodes", "1", "--models", "qwen", "--budgets", "0.5", "--iters", "1", "--warmup", "1",
          "--systems", "all", "--jobs", "1", "--json", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert set(row["latency_ms"]) == set(registry.names_for("sim"))
    capsys.readouterr()
    _fails(["bench", "--systems", "zepp-p2p"], capsys, "runs in: runtime")
    png = tmp_path / "t.png"
    main(["timeline", "--nodes", "1", "--model", "qwen", "--budget-mb", "0.5", "--system", "zepp", "--compare",
          "a2av", "--out", str(png)])
    text = capsys.readouterr().out
    assert "zepp (zepp-" in text and "a2av:" in text and png.stat().st_size > 0
    _fails(["timeline", "--system", "zepp-p2p"], capsys, "runs in: runtime")
    main(["timeline", "--nodes", "1", "--model", "qwen", "--budget-mb", "0.5", "--compare", "eplb,zepp-overlap",
          "--out", str(png)])
    text = capsys.readouterr().out
    assert "eplb:" in text and "zepp-overlap:" in text
    _fails(["timeline", "--nodes", "1", "--ranks", "999"], capsys, "outside")


@pytest.mark.slow
def test_run_walks_the_registry(tmp_path, capsys):
    out = tmp_path / "r.json"
    runtime = [v for n in registry.names_for("runtime") for v in registry.variants(n, "runtime")]
    main(["run", "--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--hidden", "32", "--ffn", "16",
          "--tokens", "8", "--iters", "1", "--warmup", "0", "--systems", ",".join(dict.fromkeys(runtime)), "--check",
          "--json", str(out)])
    report = json.loads(out.read_text())
    assert set(report["systems"]) == set(runtime)
    assert all(s["correct"] and s["bytes_match"] for s in report["systems"].values())
    capsys.readouterr()
    _fails(["run", "--systems", "comet"], capsys, "runs in: sim")


def test_readme_system_table_is_the_registry():
    text = README.read_text()
    assert registry.markdown_table() in text, "README's system table differs from `zepp systems --markdown`"
    for table in (registry.PLACEMENTS, registry.ROUTINGS, registry.DISPATCHES, registry.COMBINES):
        for name in table:
            assert f"`{name}`" in text, f"README does not name stage choice {name!r}"


def test_systems_command_prints_json_and_text():
    res = CliRunner().invoke(cli, ["systems", "--json"])
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert [s["name"] for s in data["systems"]] == list(registry.SYSTEMS)
    res = CliRunner().invoke(cli, ["systems"])
    assert all(name in res.output for name in registry.SYSTEMS)
