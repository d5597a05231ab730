"""A launcher's signals: SIGTERM as ``Terminated`` in the main thread, so every ``finally`` and
``with`` block runs (stdlib only: ``zepp.cli.main`` installs it for every command)."""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread (exit code 143) so that ``finally`` and ``with`` blocks
    run; ``zepp.cli.main`` reports it as one line."""


@contextlib.contextmanager
def launcher_signals():
    """While inside: SIGTERM raises ``Terminated(143)`` in the main thread, so ``finally`` and
    ``with`` blocks (which end ranks, workers, clusters, temp folders and temporary files) run.
    No-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001
        raise Terminated(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
