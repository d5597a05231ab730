"""What the readers' fuzzing tests share (``tests/files/test_files_fuzz.py``): mutations of
valid files and the contract every reader keeps on them.

A mutation changes a valid file as a careless or hostile user would: a value replaced by one of
another type (huge or negative numbers, NaN, strings, lists, nested mappings), a value nested a
few thousand levels deep, a key deleted, an unknown key added, a key given twice, bytes cut off
(truncation), bytes flipped or inserted, the text re-encoded (UTF-16, Latin-1). The contract
(:func:`holds_contract`): the reader returns, or raises ``ZeppInputError`` whose message is one
line naming the file (or its folder); never another exception, never more than ``SECONDS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from zepp.errors import ZeppInputError

SECONDS = 10  # the contract's bound on any refusal

# few examples by default (the suite stays fast); ZEPP_FUZZ_EXAMPLES=N explores N random ones
EXAMPLES = int(os.environ.get("ZEPP_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="ZEPP_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

# values a field may be given instead of its own
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, 1e308, -1e-300, 0.5]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["\x1b[31m", "\u202e", "010", "1:30", "", "NaN"]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


class Slow(Exception):
    """A reader ran past ``SECONDS``."""


@contextlib.contextmanager
def within(seconds: float = SECONDS):
    def ring(signum, frame):
        raise Slow(f"still reading after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def holds_contract(read, *names: str):
    """``read()``'s value, or ``None`` after a refusal that keeps the contract (module docstring):
    one line that names one of ``names`` (a path, a folder)."""
    with within():
        try:
            return read()
        except ZeppInputError as exc:
            msg = str(exc)
            assert "\n" not in msg.strip(), msg
            assert any(str(n) in msg for n in names), (names, msg)
            return None


def _paths(obj, at=()):
    """Every path (tuple of keys and indices) to a value of a JSON-like ``obj``."""
    yield at
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, at + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            yield from _paths(v, at + (i,))


def _replace(obj, at, new):
    if not at:
        return new
    head, rest = at[0], at[1:]
    if isinstance(obj, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in obj.items()}
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(obj)]


@st.composite
def mutated_value(draw, obj):
    """``(text, how)``: ``obj`` changed by one structural mutation and written as JSON text."""
    paths = list(_paths(obj))
    at = draw(st.sampled_from(paths))
    how = draw(st.sampled_from(["replace", "deep", "delete", "unknown", "duplicate"]))
    if how == "replace":
        return json.dumps(_replace(obj, at, draw(HOSTILE))), how
    if how == "deep":
        n = draw(st.sampled_from([40, 3000]))
        marker = "\x00DEEP\x00"
        return json.dumps(_replace(obj, at, marker)).replace(json.dumps(marker), "[" * n + "1" + "]" * n), how
    parent = at[:-1] if at and isinstance(at[-1], str) else ()
    target = obj
    for k in parent:
        target = target[k]
    if not isinstance(target, dict) or not target:
        return json.dumps(obj), how
    if how == "delete":
        key = draw(st.sampled_from(sorted(target)))
        return json.dumps(_replace(obj, parent, {k: v for k, v in target.items() if k != key})), how
    if how == "unknown":
        return json.dumps(_replace(obj, parent, {**target, draw(st.text(min_size=1, max_size=8)): draw(HOSTILE)})), how
    key = draw(st.sampled_from(sorted(target)))
    text = json.dumps(_replace(obj, parent, {**target, "\x00DUP\x00": 0}))
    return text.replace(json.dumps("\x00DUP\x00") + ": 0", json.dumps(key) + ": " + json.dumps(draw(HOSTILE))), how


@st.composite
def mutated_bytes(draw, raw: bytes):
    """``raw`` truncated, with bytes flipped or inserted, or re-encoded."""
    how = draw(st.sampled_from(["truncate", "flip", "insert", "utf16", "latin1"]))
    if not raw:
        return raw
    i = draw(st.integers(0, len(raw) - 1))
    if how == "truncate":
        return raw[:i]
    if how == "flip":
        return raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1:]
    if how == "insert":
        return raw[:i] + draw(st.binary(min_size=1, max_size=16)) + raw[i:]
    text = raw.decode("utf-8", "replace")
    return text.encode("utf-16") if how == "utf16" else (text[:i] + "\u00e9\u00ff" + text[i:]).encode("latin-1", "replace")
