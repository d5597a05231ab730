"""Removing the emulated clusters of one run (``keep=False``) when the process ends.

A cluster that belongs to one run is removed when its context exits, at interpreter exit, on
SIGTERM (before the process dies of it, unless the process has its own handler, as ``zepp run``
has: then its ``with`` blocks remove it), and by the launcher's watchdog after ``kill -9``
(``zepp.launch.processes``). ``track`` registers a cluster that is up, ``untrack`` one that is down.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref

_LIVE_CLUSTERS: weakref.WeakSet = weakref.WeakSet()  # EmulatedCluster objects of this process that are up
_HANDLERS_INSTALLED = False


def track(cluster) -> None:
    """Remove ``cluster`` (``.down()``) at exit or on SIGTERM unless it went down before."""
    _install_handlers()
    _LIVE_CLUSTERS.add(cluster)


def untrack(cluster) -> None:
    _LIVE_CLUSTERS.discard(cluster)


def _teardown_all() -> None:
    for c in list(_LIVE_CLUSTERS):
        try:
            c.down()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM in a process that did not choose its own handler: remove this process's clusters,
    then die of the signal as it would have (a host such as pytest must not survive it by
    catching a SystemExit); its watchdog removes its temp folders. Launchers that want their
    ``finally`` blocks to run install ``zepp.launch.signals.launcher_signals`` instead."""
    _teardown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(_teardown_all)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)
    _HANDLERS_INSTALLED = True
