"""The rows of the simulated benchmark table: one per configuration, Zepp's speedup over the
fastest other system, the model's error on the paper's measured cell, and the Markdown table
of PAPER.md section 4. The lower bound of a configuration is the smallest physical floor of any
system.
"""

from __future__ import annotations

import math

import numpy as np

from zepp import registry

ROW_KEYS = ("cluster", "nodes", "gpus_per_node", "model", "budget_mb", "latency_ms", "lower_bound_ms",
            "measured_ms", "variant")
# what must match for a resumed run to reuse a stored configuration
RUN_KEYS = ("systems", "iters", "warmup", "seed", "traces")


def assemble_row(job: dict, results: dict, schedule: dict | None = None) -> dict:
    """One configuration's JSON row from its systems' results (``schedule``: a drift schedule's
    report, its timed batches' topic mix, stored as ``topic_mix`` beside the schedule's name;
    the default schedule's rows hold neither)."""
    from zepp.sim.measured import measured_ms

    lat = {s: r["median_ms"] for s, r in results.items()}
    floor = {s: r["floor_ms"] for s, r in results.items()}
    variant = {s: r["variant"] for s, r in results.items() if r.get("variant")}
    extra = {} if schedule is None else dict(schedule=job["schedule"], topic_mix=schedule)
    return dict(**extra, cluster=job["cluster"], nodes=job["nodes"], gpus_per_node=job.get("gpus_per_node", 4),
                model=job["model"], budget_mb=job["budget_mb"], latency_ms=lat,
                lower_bound_ms=min(floor.values()) if floor else None,
                measured_ms=measured_ms(job["cluster"], job["nodes"], job["model"], job["budget_mb"]),
                variant=variant, run={k: job.get(k) for k in RUN_KEYS}, detail=results)


def is_zepp(name: str) -> bool:
    """Zepp or one of its variants (a registry row marked ``ours``)."""
    s = registry.SYSTEMS.get(name)
    return s is not None and s.ours


def _baselines(row: dict, paper: bool = False) -> dict[str, float]:
    """The row's other systems than Zepp's (``paper``: only the paper's seven baselines)."""
    return {s: v for s, v in row["latency_ms"].items()
            if (s in registry.PAPER_BASELINES if paper else not is_zepp(s))}


def zepp_best(row: dict) -> str | None:
    """The fastest ``zepp*`` system of the row (``zepp`` when only it and its variants ran)."""
    z = {s: v for s, v in row["latency_ms"].items() if is_zepp(s)}
    return min(z, key=z.get) if z else None


def best_baseline(row: dict, paper: bool = False) -> str | None:
    """The fastest system of the row that is not Zepp's (``paper``: of the paper's seven)."""
    base = _baselines(row, paper)
    return min(base, key=base.get) if base else None


def speedup(row: dict, paper: bool = False) -> float | None:
    """Zepp's fastest system over the fastest other system of the row; ``paper``: ``zepp`` over
    the fastest of the paper's seven baselines (PAPER.md section 4's figure)."""
    best = best_baseline(row, paper)
    z = "zepp" if paper else zepp_best(row)
    if best is None or z not in row["latency_ms"]:
        return None
    return row["latency_ms"][best] / row["latency_ms"][z]


def model_error(row: dict) -> tuple[str | None, float | None]:
    """The fastest simulated baseline (``best_baseline``) and the model's error on its measured
    cell (simulated / measured - 1), where the paper measured it."""
    best = best_baseline(row)
    if best is None:
        return None, None
    m = (row.get("measured_ms") or {}).get(best)
    return best, (row["latency_ms"][best] / m - 1 if m else None)


def zepp_error(row: dict) -> tuple[str | None, float | None]:
    """Zepp's system of the row that has a measured figure (its fastest ``zepp*`` system, else
    ``zepp``) and the model's error on it (simulated / measured - 1); ``(None, None)`` without one
    (``zepp bench --measured``: the paper publishes no Zepp figure)."""
    m = row.get("measured_ms") or {}
    for z in (zepp_best(row), "zepp"):
        if z is not None and m.get(z) and z in row["latency_ms"]:
            return z, row["latency_ms"][z] / m[z] - 1
    return None, None


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return float(math.exp(np.mean(np.log(xs)))) if xs else None


def format_table(rows: list[dict], systems: list[str]) -> str:
    """Markdown table like PAPER.md section 4: ms per layer per system, the fastest system that is
    not Zepp's (any system of the run), Zepp's speedup over it (its fastest ``zepp*`` system,
    named when it is not ``zepp``), the model's error on that baseline's measured cell (how far
    to trust the row), and the lower bound."""
    shown = [s for s in systems if s in registry.PAPER_BASELINES] + [s for s in systems
                                                                    if s not in registry.PAPER_BASELINES]
    with_zepp = any(zepp_error(r)[0] for r in rows)
    head = ["cluster", "nodes", "model", "MB"] + [f"{s} ms" for s in shown] + [
        "best baseline", "speedup", "model err on best"] + (["model err on Zepp"] if with_zepp else []) + ["LB ms"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        best, err = model_error(r)
        sp = speedup(r)
        cells = [r["cluster"], f"{r['nodes']}x{r.get('gpus_per_node', 4)}", r["model"], f"{r['budget_mb']:g}"]
        cells += [f"{r['latency_ms'][s]:.2f}" if s in r["latency_ms"] else "-" for s in shown]
        z = zepp_best(r)
        sp_text = (f"{sp:.2f}x" + ("" if z == "zepp" else f" ({z})")) if sp else "-"
        cells += [best or "-", sp_text, f"{err:+.0%}" if err is not None else "not measured"]
        if with_zepp:
            zname, zerr = zepp_error(r)
            cells.append(f"{zerr:+.0%} ({zname})" if zname else "not measured")
        cells.append(f"{r['lower_bound_ms']:.2f}" if r["lower_bound_ms"] else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

