"""Opening input files safely: regular files only, readable, within a size and memory bound.

Every reader goes through :func:`input_file` (or :func:`open_regular`, which checks the file it
has opened, so a path swapped for a named pipe after the check cannot block it) before reading
a byte: a named pipe, a device, a folder, a missing or unreadable file is one clear
:class:`~zepp.errors.ZeppInputError` naming the path (never a hang, never a traceback).
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from zepp.errors import ZeppInputError

__all__ = ["input_file", "open_regular", "read_bytes", "available_memory", "check_fits", "describe_keys"]


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check_mode(p: Path, mode: int, what: str, expect: str) -> None:
    if stat.S_ISDIR(mode):
        raise ZeppInputError(f"{p}: is a directory, expected a {what} ({expect})")
    if not stat.S_ISREG(mode):
        raise ZeppInputError(f"{p}: is {_kind(mode)}, not a regular file; save the data to a file first")


def input_file(path, what: str = "trace file", expect: str = ".txt, .npz or .pt") -> Path:
    """``path`` as a :class:`Path` after checking it is an existing, readable regular file."""
    p = Path(path)
    try:
        st = p.stat()  # follows symlinks: a link to a regular file is fine
    except FileNotFoundError:
        raise ZeppInputError(f"{what} {str(p)!r} does not exist; check the path") from None
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied while looking it up; check the folder's permissions") from None
    except (OSError, ValueError) as exc:
        raise ZeppInputError(f"{p}: cannot look it up ({getattr(exc, 'strerror', None) or type(exc).__name__})") \
            from None
    _check_mode(p, st.st_mode, what, expect)
    if not os.access(p, os.R_OK):
        raise ZeppInputError(f"{p}: permission denied (the file is not readable by this user); fix its permissions")
    return p


def open_regular(path, what: str = "file", expect: str = "a regular file", max_bytes: int | None = None):
    """``path`` opened for binary reading once the opened file is known to be a regular file of at
    most ``max_bytes`` (opened without blocking, so a named pipe is refused, not waited on)."""
    p = input_file(path, what, expect)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied; fix the file's permissions") from None
    except OSError as exc:
        raise ZeppInputError(f"{p}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    try:
        st = os.fstat(fd)
        _check_mode(p, st.st_mode, what, expect)
        if max_bytes is not None and st.st_size > max_bytes:
            raise ZeppInputError(f"{p}: {st.st_size:,} bytes, more than a {what} may hold ({max_bytes:,}, "
                                 f"README 'Reading limits'); check that this is the right file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(p, what: str = "file", max_bytes: int | None = None, expect: str = "a regular file") -> bytes:
    """The whole file (a regular file of at most ``max_bytes``; ``what`` / ``expect`` name it in
    messages, ``open_regular``); OS errors become one clear line."""
    try:
        with open_regular(p, what, expect, max_bytes) as f:
            return f.read()
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied; fix the file's permissions") from None
    except OSError as exc:
        raise ZeppInputError(f"{p}: cannot read it ({exc.strerror or type(exc).__name__})") from None


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable``), or ``None`` if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(p: Path, size: int, factor: float, max_bytes: int | None) -> None:
    """Refuse a file whose reading needs more than ``max_bytes`` (or the available memory):
    ``factor * size`` bytes is the reader's peak."""
    need = int(factor * size)
    limit = max_bytes if max_bytes is not None else available_memory()
    if limit is not None and need > limit:
        src = "the limit given (max_bytes)" if max_bytes is not None else "the memory available now"
        raise ZeppInputError(
            f"{p}: {size / 2**20:.0f} MiB; reading it needs about {need / 2**20:.0f} MiB, more than {src} "
            f"({limit / 2**20:.0f} MiB); split the file or keep fewer rows (for example `head -n N`)"
        )


def describe_keys(obj) -> str:
    """The keys of a dict for a message, whatever their types (mixed key types cannot be sorted)."""
    if not isinstance(obj, dict):
        return type(obj).__name__
    keys = [repr(k)[:40] for k in obj]
    return "[" + ", ".join(sorted(keys)[:12]) + (", ..." if len(keys) > 12 else "") + "]"
