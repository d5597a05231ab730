"""The package layout is the pipeline: who may import whom, how big a unit may grow, what
stays at the top. Read from the source with ``ast`` (imports inside functions included), so a
lazy import cannot hide a dependency. The executors sit below the launchers: ``zepp.runtime``
and ``zepp.serve`` import nothing of ``zepp.launch``, ``zepp.emulate`` or ``zepp.cli`` (``ALLOWED``),
so a normal run's ranks load no emulated-cluster code; the launchers name the module their ranks
run, and ``zepp.emulate`` wraps the ranks instead of the ranks reaching for it."""

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
    "model": {"errors"},
    "files": {"errors"},
    "outputs": {"errors"},  # every file written for the user: checked, replaced whole, one run at a time
    "cluster": {"errors", "files"},
    "traces": {"errors", "model", "files"},
    "planner": {"errors", "model", "cluster"},
    "registry": {"errors", "planner"},
    # (launch: the bench's worker processes die with it, as ranks do with their launcher)
    "sim": {"errors", "model", "cluster", "registry", "planner", "traces", "files", "outputs", "launch"},
    # the executors: no launcher, no emulated cluster; serving never the simulator
    "runtime": {"errors", "model", "cluster", "registry", "planner", "traces"},
    "serve": {"errors", "model", "cluster", "registry", "planner", "traces", "runtime", "files", "outputs"},
    "interop": {"errors", "model", "cluster", "registry", "planner", "traces", "sim", "files"},
    "launch": {"errors", "outputs"},
    # the emulated cluster runs both executors' ranks (``zepp run`` and ``zepp generate --emulate``)
    "emulate": {"errors", "model", "cluster", "registry", "planner", "traces", "runtime", "serve", "sim", "launch"},
    # the engines' plug-ins read zepp's files and plan the engines' tables; nothing imports them but cli
    "engines": {"errors", "planner", "interop"},
}
TOP_MODULES_MAX = 6
FUNCTION_LINES_MAX = 50  # docstring included
FILE_LINES_MAX = 400


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


def test_no_function_over_50_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES_MAX:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {FUNCTION_LINES_MAX} lines: " + "; ".join(long)


def test_no_source_file_over_400_lines():
    """One concept per file: a module that grows past the bar holds more than one."""
    big = [f"{p.relative_to(SRC)} ({n} lines)" for p in _sources()
           if (n := len(p.read_text().splitlines())) > FILE_LINES_MAX]
    assert not big, f"files over {FILE_LINES_MAX} lines: " + "; ".join(big)


# The executors sit below the launchers: ``zepp.runtime`` and ``zepp.serve`` import nothing of
# ``zepp.launch``, ``zepp.emulate`` or ``zepp.cli`` (lazy imports included), so a normal run's ranks
# load no emulated-cluster code; ``zepp.serve`` uses ``zepp.runtime``, never the simulator. The
# launchers name the module their ranks run; ``zepp.emulate`` wraps the ranks (``worker_rank``,
# ``serve_rank``) instead of the ranks reaching for it.
EXECUTOR_FORBIDDEN = {"runtime": {"launch", "emulate", "cli"}, "serve": {"launch", "emulate", "cli", "sim"}}
# the rank entry points (``python -m ...``), and module names that are gone
RANK_ENTRY_POINTS = ("zepp.runtime.worker", "zepp.serve.rank", "zepp.emulate.worker_rank", "zepp.emulate.serve_rank",
                     "zepp.emulate.call_rank", "zepp.emulate.a2a_jobs")
GONE_MODULE_NAMES = ("zepp.emulate.rankrun", "zepp.emulate.rankmain", "zepp.emulate.jobs", "zepp.emulate.runner",
                     "zepp.serve.blocks", "zepp.launch.generate")


@pytest.mark.parametrize("package", sorted(EXECUTOR_FORBIDDEN))
def test_executors_import_no_launcher(package):
    files = sorted((SRC / package).rglob("*.py"))
    assert files, f"no sources under {SRC / package}"
    bad = [f"{p.relative_to(SRC)} imports zepp.{unit}" for p in files
           for unit in sorted(_imported_units(ast.parse(p.read_text())) & EXECUTOR_FORBIDDEN[package])]
    assert not bad, bad


def _named_modules() -> dict[str, str]:
    """Every string constant of ``src/zepp`` that names a zepp module (``zepp.a.b``) or a function
    in one (``zepp.a.b:f``, as ``EmulatedCluster.call`` takes), with the file that names it."""
    import re

    named = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"zepp(\.\w+)+(:\w+)?", node.value):
                named[node.value] = str(path.relative_to(SRC))
    return named


