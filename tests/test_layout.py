"""The package layout is the pipeline: who may import whom, how big a unit may grow, what
stays at the top. Read from the source with ``ast`` (imports inside functions included), so a
lazy import cannot hide a dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "zepp"

# Which zepp packages (or top-level modules) each may import. Anything else is a layering
# violation. ``cli`` may import anything and nothing may import ``cli``.
ALLOWED = {
    "errors": set(),
    "compat": set(),
    "model": {"errors"},
    "files": {"errors"},
    "cluster": {"errors", "files"},
    "traces": {"errors", "model", "files"},
    "planner": {"errors", "model", "cluster"},
    "registry": {"errors", "planner"},
    "sim": {"errors", "model", "cluster", "registry", "planner", "traces", "files"},
    "runtime": {"errors", "model", "cluster", "registry", "planner", "traces"},
    "serve": {"errors", "model", "cluster", "registry", "planner", "traces", "runtime"},
    "interop": {"errors", "model", "cluster", "registry", "planner", "traces", "sim", "files"},
    "launch": {"errors"},
    # the emulated cluster runs both executors' ranks (``zepp run`` and ``zepp generate --emulate``)
    "emulate": {"errors", "model", "cluster", "registry", "planner", "traces", "runtime", "serve", "sim", "launch"},
}
TOP_MODULES_MAX = 6
FUNCTION_LINES_MAX = 80


def _unit(path: Path) -> str:
    """The package (or top-level module) a source file belongs to: ``planner``, ``errors``, ..."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported_units(tree: ast.AST) -> set[str]:
    """Every zepp package / top-level module a module imports, at any depth (lazy imports too)."""
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names] if node.module == "zepp" \
                else [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "zepp" and len(parts) > 1:
                out.add(parts[1])
    return out


def _sources():
    return sorted(p for p in SRC.rglob("*.py"))


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _sources():
        unit = _unit(path)
        if unit == "__init__":
            continue
        deps = _imported_units(ast.parse(path.read_text(), filename=str(path))) - {unit}
        graph.setdefault(unit, set()).update(deps)
    return graph


def test_every_import_follows_the_pipeline():
    bad = []
    for unit, deps in sorted(_graph().items()):
        if unit == "cli":
            continue
        allowed = ALLOWED.get(unit)
        assert allowed is not None, f"src/zepp/{unit}: a new package or top-level module; give it a place in ALLOWED"
        bad += [f"{unit} -> {d}" for d in sorted(deps - allowed)]
    assert not bad, "imports against the layering: " + ", ".join(bad)


def test_nothing_imports_cli_and_no_cycles():
    graph = _graph()
    assert not [u for u, deps in graph.items() if "cli" in deps and u != "cli"], "only cli may import cli"
    # depth-first search for a cycle between packages
    state: dict[str, int] = {}

    def visit(u, stack):
        state[u] = 1
        for d in sorted(graph.get(u, ())):
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack + [u, d]))
            if d not in state:
                visit(d, stack + [u])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [])


def test_the_rule_itself_catches_a_lazy_import():
    tree = ast.parse("def f():\n    from zepp.emulate.counters import read_own_counters\n")
    assert _imported_units(tree) == {"emulate"}
    tree = ast.parse("from zepp import registry\nimport zepp.sim.run as r\n")
    assert _imported_units(tree) == {"registry", "sim"}


def test_at_most_six_top_level_modules():
    top = sorted(p.stem for p in SRC.glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_MODULES_MAX, f"top-level modules: {top}"


def test_no_function_over_80_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES_MAX:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 80 lines: " + "; ".join(long)


@pytest.mark.parametrize("module", ["zepp.runtime", "zepp.serve", "zepp.runtime.worker", "zepp.runtime.moe",
                                    "zepp.serve.rank", "zepp.serve.engine"])
def test_executors_load_nothing_of_emulate(module):
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('zepp.emulate', 'zepp.cli')))\n"
            "print(' '.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import {module} loads {out.stdout.strip()}"


def test_old_readme_import_paths_resolve_to_the_new_modules():
    import zepp.flows
    import zepp.placement
    import zepp.planner
    import zepp.routing
    import zepp.torchplan
    import zepp.trace
    from zepp.trace import node_demand, read_trace, sample_batches

    assert zepp.placement.make_placement is zepp.planner.make_placement
    assert zepp.routing.route is zepp.planner.route
    assert zepp.flows.build_flows is zepp.planner.build_flows
    assert zepp.torchplan.__name__ == "zepp.planner.torch"
    assert read_trace is zepp.trace.read_trace and callable(node_demand) and callable(sample_batches)


def test_the_readme_planner_snippet_runs(tmp_path, monkeypatch):
    """The README's "planner as a library" code, as written, on small trace files of its names."""
    import re

    import numpy as np

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## The planner as a library\n\n```python\n(.*?)```", text, re.S).group(1)
    rng = np.random.default_rng(0)
    for name in ("pool.txt", "eval.txt"):  # K2-shaped rows: 8 distinct ids of 384
        rows = np.argsort(rng.random((2000, 384)), axis=1)[:, :8]
        (tmp_path / name).write_text("\n".join(" ".join(map(str, r)) for r in rows) + "\n")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    scope["plan"].validate()
    assert scope["plan"].transport == "zepp/reduce"


def test_the_package_and_its_planner_load_no_torch():
    """``import zepp`` (every launcher and ``zepp plan``) does not pay for torch; the numpy planner needs none."""
    code = "import sys, zepp, zepp.planner, zepp.traces, zepp.cli\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_every_results_file_is_named_in_the_benchmarks_index():
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    index = (root / "README.md").read_text()
    missing = sorted(p.name for p in (root / "results").iterdir() if p.is_file() and f"`{p.name}`" not in index)
    assert not missing, f"benchmarks/README.md does not name {missing}"
