"""Process checks shared by the tests that start ranks or launchers (imported as ``procs``)."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie or dead process does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_until(cond, poll_s: float = 0.05) -> None:
    """Poll ``cond`` until true (the test's pytest timeout bounds it: no wall-clock limit here)."""
    while not cond():
        time.sleep(poll_s)
