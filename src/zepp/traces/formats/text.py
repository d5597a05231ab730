"""The text trace format: one token per line, its ``k`` expert ids, whitespace-separated.

This is the format of ``../shared/traces``. Blank lines are skipped; line numbers in messages
count them. The reader streams the file in chunks of whole lines (``CHUNK_BYTES``) and parses
each chunk with vectorised numpy over its bytes (no Python loop per line or token), so its
memory is the ids it returns (4 bytes per id, about 0.9x the file size for 3-digit ids, written
into one buffer that is shrunk in place at the end) plus about 15x one chunk, and a 200 MB file reads in seconds
(``benchmarks/results/place_trace_reader.md``).

Strict values: every token must be an integer of at most 10 digits with an optional sign;
ids are checked against ``[0, num_experts)`` (or, without ``num_experts``, against the
int32 range and ``MAX_INFERRED_EXPERTS``) chunk by chunk, before the next chunk is read; a
token's top-k holding one id twice is refused unless ``allow_duplicates``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import check_fits, open_regular
from zepp.traces.trace import MAX_INFERRED_EXPERTS, check_id_range, check_no_repeats

__all__ = ["read_text_ids", "CHUNK_BYTES", "MAX_INFERRED_EXPERTS", "PEAK_FACTOR"]

CHUNK_BYTES = 4 << 20
PEAK_FACTOR = 2.2  # peak memory / file size, worst case (1-digit ids), for the limit check
_MAX_DIGITS = 10

_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[48:58] = True


def _token_bounds(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, ends, odd)`` of the bytes ``buf``: offsets where each whitespace-separated token
    starts and ends (exclusive), and the offsets of the bytes inside tokens that are no digit."""
    inside = ~_WS[buf]
    edge = np.diff(inside.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edge == 1)
    ends = np.flatnonzero(edge == -1)
    del edge
    return starts, ends, np.flatnonzero(inside & ~_DIGIT[buf])


def _line_at(newlines: np.ndarray, line_base: int, pos: int) -> int:
    """File line (from 1) of byte ``pos`` of a chunk whose first line is ``line_base + 1``."""
    return line_base + int(np.searchsorted(newlines, pos)) + 1


