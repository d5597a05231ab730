"""How an output is written: to a temporary file in the same folder, flushed to disk, then renamed
over the path (``zepp.outputs`` states the guarantees)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat

from zepp.outputs.paths import TMP_TAG, OutputError, check_entry, entry_of, folder_of


def temp_path(path) -> str:
    """A fresh temporary name beside ``path``'s entry, with its suffix (writers that choose the
    format by suffix, ``savefig`` or ``np.savez``, see the right one): ``.STEM.zepp-tmp-PID-TOKEN.SUFFIX``."""
    stem, suffix = os.path.splitext(os.path.basename(os.fspath(path)))
    return os.path.join(folder_of(path), f".{stem}{TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _keep_mode(tmp: str, entry: str) -> None:
    """The new file gets the permission bits of the regular file it replaces."""
    try:
        st = os.lstat(entry)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        os.chmod(tmp, stat.S_IMODE(st.st_mode))


@contextlib.contextmanager
def replacing(path, what: str = "output"):
    """Yield a temporary path beside ``path``; when the block ends normally, the file written there
    is flushed to disk and renamed over ``path`` (refused if what is there is not a regular file,
    ``paths.check_entry``).
    When it raises (``KeyboardInterrupt`` and ``SystemExit`` too) the temporary file is removed
    and ``path`` is left as it was. An ``OSError`` (a full disk, a folder gone) becomes one
    :class:`OutputError` naming ``what`` (the option)."""
    entry = entry_of(path)
    tmp = temp_path(path)
    existed = os.path.lexists(entry)
    try:
        yield tmp
        _fsync(tmp)
        check_entry(entry, what)  # what is there now (a link, a device made since the checks) is never replaced
        _keep_mode(tmp, entry)
        os.replace(tmp, entry)
        _fsync(os.path.dirname(entry))  # the rename itself reaches the disk
    except OSError as exc:
        left = "the previous file is left as it was" if existed else "nothing was written"
        raise OutputError(f"{what} {os.fspath(path)!r} could not be written ({exc.strerror or exc}); {left}; free "
                          f"space or choose another path") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes(path, data: bytes, what: str = "output") -> None:
    """``data`` as the whole content of ``path``, through :func:`replacing`."""
    with replacing(path, what) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:  # (replacing flushes it to disk before the rename)
            os.close(fd)


def write_text(path, text: str, what: str = "output") -> None:
    write_bytes(path, text.encode(), what)


def write_json(path, obj, what: str = "output", indent: int | None = 1) -> None:
    """``obj`` as JSON (a trailing newline); serialised in full before the file is touched."""
    write_text(path, json.dumps(obj, indent=indent) + "\n", what)
