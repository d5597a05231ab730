"""Child processes that die with the process that started them, whatever kills it.

``dies_with_parent()`` is a ``preexec_fn`` for ``subprocess.Popen``: between fork and exec the
child asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``, kept across exec),
then checks that the parent is still the one that forked it (a parent killed before the request
would otherwise be missed). Used for rank processes (``zepp.launch.processes``) and for the
worker processes of ``zepp bench`` (``zepp.sim.bench_pool``): a parent killed with SIGKILL (by
the kernel when out of memory, by ``kill -9``) leaves no child holding the caller's pipes.

The parent-death signal is tied to the *thread* that started the child: start children from a
thread that lives as long as they do (the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable

_PR_SET_PDEATHSIG = 1


def dies_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child die (SIGKILL) with this process; the C library is
    loaded here, before the fork, so the child only makes system calls."""
    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()

    def setup() -> None:  # runs in the child between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(137)
    return setup
