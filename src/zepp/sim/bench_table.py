"""The simulated MoE-layer benchmark table of PAPER.md section 4 (``zepp bench``; ``zepp timeline``
draws one of its configurations): its run, and its JSON file.

The table's parts: the configurations (``zepp.sim.bench_jobs``), the units of work
(``zepp.sim.bench_units``) and the worker processes (``zepp.sim.bench_pool``), the rows, speedups
and the Markdown table (``zepp.sim.bench_rows``). Every finished configuration is written to the
JSON file at once, replaced whole (``zepp.outputs``: valid JSON after each, whenever the run is
killed), and a resumed run skips the configurations that file already holds with the same run
settings (``RUN_KEYS``; each stored row checked by ``zepp.sim.resume_rows``).
"""

from __future__ import annotations

from pathlib import Path

from zepp.errors import ZeppInputError
from zepp.files import read_json
from zepp.sim.bench_jobs import config_key
from zepp.sim.bench_rows import ROW_KEYS, RUN_KEYS, best_baseline, geomean, speedup, zepp_best
from zepp.sim.bench_units import run_bench


def detail_path(path: Path) -> Path:
    """``FILE.detail.json`` beside ``FILE.json``: every row with its per-iteration figures."""
    return path.with_name(path.stem + ".detail.json")


def write_json(path: Path, rows: list[dict]) -> None:
    """Rows so far as ``{"rows", "geomean_speedup"}`` (+ ``detail_path`` with per-iteration
    figures), each file replaced whole (``zepp.outputs.write_json``), so both are valid JSON after
    every configuration, whenever the run is killed. The detail file goes first: a run killed
    between the two leaves it one row ahead, and ``--resume`` (which reads it) loses nothing."""
    from zepp.outputs import write_json as replace_json

    gm = geomean(speedup(r) for r in rows)
    payload = dict(rows=[dict({k: r[k] for k in ROW_KEYS + ("run", "schedule", "topic_mix") if k in r},
                              best_baseline=best_baseline(r), zepp_best=zepp_best(r)) for r in rows],
                   geomean_speedup=gm, geomean_speedup_paper=geomean(speedup(r, paper=True) for r in rows))
    replace_json(detail_path(path), rows, "--json (its .detail.json)")
    replace_json(path, payload, "--json")


def load_resume(path: Path) -> list[dict]:
    """The configurations a previous run stored in ``path`` (its detail file when present); every
    row of both files checked first (``zepp.sim.resume_rows``)."""
    detail = detail_path(path)
    rows = _read_rows(path)
    return _read_rows(detail) if detail.is_file() else rows


def _read_rows(src: Path) -> list[dict]:
    from zepp.sim.resume_rows import check_rows

    try:
        data = read_json(src, "zepp bench --json file", allow_nan=True)  # NaN rows are refused by check_rows
    except ZeppInputError as exc:
        raise ZeppInputError(f"--resume: cannot read {src} ({str(exc)[:300]}); remove it or drop --resume") from None
    rows = data if isinstance(data, list) else data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ZeppInputError(f"--resume: {src} is not a zepp bench --json file (no list of rows); remove it or "
                             f"drop --resume")
    return check_rows(rows, src, ROW_KEYS, RUN_KEYS)


def stored_rows(jobs: list[dict], path: Path) -> list[dict]:
    """The rows ``path`` already holds for ``jobs`` with the same run settings (``RUN_KEYS``)."""
    old = {config_key(r): r for r in load_resume(path)}
    stored = []
    for j in jobs:
        r = old.get(config_key(j))
        if r is not None and r.get("run") == {k: j.get(k) for k in RUN_KEYS}:
            stored.append(r)
    return stored


def run_table(jobs: list[dict], stored: list[dict], workers: int, json_file: Path | None,
              progress: bool = True) -> list[dict]:
    """The rows of ``jobs`` in their order: ``stored`` ones as they are, the others simulated
    (``run_bench``); with ``json_file``, every row written as it completes and all at the end."""
    skip = {config_key(r) for r in stored}
    jobs_left = [j for j in jobs if config_key(j) not in skip]
    done = list(stored)

    def on_row(row):
        done.append(row)
        if json_file is not None:
            write_json(json_file, done)

    new_rows = run_bench(jobs_left, workers, progress, on_row=on_row) if jobs_left else []
    by_key = {config_key(r): r for r in stored + new_rows}
    rows = [by_key[config_key(j)] for j in jobs]
    if json_file is not None:
        write_json(json_file, rows)
    return rows

