"""The engines' code is fetched, never committed: the fixture downloads the pinned wheels into a
cache folder outside the repository and extracts only the modules the tests load; a download
that fails ends the test with one line that says so (a failure, not a skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine_code

ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_download_fails_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPP_ENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(pytest.fail.Exception) as exc:
        engine_code.wheel("sglang")
    line = str(exc.value)
    assert line.startswith("could not download sglang==0.5.23 from PyPI into") and "\n" not in line
    assert not list((tmp_path / "cache" / "wheels").iterdir()), "nothing half-downloaded is left in the cache"


def test_the_cache_lies_outside_the_repository_and_holds_only_what_the_tests_load():
    cache = engine_code.cache_dir().resolve()
    assert ROOT not in cache.parents and cache != ROOT
    for engine, modules in engine_code.MODULES.items():
        src = engine_code.sources(engine)
        got = sorted(str(p.relative_to(src)) for p in src.rglob("*.py"))
        assert got == sorted(modules), engine
    assert not list(ROOT.rglob("expert_location.py")) and not list(ROOT.rglob("eplb_state.py"))
