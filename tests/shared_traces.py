"""The one place the tests find the recorded traces: ``../shared/traces`` beside the repository
(``ZEPP_TRACES`` points elsewhere). Tests that need them take the ``traces_dir`` fixture
(``conftest.py``) or the ``needs_traces`` mark: without the folder they skip, saying where they looked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TRACES = Path(os.environ.get("ZEPP_TRACES") or Path(__file__).resolve().parents[2] / "shared" / "traces")
needs_traces = pytest.mark.skipif(not (TRACES / "k2" / "pool.txt").is_file(),
                                  reason=f"recorded traces not found at {TRACES} (set ZEPP_TRACES)")
