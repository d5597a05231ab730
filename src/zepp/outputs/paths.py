"""Where an output may go: the checks of one output path, and that no output is an input of the
same run or another output of it (``zepp.outputs`` states the rules)."""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass

from zepp.errors import ZeppInputError

TMP_TAG = ".zepp-tmp-"  # in the names of temporary files: ``.STEM.zepp-tmp-PID-TOKEN.SUFFIX``


class OutputError(ZeppInputError):
    """An output that cannot be written where asked, or could not be written at the end (one line,
    exit code 2, like bad input: nothing was reported as written)."""


def folder_of(path) -> str:
    """The folder ``path``'s entry lies in, resolved as the kernel resolves it (a link before a
    ``..`` is followed first)."""
    return os.path.realpath(os.path.split(os.fspath(path))[0] or ".")


def entry_of(path) -> str:
    """The directory entry ``path`` names: its folder resolved (``..`` and links), its own name kept
    (a link at the path is the entry, not what it points to)."""
    return os.path.join(folder_of(path), os.path.basename(os.fspath(path)))


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def probe(folder: str, option: str, path: str) -> None:
    """Create and remove a file in ``folder``: the check that a new file can be written there."""
    name = os.path.join(folder, f".zepp-probe{TMP_TAG}{os.getpid()}")
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(name)
    except OSError as exc:
        raise OutputError(f"{option} {path!r} cannot be written ({exc.strerror}); choose another path") from None


def check_entry(path: str, option: str) -> None:
    """What is at ``path`` now, if anything, is a regular file this user may replace: not a
    symbolic link (writing through it would change the file it points to, a device or another
    file of the user; replacing it would silently undo a link the user made), not a named pipe,
    device or socket (opening one for writing may block or reach hardware)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{option} {path!r} cannot be written ({exc.strerror}); choose another path") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{option} {path!r} is a symbolic link (to {os.readlink(path)!r}); zepp neither writes "
                          f"through a link nor replaces it: give the path of the file itself, or remove the link")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{option} {path!r} is {kind_of(st.st_mode)}, not a regular file; give the path of a file")
    if not os.access(path, os.W_OK):
        raise OutputError(f"{option} {path!r} cannot be written (the file is read-only); choose another path or fix "
                          f"its permissions")


def check_output_file(path, option: str, suffixes: tuple[str, ...] | None = None) -> str:
    """``path`` if a file can be written there: not empty, not a folder, a suffix the writer supports
    (``suffixes``, without dots), its folder exists and accepts a new file, and what is there now
    (if anything) passes ``check_entry``. Nothing is written or opened at ``path``."""
    path = os.fspath(path)
    if not path.strip():
        raise OutputError(f"{option} is empty; give a file name")
    if os.path.isdir(path):
        raise OutputError(f"{option} {path!r} is a folder; give a file name")
    if suffixes is not None:
        suffix = os.path.splitext(path)[1].lstrip(".").lower()
        if suffix not in suffixes:
            raise OutputError(f"{option} {path!r}: suffix {('.' + suffix) if suffix else '(none)'!r} cannot be "
                              f"written; use one of {', '.join('.' + s for s in suffixes)}")
    folder = folder_of(path)
    if not os.path.isdir(folder):
        raise OutputError(f"{option} {path!r}: folder {folder!r} does not exist (or is not a folder); create it first")
    check_entry(path, option)
    probe(folder, option, path)
    return path


def check_output_folder(path, option: str, names: tuple[str, ...] = ()) -> str:
    """``path`` if it is a folder that accepts new files, or one that can be created (its parent
    folder exists and accepts it); nothing is created. What it holds under ``names`` (the
    writer's ``fnmatch`` patterns) passes ``check_entry``."""
    path = os.fspath(path)
    if not path.strip():
        raise OutputError(f"{option} is empty; give a folder")
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{option} {path!r} is a file; give a folder")
    if os.path.isdir(path):
        probe(os.path.realpath(path), option, path)
        for name in sorted(os.listdir(path)):
            if any(fnmatch.fnmatch(name, n) for n in names):
                check_entry(os.path.join(path, name), option)
        return path
    parent = folder_of(os.path.normpath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{option} {path!r}: cannot create it in {parent!r}; create that folder first")
    probe(parent, option, path)
    return path


@dataclass(frozen=True)
class Place:
    """A path a run reads or writes: ``option`` names it in messages; a ``folder`` holds the
    files whose paths inside it match ``names`` (``fnmatch`` patterns: ``*`` = everything); an
    output file's writer supports ``suffixes`` (without dots; ``None``: any)."""

    option: str
    path: str | None
    folder: bool = False
    names: tuple[str, ...] = ("*",)
    suffixes: tuple[str, ...] | None = None

    def spots(self) -> set[str]:
        """The paths that name it: the entry (folder resolved) and, through links, the target."""
        return {entry_of(self.path), os.path.realpath(self.path)}

    def identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def holds(self, other: "Place") -> bool:
        """Whether the file ``other`` lies in this folder under one of its names."""
        for spot in other.spots():
            for base in self.spots():
                rel = os.path.relpath(spot, base)
                if rel != "." and not rel.startswith("..") and any(fnmatch.fnmatch(rel, n) for n in self.names):
                    return True
        return False


def _clash(a: Place, b: Place) -> str | None:
    """How ``a`` and ``b`` collide, in words (``None``: they do not)."""
    same = bool(a.spots() & b.spots()) or (a.identity() is not None and a.identity() == b.identity())
    if same:
        return "the same folder as" if a.folder and b.folder else "the same path as"
    if a.folder and not b.folder and a.holds(b):
        return "the folder of"
    if b.folder and not a.folder and b.holds(a):
        return "a file in the folder of"
    return None


def check_distinct(outputs: list[Place], inputs: list[Place]) -> None:
    """No output is an input of the run or another output of it (module docstring)."""
    for i, out in enumerate(outputs):
        for other in outputs[i + 1:]:
            how = _clash(out, other)
            if how:
                raise OutputError(f"{out.option} {out.path!r} is {how} {other.option} {other.path!r}: one output "
                                  f"would overwrite the other; give each its own path")
        for inp in inputs:
            how = _clash(out, inp)
            if how:
                raise OutputError(f"{out.option} {out.path!r} is {how} {inp.option} {inp.path!r}, an input of this "
                                  f"run: writing it would destroy the input; give {out.option} another path")
