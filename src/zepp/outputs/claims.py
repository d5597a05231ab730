"""Who may write an output: one run at a time. ``claim_outputs`` is the last check of a command
(every output path checked, none an input or another output, each locked, a killed run's
temporary files removed); the claims end with the command (``release_claims``)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import os

from zepp.outputs.paths import (TMP_TAG, OutputError, Place, check_distinct, check_output_file, check_output_folder,
                                entry_of)

LOCK_SUFFIX = ".zepp-lock"
_HELD: dict[str, int] = {}  # lock file -> its open descriptor (holding the flock)
_CLOSERS: set[int] = set()  # click contexts that release the claims when they close


def lock_path(place: Place) -> str:
    """``.NAME.zepp-lock`` beside the output (a folder's lock lies beside the folder, not in it)."""
    entry = entry_of(os.path.normpath(place.path))
    return os.path.join(os.path.dirname(entry), f".{os.path.basename(entry)}{LOCK_SUFFIX}")


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f"pid {int(os.pread(fd, 32, 0).split()[0])}"
    return "another process"


def _lock(place: Place) -> None:
    """Hold the lock of ``place`` until :func:`release_claims`; refused while another run holds it."""
    lp = lock_path(place)
    if lp in _HELD:
        return
    while True:
        fd = os.open(lp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fd)
            os.close(fd)
            raise OutputError(f"{place.option} {place.path!r} is being written by another zepp run ({who}); wait "
                              f"for it to end or choose another path") from None
        try:  # a run that just released it removed the file: lock the one at the path now
            same = os.stat(lp).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    with contextlib.suppress(OSError):  # the pid only helps the message of a second run (a full disk: none)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[lp] = fd


def _sweep(place: Place) -> None:
    """Remove the temporary files of ``place`` that a killed run left (their pid has ended)."""
    entry = entry_of(os.path.normpath(place.path))
    stem, suffix = os.path.splitext(os.path.basename(entry))
    pattern = (os.path.join(entry, f".*{TMP_TAG}*") if place.folder
               else os.path.join(os.path.dirname(entry), f".{glob.escape(stem)}{TMP_TAG}*{glob.escape(suffix)}"))
    for tmp in glob.glob(pattern):
        pid = os.path.basename(tmp).split(TMP_TAG, 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _release_on_exit() -> None:
    """Release the claims when the current click command ends (else when the process ends)."""
    try:
        import click

        ctx = click.get_current_context(silent=True)
    except ImportError:
        ctx = None
    if ctx is None:
        atexit.register(release_claims)
    elif id(ctx) not in _CLOSERS:
        _CLOSERS.add(id(ctx))
        ctx.call_on_close(lambda: (_CLOSERS.discard(id(ctx)), release_claims()))


def claim_outputs(outputs: list[Place], inputs: list[Place] = (), lock: bool = True) -> None:
    """Check every output (``check_output_file`` / ``check_output_folder``), that none is an input
    or another output (``paths.check_distinct``), then lock each (``lock``: false where another
    process of the run writes, e.g. ranks other than 0 under torchrun) and remove what a killed
    run left. ``None`` paths are skipped. The last check of a command: nothing runs between it and
    the work."""
    outputs = [o for o in outputs if o.path is not None]
    inputs = [i for i in inputs if i.path is not None]
    for o in outputs:
        if o.folder:
            check_output_folder(o.path, o.option, o.names)
        else:
            check_output_file(o.path, o.option, o.suffixes)
    check_distinct(outputs, list(inputs))
    if not lock:
        return
    _release_on_exit()
    try:
        for o in outputs:
            _lock(o)
    except OutputError:
        release_claims()
        raise
    for o in outputs:
        _sweep(o)


def release_claims() -> None:
    """End every claim of this process: each lock file removed, then its lock dropped."""
    while _HELD:
        lp, fd = _HELD.popitem()
        with contextlib.suppress(OSError):
            os.unlink(lp)
        os.close(fd)
