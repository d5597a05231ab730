"""Opening input files safely: regular files only, readable, within memory.

Every reader (traces, engine histories and placement files, cluster files) goes through
:func:`input_file` before touching a byte, so a named pipe, a device, a folder, a missing or
unreadable file is one clear :class:`~zepp.errors.ZeppInputError` naming the path (never a
hang, never a traceback).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from zepp.errors import ZeppInputError

__all__ = ["input_file", "read_bytes", "read_json", "available_memory", "check_fits", "describe_keys"]


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


def input_file(path, what: str = "trace file", expect: str = ".txt, .npz or .pt") -> Path:
    """``path`` as a :class:`Path` after checking it is an existing, readable regular file."""
    p = Path(path)
    try:
        st = p.stat()  # follows symlinks: a link to a regular file is fine
    except FileNotFoundError:
        raise ZeppInputError(f"{what} {str(p)!r} does not exist; check the path") from None
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied while looking it up; check the folder's permissions") from None
    except OSError as exc:
        raise ZeppInputError(f"{p}: cannot look it up ({exc.strerror or type(exc).__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ZeppInputError(f"{p}: is a directory, expected a {what} ({expect})")
    if not stat.S_ISREG(st.st_mode):
        raise ZeppInputError(f"{p}: is {_kind(st.st_mode)}, not a regular file; save the data to a file first")
    if not os.access(p, os.R_OK):
        raise ZeppInputError(f"{p}: permission denied (the file is not readable by this user); fix its permissions")
    return p


def read_bytes(p: Path) -> bytes:
    """The whole file; OS errors become one clear line."""
    try:
        with open(p, "rb") as f:
            return f.read()
    except PermissionError:
        raise ZeppInputError(f"{p}: permission denied; fix the file's permissions") from None
    except OSError as exc:
        raise ZeppInputError(f"{p}: cannot read it ({exc.strerror or type(exc).__name__})") from None


class DuplicateKey(ValueError):
    """A mapping in a JSON or YAML text names one key twice (``args[0]``: the key)."""


def _unique_pairs(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def json_unique(raw: bytes | str):
    """``json.loads`` that raises :class:`DuplicateKey` where a mapping names a key twice (JSON
    and YAML parsers otherwise keep the last value without a word)."""
    return json.loads(raw, object_pairs_hook=_unique_pairs)


def yaml_unique(raw: bytes | str):
    """``yaml.safe_load`` that raises :class:`DuplicateKey` where a mapping names a key twice."""
    import yaml

    nodes = [yaml.compose(raw, Loader=yaml.SafeLoader)]
    while nodes:
        node = nodes.pop()
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            if len(set(keys)) != len(keys):
                raise DuplicateKey(next(k for i, k in enumerate(keys) if k in keys[:i]))
            nodes.extend(v for _, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            nodes.extend(node.value)
    return yaml.safe_load(raw)


def read_json(path, what: str, expect: str = ".json"):
    """The parsed content of a JSON file, opened through :func:`input_file` (``what``, ``expect``
    name it in messages); a file that cannot be read or parsed is one line ``PATH: not valid JSON (...)``."""
    try:
        return json.loads(read_bytes(input_file(path, what, expect)))
    except (ValueError, UnicodeDecodeError) as exc:  # ZeppInputError is a ValueError too
        raise ZeppInputError(f"{path}: not valid JSON ({exc})") from None


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
    keys = [repr(k) for k in obj]
    return "[" + ", ".join(sorted(keys)[:12]) + (", ..." if len(keys) > 12 else "") + "]"
