"""The rows of a ``zepp bench --json`` file, checked before ``--resume`` reuses any of them.

A stored row is reused as it is (its latencies go into the table, the geomean and the file
written back), so every row is checked first: its keys, their types, latencies finite and
non-negative, and run settings of the right form. A bad row is one ``ZeppInputError`` naming
the file and the row's index.
"""

from __future__ import annotations

import math

from zepp.errors import ZeppInputError


def _number(v, positive: bool = False) -> bool:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return ok and (not positive or v > 0)


def _count(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _ms_map(v, allow_none: bool) -> bool:
    """A ``{system: ms}`` mapping of finite non-negative numbers (``None`` values when allowed)."""
    return isinstance(v, dict) and all(isinstance(k, str) and (_number(x) or (allow_none and x is None))
                                       for k, x in v.items())


def _run_problem(run, run_keys: tuple[str, ...]) -> str | None:
    if not isinstance(run, dict) or any(k not in run for k in run_keys):
        return f"'run' must be a mapping with {', '.join(run_keys)}"
    if not (isinstance(run["systems"], list) and run["systems"] and all(isinstance(s, str) for s in run["systems"])):
        return "'run.systems' must be a non-empty list of system names"
    for k, lo in (("iters", 1), ("warmup", 0), ("seed", 0)):
        if not _count(run[k], lo):
            return f"'run.{k}' must be an integer >= {lo}, got {run[k]!r}"
    if run["traces"] is not None and not isinstance(run["traces"], str):
        return f"'run.traces' must be a folder name or null, got {run['traces']!r}"
    return None


def row_problem(r, row_keys: tuple[str, ...], run_keys: tuple[str, ...]) -> str | None:
    """What is wrong with stored row ``r`` (``None``: nothing)."""
    if not isinstance(r, dict):
        return f"is a {type(r).__name__}, not a mapping"
    missing = [k for k in (*row_keys, "run") if k not in r]
    if missing:
        return f"lacks {', '.join(missing)}"
    for k in ("cluster", "model"):
        if not isinstance(r[k], str) or not r[k]:
            return f"{k!r} must be a name, got {r[k]!r}"
    for k in ("nodes", "gpus_per_node"):
        if not _count(r[k], 1):
            return f"{k!r} must be a positive integer, got {r[k]!r}"
    if not _number(r["budget_mb"], positive=True):
        return f"'budget_mb' must be a positive finite number, got {r['budget_mb']!r}"
    if not (_ms_map(r["latency_ms"], allow_none=False) and r["latency_ms"]):
        bad = next(((k, x) for k, x in r["latency_ms"].items() if not _number(x)), None) \
            if isinstance(r["latency_ms"], dict) else None
        return (f"latency of {bad[0]!r} is {bad[1]!r}, not a finite number >= 0 (ms)" if bad
                else "'latency_ms' must be a non-empty mapping {system: ms}")
    if r["lower_bound_ms"] is not None and not _number(r["lower_bound_ms"]):
        return f"'lower_bound_ms' must be a finite number >= 0 or null, got {r['lower_bound_ms']!r}"
    if r["measured_ms"] is not None and not _ms_map(r["measured_ms"], allow_none=True):
        return "'measured_ms' must be null or a mapping {system: ms} of finite numbers >= 0"
    if r["variant"] is not None and not (isinstance(r["variant"], dict) and
                                         all(isinstance(v, str) for v in r["variant"].values())):
        return "'variant' must be null or a mapping {system: variant name}"
    problem = _run_problem(r["run"], run_keys)
    if problem:
        return problem
    lacking = [s for s in r["run"]["systems"] if s not in r["latency_ms"]]
    if lacking:
        return f"'latency_ms' lacks {', '.join(lacking)}, which its 'run.systems' lists"
    return None


def check_rows(rows: list, src, row_keys: tuple[str, ...], run_keys: tuple[str, ...]) -> list[dict]:
    """``rows`` if every one is a well-formed stored row; else one error naming the first bad row."""
    for i, r in enumerate(rows):
        problem = row_problem(r, row_keys, run_keys)
        if problem:
            raise ZeppInputError(f"--resume: {src}, row {i}: {problem}; remove that row (or the file), or drop "
                                 f"--resume")
    return rows
