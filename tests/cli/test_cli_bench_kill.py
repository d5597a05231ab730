"""A ``zepp bench --json`` killed at a random moment (SIGINT, SIGTERM, SIGKILL) leaves a JSON file
that parses (or none), no process and, but for SIGKILL's lock files, nothing beside it; ``--resume``
completes it with the figures of an uninterrupted run, to the last digit. Three trials here; the
20-trial run is ``benchmarks/simulated/bench_kill_resume.py`` (its results file
``benchmarks/results/bench_kill_resume.md``), whose ``trial`` and ``check`` these are."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "simulated" / "bench_kill_resume.py"


def _kill_resume():
    spec = importlib.util.spec_from_file_location("bench_kill_resume", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_a_killed_bench_json_parses_and_resume_completes_it(tmp_path):
    kr = _kill_resume()
    ref = kr.reference(tmp_path / "ref", kr.SMALL)
    rng = random.Random()  # any moment must do: the checks hold wherever the signal lands
    for sig in kr.SIGNALS:
        kr.check(kr.trial(tmp_path / sig, sig, rng.uniform(0.0, ref["seconds"]), ref))
