"""The planning-cost model (``zepp.sim.planning_cost``): each baseline's planner at PAPER.md
section 7's figures, what each gathers first, and Zepp's counted rounds growing with the batch."""

import pytest

from zepp import registry
from zepp.errors import ZeppInputError
from zepp.model import model_preset
from zepp.sim.calibrate import calibrated
from zepp.sim.planning_cost import MODELS, planning_seconds


def seconds(model, system="a2av", nodes=4, mb=1.0, spec="k2"):
    cl, net = calibrated("a100", nodes)
    spec = model_preset(spec)
    return planning_seconds(model, registry.system(system), cl, spec, spec.tokens_for_budget(mb), net), cl, net, spec


def test_baseline_planners_cost_their_measured_figures():
    (pro, plan), cl, net, spec = seconds("none")
    loads = net.allgather(cl.ranks, spec.num_experts * 4.0, cl.nic_bw)
    assert plan == 0.0 and pro == loads > 0
    assert seconds("fast-host")[0] == (loads + 0.9e-3, 0.9e-3)
    assert seconds("comet-routing")[0][1] == 0.075e-3
    # EPLB's torch planner: 3.0 ms + 4.1 ns per global entry (about 3.1 ms at K2, 4 nodes, 1 MB)
    T = spec.tokens_for_budget(1.0)
    assert seconds("eplb-torch")[0][1] == pytest.approx(3.0e-3 + 4.1e-9 * cl.ranks * T * spec.top_k)
    assert 3.0e-3 < seconds("eplb-torch")[0][1] < 3.2e-3
    assert seconds("epic", mb=16)[0][1] == pytest.approx(2.5e-3, abs=0.1e-3)


def test_moonep_gathers_the_topk_ids_not_the_loads():
    (pro, plan), cl, net, spec = seconds("moonep", mb=16)
    entries = spec.tokens_for_budget(16) * spec.top_k
    assert plan == pytest.approx(2.2e-3, abs=0.1e-3)
    assert pro - plan == pytest.approx(net.allgather(cl.ranks, entries * 4.0, cl.nic_bw))
    assert pro - plan > net.allgather(cl.ranks, spec.num_experts * 4.0, cl.nic_bw)


def test_zepps_planner_grows_with_the_batch_and_its_parts():
    small = seconds("zepp", "zepp-overlap", mb=1)[0][1]
    big = seconds("zepp", "zepp-overlap", mb=64)[0][1]
    assert 0 < small < big
    assert seconds("zepp+swap", "zepp-swap", mb=1)[0][1] > seconds("zepp", "zepp-swap", mb=1)[0][1]
    assert seconds("zepp+granularity", "zepp-auto", mb=1)[0][1] > seconds("zepp", "zepp-auto", mb=1)[0][1]


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ZeppInputError, match="eplb-torch"):
        seconds("guess")
    assert set(MODELS) >= {s.planning for s in registry.SYSTEMS.values()}


def test_charged_device_records_replace_the_op_mix_only_inside_the_block():
    """``planner_times.charged_records`` makes Zepp's planning cost the device run's CUDA-graph part
    times (interpolated in the entries, route + flows) and the op-mix model again after the block;
    a device run whose captures all failed is refused."""
    from zepp.sim.planner_times import charged_records, record_from_device_run
    from zepp.sim.planning_cost import zepp_planning

    run = {"measured_at": "2026-12-04T00:00:00+00:00", "torch": "x", "hbm_bw": 4.8e12,
           "rows": [{"model": "k2", "nodes": 4, "mb": 1, "entries": 1000, "device": "gpu",
                     "parts_ms": {"route:zepp": 2.0, "flows:zepp/reduce": 1.0}},
                    {"model": "k2", "nodes": 4, "mb": 4, "entries": 3000, "device": "gpu",
                     "parts_ms": {"route:zepp": 4.0, "flows:zepp/reduce": 2.0}},
                    {"model": "k2", "nodes": 8, "mb": 1, "entries": 5000, "device": "gpu", "graph_error": "x"}]}
    op_mix = zepp_planning("zepp", "reduce", False, 2000, 4.8e12)
    with charged_records([record_from_device_run(run)]):
        assert zepp_planning("zepp", "reduce", False, 2000, 4.8e12) == pytest.approx(3.0e-3 + 1.5e-3)
    assert zepp_planning("zepp", "reduce", False, 2000, 4.8e12) == op_mix
    assert op_mix < 1e-3
    with pytest.raises(ZeppInputError, match="field rows; give a run with at least one CUDA-graph row"):
        record_from_device_run({"measured_at": "x", "rows": [run["rows"][2]]})


BAD_RUNS = [
    ("not json {", "not valid JSON"),
    ('{"rows": []}', "rows and measured_at"),
    ('{"measured_at": "x", "rows": [{"entries": 0, "parts_ms": {"route:zepp": 1}}]}', r"field rows\[0\].entries"),
    ('{"measured_at": "x", "rows": [{"entries": 9, "parts_ms": {"route:zepp": -1}}]}',
     r"field rows\[0\].parts_ms route:zepp; give milliseconds"),
    ('{"measured_at": "x", "rows": [{"entries": 9, "parts_ms": {"route:zepp": "1"}}]}', "finite and >= 0"),
    ('{"measured_at": "x", "rows": [{"entries": 9, "parts_ms": [1]}]}', "not an object"),
]


@pytest.mark.parametrize("text,message", BAD_RUNS)
def test_a_bad_device_run_is_one_line_naming_the_field(tmp_path, text, message):
    from zepp.sim.planner_times import read_device_run

    path = tmp_path / "run.json"
    path.write_text(text)
    with pytest.raises(ZeppInputError, match=message) as e:
        read_device_run(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ZeppInputError, match="no such file|not found|does not exist"):
        read_device_run(tmp_path / "absent.json")


def test_bench_today_refuses_a_bad_planner_times_file_before_any_work(tmp_path):
    """``bench_today.py --planner-times`` with a bad file: one ``error:`` line, exit 2, no output."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "simulated" / "bench_today.py"
    bad = tmp_path / "run.json"
    bad.write_text('{"measured_at": "x", "rows": []}')
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(script), "--planner-times", str(bad), "--out", str(out), "--only", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_today: error: --planner-times: planner device run, ")
    assert r.stdout == "" and not out.exists()
