"""The engines' own code, for the tests that hold zepp against it (tests/engines).

The pinned wheels (``PINS``) are fetched from PyPI with ``pip download --no-deps`` into a cache
folder outside the repository (``$ZEPP_ENGINE_CACHE``, default ``~/.cache/zepp/engines``): each
download goes to a temporary folder inside the cache and is renamed into place, so two test
runs may fetch at once. Only the modules the tests need are extracted (``MODULES``), into a
folder of their own that is also renamed into place. A module is loaded by path under its own
dotted name with the smallest stubs for what it imports (``loaded``), and the engine's names are
taken out of ``sys.modules`` again afterwards. A failed download fails the test with one line.
Nothing of the engines is committed or vendored.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import pytest

# name: (version, the platform tag pip downloads for; the sources are the same on any platform)
PINS = {"sglang": ("0.5.23", "manylinux_2_34_x86_64"), "vllm": ("0.33.0", "manylinux_2_28_x86_64")}
MODULES = {
    "sglang": ("sglang/srt/eplb/expert_location.py", "sglang/srt/eplb/expert_location_dispatch.py",
               "sglang/srt/model_executor/hook_manager.py"),
    "vllm": ("vllm/distributed/eplb/eplb_state.py", "vllm/distributed/eplb/policy/__init__.py",
             "vllm/distributed/eplb/policy/abstract.py", "vllm/distributed/eplb/policy/default.py",
             "vllm/model_executor/layers/fused_moe/router/base_router.py", "vllm/plugins/__init__.py"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("ZEPP_ENGINE_CACHE") or Path.home() / ".cache" / "zepp" / "engines")


def wheel(name: str) -> Path:
    """The pinned wheel of ``name`` in the cache, downloaded first if it is not there."""
    version, platform = PINS[name]
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{name}-{version}-*.whl"))
    if found:
        return found[0]
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=folder)
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
               "--platform", platform, "--disable-pip-version-check", "-q", "-d", tmp, f"{name}=={version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            why = ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]
        except (OSError, subprocess.TimeoutExpired) as exc:
            proc, why = None, str(exc)
        got = list(Path(tmp).glob("*.whl"))
        if proc is None or proc.returncode or len(got) != 1:
            pytest.fail(f"could not download {name}=={version} from PyPI into {folder} ({why})", pytrace=False)
        target = folder / got[0].name
        os.replace(got[0], target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sources(name: str) -> Path:
    """The folder holding ``MODULES[name]`` extracted from the pinned wheel."""
    version, _ = PINS[name]
    target = cache_dir() / "src" / f"{name}-{version}"
    if (target / ".complete").exists():
        return target
    whl = wheel(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        with zipfile.ZipFile(whl) as z:
            for member in MODULES[name]:
                z.extract(member, tmp)
        (tmp / ".complete").write_text(f"{whl.name}\n")
        tmp.chmod(0o755)  # mkdtemp's folder is the owner's only; the cache may be shared
        try:
            os.rename(tmp, target)
        except OSError:  # another run put it there first
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class Stub(types.ModuleType):
    """A module that stands in for one the engine imports: the attributes set on it, and a
    do-nothing class for any other name (a base class, a decorator, a logger factory)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: self})
        setattr(self, name, value)
        return value


def stub(name: str, **attrs) -> Stub:
    mod = Stub(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


@contextlib.contextmanager
def loaded(engine: str, stubs: dict[str, types.ModuleType]):
    """Inside: ``load(dotted)`` loads an extracted module of ``engine`` by path under its own name
    (packages on the way are empty stubs unless ``stubs`` names them). On exit every module of
    the engine's namespace leaves ``sys.modules`` again."""
    root = sources(engine)
    saved = {k: v for k, v in sys.modules.items() if k == engine or k.startswith(engine + ".")}
    for k in saved:
        del sys.modules[k]

    def attach(dotted: str, mod) -> None:
        """``mod`` in ``sys.modules`` and as an attribute of its parent package (made if missing)."""
        sys.modules[dotted] = mod
        parent, _, child = dotted.rpartition(".")
        if parent:
            if parent not in sys.modules:
                attach(parent, stub(parent, __path__=[str(root.joinpath(*parent.split(".")))]))
            setattr(sys.modules[parent], child, mod)

    for name, mod in stubs.items():
        attach(name, mod)

    def load(dotted: str):
        if dotted in sys.modules and not isinstance(sys.modules[dotted], Stub):
            return sys.modules[dotted]
        parts = dotted.split(".")
        if len(parts) > 1 and ".".join(parts[:-1]) not in sys.modules:
            attach(".".join(parts[:-1]), stub(".".join(parts[:-1]), __path__=[str(root.joinpath(*parts[:-1]))]))
        path = root.joinpath(*parts).with_suffix(".py")
        if not path.exists():
            path = root.joinpath(*parts, "__init__.py")
        spec = importlib.util.spec_from_file_location(dotted, path,
                                                      submodule_search_locations=[str(path.parent)]
                                                      if path.name == "__init__.py" else None)
        mod = importlib.util.module_from_spec(spec)
        attach(dotted, mod)
        spec.loader.exec_module(mod)
        return mod

    try:
        yield load
    finally:
        for k in [k for k in sys.modules if k == engine or k.startswith(engine + ".")]:
            del sys.modules[k]
        sys.modules.update(saved)