def test_string_module_names_point_at_modules_that_exist():
    """Rank entry points and ``module:function`` targets are named by strings: each resolves to a
    file (a package's ``__init__`` or a module) and, with ``:function``, to a function defined there."""
    named = _named_modules()
    missing = set(RANK_ENTRY_POINTS) - {n.partition(":")[0] for n in named}
    assert not missing, f"rank entry points no launcher names: {sorted(missing)}"
    bad = []
    for name, where in sorted(named.items()):
        mod, _, func = name.partition(":")
        base = SRC.parent / mod.replace(".", "/")
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not path.is_file():
            bad.append(f"{where}: {name} (no module)")
        elif func and func not in {n.name for n in ast.walk(ast.parse(path.read_text()))
                                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}:
            bad.append(f"{where}: {name} (no function {func})")
    assert not bad, bad
    texts = "".join(p.read_text() for p in _sources())
    for old in GONE_MODULE_NAMES:
        assert old not in texts, f"{old} is still named somewhere in src/zepp"


@pytest.mark.parametrize("module", ["zepp.runtime", "zepp.serve", "zepp.runtime.worker", "zepp.runtime.moe",
                                    "zepp.serve.rank", "zepp.serve.engine"])
def test_executors_load_nothing_of_emulate(module):
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('zepp.emulate', 'zepp.cli')))\n"
            "print(' '.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import {module} loads {out.stdout.strip()}"


@pytest.mark.parametrize("old", ["zepp.trace", "zepp.placement", "zepp.routing", "zepp.flows", "zepp.plan",
                                 "zepp.granularity", "zepp.torchplan", "zepp.compat", "zepp.planner.grouping",
                                 "zepp.planner.swaps", "zepp.planner.stage_groups", "zepp.planner.torch.costs"])
def test_old_import_paths_fail_with_pythons_own_error(old):
    """No alias hook: a path that moved is gone, and importing it is Python's ImportError."""
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def _all_module_names() -> list[str]:
    """Every module of ``src/zepp`` by its dotted name (packages and rank entry points included)."""
    names = []
    for path in _sources():
        parts = ("zepp",) + path.relative_to(SRC).with_suffix("").parts
        if parts[-1] != "__main__":  # runs the command line when imported
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def test_no_module_is_loaded_twice_under_two_names():
    """Import every module of the package in one process: no source file may back two entries of
    ``sys.modules`` (an alias that re-executes a module makes two copies of its classes)."""
    code = ("import importlib, sys, collections\n"
            f"for name in {_all_module_names()!r}:\n"
            "    importlib.import_module(name)\n"
            "files = collections.defaultdict(list)\n"
            "for name, mod in list(sys.modules.items()):\n"
            "    f = getattr(mod, '__file__', None)\n"
            "    if name.startswith('zepp') and f:\n"
            "        files[f].append(name)\n"
            "print([v for v in files.values() if len(v) > 1])\n"
            "print(len(files))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    twice, loaded = out.stdout.split("\n")[:2]
    assert twice == "[]", f"modules loaded under two names: {twice}"
    assert int(loaded) >= len(_all_module_names()) - 1


# an import hook that makes ``torch`` missing, as in an environment where it is not installed
NO_TORCH = ("import sys, importlib.abc\n"
            "class _NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
            "sys.meta_path.insert(0, _NoTorch())\n")


def test_the_simulator_runs_a_bench_row_without_torch(tmp_path):
    """``import zepp.sim`` and a whole simulated ``zepp bench`` row (the paper's baselines and
    Zepp) need numpy only: torch is refused by an import hook, and the row still runs."""
    out_json = tmp_path / "row.json"
    code = NO_TORCH + (
        "import zepp.sim, zepp.sim.run, zepp.sim.bench_table\n"
        "from zepp.cli import main\n"
        f"main(['bench', '--nodes', '4', '--models', 'qwen', '--budgets', '1', '--iters', '1', '--warmup', '0',"
        f" '--jobs', '1', '--json', {str(out_json)!r}])\n"
        "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
    import json

    row = json.loads(out_json.read_text())["rows"][0]
    assert set(row["latency_ms"]) >= {"a2av", "comet", "eplb", "zepp"}
    assert all(v > 0 for v in row["latency_ms"].values())


def test_the_hook_itself_makes_torch_missing():
    """The control of the test above: under the hook, ``import torch`` fails."""
    out = subprocess.run([sys.executable, "-c", NO_TORCH + "import torch\n"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "No module named 'torch'" in out.stderr


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


def test_the_package_loads_no_engine_plug_in_and_the_plug_ins_no_engine():
    """``import zepp`` (and its commands) imports neither ``zepp.engines`` nor an engine; the plug-ins
    themselves import an engine only inside the functions the engine calls."""
    code = ("import sys, zepp, zepp.cli, zepp.interop, zepp.planner, zepp.registry\n"
            "print(sorted(m for m in sys.modules if m.startswith(('zepp.engines', 'vllm', 'sglang'))))\n"
            "import zepp.engines.vllm_plugin, zepp.engines.vllm_policy, zepp.engines.sglang_hook\n"
            "print(sorted(m for m in sys.modules if m.startswith(('vllm', 'sglang'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout
    graph = _graph()
    assert not [u for u, deps in graph.items() if "engines" in deps and u != "cli"], "only cli may import engines"


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
