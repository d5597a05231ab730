"""The executors sit below the launchers: ``zepp.runtime`` and ``zepp.serve`` import nothing of
``zepp.launch``, ``zepp.emulate`` or ``zepp.cli`` (lazy imports inside functions included), so a
normal run's ranks load no emulated-cluster code; ``zepp.serve`` uses ``zepp.runtime``, never the
simulator. The launchers name the module their ranks run; ``zepp.emulate`` wraps the ranks
(``worker_rank``, ``serve_rank``) instead of the ranks reaching for it. Read from the sources with
``ast``: no process is started."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "zepp"
FORBIDDEN = {"runtime": ("zepp.launch", "zepp.emulate", "zepp.cli"),
             "serve": ("zepp.launch", "zepp.emulate", "zepp.cli", "zepp.sim")}


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_executor_imports_no_launcher(package):
    files = sorted((SRC / package).glob("*.py"))
    assert files, f"no sources under {SRC / package}"
    bad = [f"{p.name}:{line} imports {mod}" for p in files for line, mod in _imports(p)
           if mod.startswith(FORBIDDEN[package])]
    assert not bad, bad


def test_string_module_names_point_at_modules_that_exist():
    """Rank entry points are named by strings (``python -m ...``): each one resolves to a file."""
    named = ["zepp.runtime.worker", "zepp.serve.rank", "zepp.emulate.worker_rank", "zepp.emulate.serve_rank",
             "zepp.emulate.call_rank", "zepp.emulate.a2a_jobs"]
    for mod in named:
        assert (SRC.parent / (mod.replace(".", "/") + ".py")).is_file(), mod
    texts = "".join(p.read_text() for p in SRC.rglob("*.py"))
    for old in ("zepp.emulate.rankrun", "zepp.emulate.rankmain", "zepp.emulate.jobs", "zepp.emulate.runner",
                "zepp.serve.blocks", "zepp.launch.generate"):
        assert old not in texts, f"{old} is still named somewhere in src/zepp"
