"""Session-wide check: the suite leaves the temp folder (``/tmp``) as it found it; shared fixtures
(``traces_dir``, ``netns_prefix``).

Every temp folder zepp makes goes through ``tempfile`` (``$TMPDIR``), also in the rank and
launcher processes the tests start (they inherit the environment). The session points
``TMPDIR`` at a folder of its own, so other users of ``/tmp`` on the same machine cannot make
the check fail or pass by chance; at the end every ``zepp-*`` entry left in it fails the
session, and the folder itself is removed. pytest's own ``tmp_path`` folders stay where pytest
keeps them (``PYTEST_DEBUG_TEMPROOT``, the original temp folder).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
import time

import pytest

from zepp.launch.processes import WATCHDOG

_ORIGINAL_TMP = tempfile.gettempdir()
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", _ORIGINAL_TMP)
SESSION_TMP = tempfile.mkdtemp(prefix="zepp-tests-", dir=_ORIGINAL_TMP)
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = None  # re-read TMPDIR
# also when no test runs (collection error, nothing selected): the folder goes with the process,
# and with the watchdog if the session is killed (SIGTERM, kill -9)
atexit.register(shutil.rmtree, SESSION_TMP, ignore_errors=True)
WATCHDOG.add("dir", SESSION_TMP)


def zepp_leftovers(folder: str = SESSION_TMP) -> list[str]:
    """``zepp-*`` entries in ``folder`` (temp folders of launchers, ranks, clusters)."""
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith("zepp-"))
    except FileNotFoundError:
        return []


@pytest.fixture(scope="session", autouse=True)
def suite_leaves_tmp_as_it_found_it():
    yield
    left = zepp_leftovers()
    deadline = time.monotonic() + 120
    while left and time.monotonic() < deadline:  # a killed launcher's watchdog may still be finishing
        time.sleep(0.2)
        left = zepp_leftovers()
    shutil.rmtree(SESSION_TMP, ignore_errors=True)
    assert not left, f"the test suite left temp folders behind: {left}"


@pytest.fixture(scope="session")
def traces_dir():
    """``../shared/traces`` (see ``shared_traces.py``); skips the test where it is absent."""
    from shared_traces import TRACES

    if not (TRACES / "k2" / "pool.txt").is_file():
        pytest.skip(f"recorded traces not found at {TRACES} (set ZEPP_TRACES)")
    return TRACES


_PREFIXES: set[str] = set()
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def netns_prefix():
    """``make(tag) -> prefix``: a namespace prefix for an emulated cluster (``tag``: 2 letters, then
    4 base-36 digits from this process's id) that no other test of this session has used and that
    no cluster on this machine uses now, so two runs of the suite side by side never share one."""
    from zepp.emulate import inventory
    from zepp.emulate.ownership import record_path

    def make(tag: str) -> str:
        assert len(tag) == 2 and tag.isalpha() and tag.islower(), tag
        for n in itertools.count(os.getpid() * 101):
            digits = "".join(_DIGITS[(n // 36**i) % 36] for i in range(4))
            prefix = tag + digits
            if prefix in _PREFIXES or os.path.exists(record_path(prefix)) or inventory.list_namespaces(prefix):
                continue
            _PREFIXES.add(prefix)
            return prefix
        raise AssertionError("unreachable")

    return make
