"""The ``ip`` and ``tc`` commands (iproute2), run as subprocesses with clear errors."""

from __future__ import annotations

import shutil
import subprocess
from typing import Sequence

from zepp.errors import EmulationError, EmulationUnavailable


def tool(name: str) -> str:
    """Path of ``ip`` or ``tc``; ``EmulationUnavailable`` when iproute2 is missing."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise EmulationUnavailable(f"the emulated cluster needs the `{name}` command (iproute2), which is not installed")
    return path


def sh(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run ``argv``; with ``check`` a non-zero exit raises ``EmulationError`` with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise EmulationError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc
