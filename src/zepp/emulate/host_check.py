"""Whether this machine can build an emulated cluster (``zepp.emulate.topology``): probed once.

Needs Linux, root, the ``ip``/``tc`` tools, network namespaces, veth pairs and the tbf qdisc;
added latency (``delay_ms > 0``) also needs ``sch_netem``, probed inside a namespace on use.
"""

from __future__ import annotations

import os
import sys

from zepp.emulate.iproute import sh, tool
from zepp.errors import EmulationError, EmulationUnavailable

_AVAILABLE: tuple[bool, str] | None = None


def availability() -> tuple[bool, str]:
    """``(ok, reason)``: can this process build an emulated cluster? Probed once and cached.

    Needs root, the ``ip``/``tc`` tools, network namespaces, veth pairs and the tbf qdisc.
    """
    global _AVAILABLE
    if _AVAILABLE is not None:
        return _AVAILABLE
    if not sys.platform.startswith("linux"):
        _AVAILABLE = (False, "the emulated cluster needs Linux network namespaces")
        return _AVAILABLE
    if os.geteuid() != 0:
        _AVAILABLE = (False, "the emulated cluster needs root (network namespaces, veth, tc); run as root")
        return _AVAILABLE
    try:
        ip, tc = tool("ip"), tool("tc")
    except EmulationUnavailable as exc:
        _AVAILABLE = (False, str(exc))
        return _AVAILABLE
    probe = f"zeppprobe{os.getpid()}"
    try:
        sh([ip, "netns", "add", probe])
    except (EmulationError, OSError) as exc:
        _AVAILABLE = (False, f"cannot create a network namespace here: {exc}")
        return _AVAILABLE
    try:
        sh([ip, "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
        sh([tc, "-n", probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "100mbit",
            "burst", "64kb", "latency", "50ms"])
        _AVAILABLE = (True, "")
    except (EmulationError, OSError) as exc:
        _AVAILABLE = (False, f"network namespaces work but veth or the tbf qdisc do not: {exc}")
    finally:
        sh([ip, "netns", "del", probe], check=False)
    return _AVAILABLE


def netem_available(ns: str) -> bool:
    """Whether the kernel has ``sch_netem`` (needed for ``delay_ms > 0``), probed inside ``ns``."""
    tc = tool("tc")
    ok = sh([tc, "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
    if ok.returncode == 0:
        sh([tc, "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return ok.returncode == 0
