"""The paper's measured baseline latencies (PAPER.md section 4), read from
``zepp/data/paper_measured.json``: the A100 table of Fig. 9 and the weak-scaling ``a2av``
column of Fig. 10. Data only; the fitting that uses it is ``zepp.sim.calibrate``."""

from __future__ import annotations

import functools
import json
from importlib import resources


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads((resources.files("zepp") / "data" / "paper_measured.json").read_text())


def system_columns() -> tuple[str, ...]:
    """The baselines the paper measured, in its column order."""
    return tuple(_data()["fig9"]["columns"])


@functools.lru_cache(maxsize=1)
def fig9() -> dict[tuple[str, int, str, float], dict[str, float]]:
    """``(cluster, nodes, model, MB) -> {system: ms}`` of Fig. 9."""
    return {(r["cluster"], int(r["nodes"]), r["model"], float(r["budget_mb"])): dict(r["ms"])
            for r in _data()["fig9"]["rows"]}


@functools.lru_cache(maxsize=1)
def weak_a2av() -> dict[tuple[str, int, float], float]:
    """``(cluster, nodes, MB) -> a2av ms`` of Fig. 10 (K2)."""
    return {(r["cluster"], int(r["nodes"]), float(r["budget_mb"])): float(r["a2av_ms"])
            for r in _data()["weak_scaling_a2av"]["rows"]}


def measured_ms(cluster: str, nodes: int, model: str, mb: float) -> dict[str, float | None]:
    """Measured latency per baseline for a configuration (``None`` where the paper has none)."""
    row = fig9().get((cluster, nodes, model, float(mb)))
    out: dict[str, float | None] = {s: (row[s] if row else None) for s in system_columns()}
    if model == "k2" and out["a2av"] is None:
        out["a2av"] = weak_a2av().get((cluster, nodes, float(mb)))
    return out