class _Reader:
    """Parses a text trace chunk by chunk, keeping what the chunks must agree on (``k``, the
    first row's line, the largest id seen)."""

    def __init__(self, source: str, top_k: int | None, num_experts: int | None, allow_duplicates: bool):
        self.source = source
        self.k = top_k
        self.top_k = top_k
        self.num_experts = num_experts
        self.allow_duplicates = allow_duplicates
        self.first_row_line: int | None = None
        self.max_id = -1

    def _token(self, raw: bytes, s: int, e: int) -> str:
        return raw[s:e].decode("utf-8", errors="replace")

    def chunk(self, raw: bytes, line_base: int) -> np.ndarray:
        """Parse whole lines ``raw`` (first line is file line ``line_base + 1``) -> ``[n, k]`` int32."""
        buf = np.frombuffer(raw, dtype=np.uint8)
        starts, ends, odd = _token_bounds(buf)
        if starts.size == 0:
            return np.empty((0, self.k or 0), dtype=np.int32)
        newlines = np.flatnonzero(buf == 10)
        sign = self._signs(raw, buf, starts, ends, odd, newlines, line_base)
        val = self._values(raw, buf, starts, ends, sign, newlines, line_base)
        ids, lines = self._rows(val, starts, newlines, line_base)
        self._check_values(ids, lines)
        return ids.astype(np.int32)

    def _signs(self, raw: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, odd: np.ndarray,
               newlines: np.ndarray, line_base: int) -> np.ndarray:
        """``[tokens]`` bool: the token starts with a sign. A sign is the only byte besides digits a
        token may hold, and only as its first byte of several."""
        sign = np.zeros(starts.size, dtype=bool)
        if odd.size:
            t = np.searchsorted(starts, odd, side="right") - 1
            ok = (odd == starts[t]) & ((buf[odd] == 45) | (buf[odd] == 43)) & (ends[t] - starts[t] > 1)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                tt = int(t[i])
                raise ZeppInputError(
                    f"{self.source}: line {_line_at(newlines, line_base, starts[tt])}: "
                    f"{self._token(raw, starts[tt], ends[tt])!r} is not an "
                    f"integer expert id; each line must hold k whitespace-separated integers"
                )
            sign[t] = True
        return sign

    def _values(self, raw: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, sign: np.ndarray,
                newlines: np.ndarray, line_base: int) -> np.ndarray:
        """``[tokens]`` int64 value of each token (at most ``_MAX_DIGITS`` digits)."""
        dstart = starts + sign
        ndig = ends - dstart
        long = np.flatnonzero(ndig > _MAX_DIGITS)
        if long.size:
            t = int(long[0])
            raise ZeppInputError(
                f"{self.source}: line {_line_at(newlines, line_base, starts[t])}: expert id "
                f"{self._token(raw, starts[t], ends[t])} is out of "
                f"range (more than {_MAX_DIGITS} digits); expert ids are small integers, check the file"
            )
        # Horner's rule over digit positions, vectorised over tokens.
        val = np.zeros(starts.size, dtype=np.int64)
        for j in range(int(ndig.max())):
            m = ndig > j
            if m.all():
                val = val * 10 + (buf[dstart + j].astype(np.int64) - 48)
            else:
                idx = np.flatnonzero(m)
                val[idx] = val[idx] * 10 + (buf[dstart[idx] + j].astype(np.int64) - 48)
        neg = sign & (buf[starts] == 45)
        val[neg] = -val[neg]
        return val

    def _rows(self, val: np.ndarray, starts: np.ndarray, newlines: np.ndarray,
              line_base: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids [rows, k], file line of each row)``: ``k`` ids on every non-blank line."""
        src = self.source
        token_line = np.searchsorted(newlines, starts)
        per_line = np.bincount(token_line)
        rows = np.flatnonzero(per_line)
        counts = per_line[rows]
        if self.k is None:
            self.k = int(counts[0])
        if self.first_row_line is None:
            self.first_row_line = line_base + int(rows[0]) + 1
        off = np.flatnonzero(counts != self.k)
        if off.size:
            i = int(off[0])
            if self.top_k is not None and np.all(counts == counts[0]) and line_base == 0:
                raise ZeppInputError(
                    f"{src}: rows have {counts[0]} expert ids but the model is top-{self.top_k}; "
                    f"pass --topk {counts[0]} or use the trace recorded for this model"
                )
            like = f" as on line {self.first_row_line}" if self.top_k is None else f" (top-{self.k})"
            raise ZeppInputError(
                f"{src}: line {line_base + rows[i] + 1} has {counts[i]} expert ids, expected {self.k}{like}; "
                f"every line must hold exactly k ids (ragged row)"
            )
        return val.reshape(-1, self.k), line_base + rows + 1

    def _check_values(self, ids: np.ndarray, lines: np.ndarray) -> None:
        def where(r: int) -> str:
            return f"line {lines[r]}"

        check_id_range(ids, self.num_experts, self.source, where)
        if self.num_experts is None and ids.size:
            top = int(ids.max())
            if top >= MAX_INFERRED_EXPERTS:
                r, c = np.argwhere(ids == top)[0]
                raise ZeppInputError(
                    f"{self.source}: line {lines[r]}: expert id {top} would mean {top + 1} experts; no model has "
                    f"that many: pass the model's expert count (num_experts / --model) or check the file"
                )
            self.max_id = max(self.max_id, top)
        if not self.allow_duplicates:
            check_no_repeats(ids, self.source, where)


def read_text_ids(p: Path, top_k: int | None, num_experts: int | None, allow_duplicates: bool = False,
                  max_bytes: int | None = None, chunk_bytes: int = CHUNK_BYTES) -> tuple[np.ndarray, int]:
    """``(ids [N, k] int32, num_experts)`` from a text trace (``num_experts`` inferred as
    ``max id + 1`` when not given). ``max_bytes``: refuse files whose reading would need more
    (default: the memory available now)."""
    source = str(p)
    size = p.stat().st_size
    if size == 0:
        raise ZeppInputError(f"{source}: the file is empty; give one token per line, k expert ids each")
    check_fits(p, size, PEAK_FACTOR, max_bytes)
    rd = _Reader(source, top_k, num_experts, allow_duplicates)
    # One flat buffer of the largest possible id count (an id takes at least one digit and one
    # separator): pages never written are never resident, and the buffer is shrunk in place at
    # the end, so the ids are not copied again.
    flat = np.empty((size + 1) // 2, dtype=np.int32)
    n = 0
    line_base = 0
    carry = b""
    try:
        with open_regular(p, "trace file", ".txt") as f:  # a path swapped for a pipe is refused, not waited on
            while True:
                data = f.read(chunk_bytes)
                at_end = not data
                block = carry + data
                if at_end:
                    cut = len(block)
                else:
                    cut = block.rfind(b"\n") + 1
                    if cut == 0:  # a line longer than one chunk: keep reading
                        carry = block
                        continue
                piece, carry = block[:cut], block[cut:]
                if piece:
                    out = rd.chunk(piece, line_base)
                    flat[n:n + out.size] = out.ravel()
                    n += out.size
                    line_base += piece.count(b"\n")
                if at_end:
                    break
    except PermissionError:
        raise ZeppInputError(f"{source}: permission denied; fix the file's permissions") from None
    except OSError as exc:
        raise ZeppInputError(f"{source}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if n == 0:
        raise ZeppInputError(f"{source}: the file has no expert ids (only blank lines)")
    flat.resize(n, refcheck=False)  # shrinks in place (realloc), no copy of the ids
    return flat.reshape(-1, rd.k), int(num_experts) if num_experts is not None else rd.max_id + 1
