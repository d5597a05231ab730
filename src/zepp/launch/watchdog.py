"""Cleans up after a launcher that died without cleaning up itself (``kill -9``, a crash).

A launcher (``zepp run``, ``zepp generate``, with or without ``--emulate``: anything that spawns
ranks through ``zepp.launch.processes``) starts this script once, as its own session, with a pipe
on its stdin::

    python -I -S .../zepp/launch/watchdog.py

and tells it, one JSON object per line, what it would have to clean up if it died now, and
what it has cleaned up itself since::

    {"op": "add", "kind": "proc", "key": "4242", "pid": 4242, "start": "123456"}
    {"op": "add", "kind": "dir", "key": "/tmp/zepp-run-x1y2"}
    {"op": "add", "kind": "netns", "key": "zepp-n0r0", "mark": "zepp-cluster prefix=zepp id=..."}
    {"op": "add", "kind": "file", "key": "/run/zepp/cluster-zepp.json"}
    {"op": "remove", "kind": "dir", "key": "/tmp/zepp-run-x1y2"}

When its stdin reaches end of file (the launcher is gone: every exit closes the pipe, also
``kill -9``), it ends what is still listed, in this order: rank processes (each is a session
leader: the whole process group gets SIGKILL, only if the pid still has the recorded start
time), network namespaces (only if the namespace still carries the recorded ownership mark:
its processes get SIGKILL, then it is deleted), files, folders. A launcher that cleaned up
after itself has nothing left listed, and the watchdog just exits.

Standard library only and no zepp imports, so it starts in a few milliseconds and cannot be
broken by the package it cleans up after; ``zepp.launch.processes`` imports ``proc_start`` from
here, so the two agree on what identifies a process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys


def proc_start(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks): tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _ip() -> str:
    return shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin") or "ip"


def _netns_mark(ip: str, ns: str) -> str | None:
    proc = subprocess.run([ip, "-n", ns, "-j", "link", "show", "lo"], capture_output=True, text=True, timeout=30)
    try:
        return json.loads(proc.stdout or "[]")[0].get("ifalias")
    except (ValueError, IndexError, AttributeError):
        return None


def _end_netns(ip: str, ns: str, mark: str) -> None:
    if _netns_mark(ip, ns) != mark:
        return  # gone already, or not the namespace we were told about
    pids = subprocess.run([ip, "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run([ip, "netns", "del", ns], capture_output=True, timeout=30)


def cleanup(items: dict) -> None:
    """End everything in ``items`` (``{(kind, key): record}``)."""
    for (kind, _), rec in list(items.items()):
        if kind == "proc" and proc_start(rec["pid"]) == rec.get("start"):
            try:
                os.killpg(rec["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    ip = None
    for (kind, key), rec in list(items.items()):
        if kind == "netns":
            ip = ip or _ip()
            try:
                _end_netns(ip, key, rec.get("mark"))
            except (OSError, subprocess.SubprocessError):
                pass
    for (kind, key), _ in list(items.items()):
        if kind == "file":
            try:
                os.unlink(key)
            except OSError:
                pass
    for (kind, key), _ in list(items.items()):
        if kind == "dir":
            shutil.rmtree(key, ignore_errors=True)


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    items: dict = {}
    for line in sys.stdin:
        try:
            msg = json.loads(line)
            key = (msg["kind"], msg["key"])
        except (ValueError, KeyError, TypeError):
            continue
        if msg.get("op") == "add":
            items[key] = msg
        elif msg.get("op") == "remove":
            items.pop(key, None)
    cleanup(items)
    return 0


if __name__ == "__main__":
    sys.exit(main())
