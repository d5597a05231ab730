"""Where the benchmark scripts find things: the repository, the results folder, the data files
the package ships, and the recorded traces.

The traces are found the way the tests find them (``tests/shared_traces.py``): a script's
``--traces DIR`` where given, else ``$ZEPP_TRACES``, else ``../shared/traces`` beside the
repository. Every script lives one folder down (``benchmarks/<kind>/X.py``) and puts
``benchmarks/`` on the path itself before importing this module, so it runs from any folder.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT / "src" / "zepp" / "data"  # the measured and fitted files the package ships
TRACES_ENV = "ZEPP_TRACES"
BESIDE_REPO = ROOT.parent / "shared" / "traces"


def add_traces_option(parser: argparse.ArgumentParser) -> None:
    """The ``--traces DIR`` option every script that reads recorded traces takes."""
    parser.add_argument("--traces", default=None,
                        help=f"recorded traces folder (default: ${TRACES_ENV}, else ../shared/traces beside "
                             "the repository)")


def find_traces(override: str | os.PathLike | None = None, required: bool = True) -> Path | None:
    """The recorded traces folder: ``override`` (a script's ``--traces``), else ``$ZEPP_TRACES``,
    else ``../shared/traces`` beside the repository.

    An ``override`` that is not a folder always ends the script with one line saying so. Otherwise,
    where the folder is absent, ``required=False`` returns ``None`` (the script falls back to the
    built-in synthetic traces and records that it did) and ``required=True`` ends the script.
    """
    if override is not None:
        path = Path(override)
        if not path.is_dir():
            raise SystemExit(f"--traces {override}: no such folder (it should hold k2/ and qwen3/ with "
                             "pool.txt and eval.txt)")
        return path
    path = Path(os.environ.get(TRACES_ENV) or BESIDE_REPO)
    if path.is_dir():
        return path
    if required:
        raise SystemExit(f"recorded traces not found at {path}: pass --traces DIR or set {TRACES_ENV}")
    return None
