"""Process checks shared by the tests that start ranks or launchers (imported as ``procs``)."""

from __future__ import annotations

import signal
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


def default_sigint() -> None:
    """In a child before exec: SIGINT back to its default. A shell starts background jobs with
    SIGINT ignored, children inherit that, and Python then installs no KeyboardInterrupt
    handler: a test that sends SIGINT must not depend on how the suite was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
