"""Option checks shared by the launchers (``zepp run``, ``zepp cluster``): each raises one
``ZeppInputError`` naming the option and the fix, before any work starts."""

from __future__ import annotations

import math
import os

from zepp.errors import ZeppInputError


def check_number(option: str, v, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                 integer: bool = False):
    """``v`` if it is a finite number (an integer with ``integer``) within ``[lo, hi]``
    (``(lo, hi]`` with ``lo_open``), else ``ZeppInputError`` naming ``option``."""
    good = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    good = good and (not integer or float(v).is_integer())
    if good and lo is not None:
        good = v > lo if lo_open else v >= lo
    if good and hi is not None:
        good = v <= hi
    if not good:
        rng = f"{'above' if lo_open else 'at least'} {_fmt(lo)}" if lo is not None else ""
        if hi is not None:
            rng += (" and " if rng else "") + f"at most {_fmt(hi)}"
        raise ZeppInputError(f"{option} must be {'an integer' if integer else 'a finite number'}"
                             f"{' ' + rng if rng else ''}, got {v!r}")
    return int(v) if integer else v


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check_output_path(path: str, option: str) -> str:
    """``path`` if a file can be written there (its folder exists and accepts it), checked by
    opening it without changing it (a new file is removed again)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ZeppInputError(f"{option} {path!r} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise ZeppInputError(f"{option} {path!r}: folder {folder!r} does not exist; create it first")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise ZeppInputError(f"{option} {path!r} cannot be written ({exc.strerror}); choose another path") from None
    if not existed:
        os.unlink(path)
    return path


def check_input_file(path: str, option: str) -> str:
    """``path`` if it is a regular, readable file (not a folder, pipe or device)."""
    if not os.path.exists(path):
        raise ZeppInputError(f"{option} {path!r} does not exist")
    if not os.path.isfile(path):
        raise ZeppInputError(f"{option} {path!r} is not a regular file (a folder, pipe or device); give a trace file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ZeppInputError(f"{option} {path!r} cannot be read ({exc.strerror})") from None
    return path
