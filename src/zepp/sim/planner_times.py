"""Recorded planning times of the torch planner, for the simulator's planning-cost model.

``zepp/data/planner_torch_times.json`` holds measured times per planner part, named as in
``zepp/data/planner_cost.json`` (``route:zepp``, ``flows:<dispatch>/<combine>``), in
milliseconds for the whole cluster's plan of one batch of ``entries`` (``R*T*k``) entries:
``records`` are CPU runs (never device figures), ``device_records`` GPU runs (CUDA-graph replays
where ``cuda_graph`` is true). ``device_part_seconds`` turns the device records into a time for
any batch size, with the op-mix model's rules (``zepp.sim.planning_cost.gpu_opmix_seconds``): the
smallest measured time below the smallest measured size (launch-bound floor), linear between
measured sizes, the last non-falling slope above; the part above the floor scaled by the HBM bandwidth
of the recorded GPU over the target's (``measured_seconds``, which the op-mix model uses too). It returns ``None`` where no device figure exists, so a caller
keeps the op-mix conversion there.

The package's file holds no device record: the simulator's default charges Zepp's planner by the
op-mix model (the planner the paper describes: about 5% of the layer). The torch planner as this
project ships it, timed on an H200 (``benchmarks/results/plan_speed_torch_h200_cuda.json``), is
charged only when asked: ``charged_records([read_device_run(FILE)])`` around a simulation
(``benchmarks/simulated/bench_today.py --planner-times FILE``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from importlib import resources

import numpy as np

from zepp.errors import ZeppFileError


@functools.lru_cache(maxsize=1)
def recorded_times() -> dict:
    """The data file ``zepp/data/planner_torch_times.json``."""
    return json.loads((resources.files("zepp") / "data" / "planner_torch_times.json").read_text())


_charged: list[dict] = []  # the records ``charged_records`` put in force, innermost last


@contextlib.contextmanager
def charged_records(records: list[dict] | None):
    """Within the block, ``device_part_seconds`` reads the device records ``records``
    (``read_device_run`` / ``record_from_device_run`` entries) instead of the data file's: a
    simulation charges the planner figures of a device run without writing them into the package.
    ``None``: the data file's, as outside any block."""
    if records is None:
        yield
        return
    _charged.append({"device_records": records})
    try:
        yield
    finally:
        _charged.pop()


def read_device_run(path) -> dict:
    """The ``device_records`` entry of the JSON file ``path`` written by
    ``benchmarks/planner/plan_speed_torch.py --device cuda`` (``record_from_device_run``); bad
    content is one ``ZeppFileError`` line naming the file and field."""
    from zepp.files.structured import read_json

    return record_from_device_run(read_json(path, "planner device run"), path)


def record_from_device_run(info, source="the device run") -> dict:
    """One ``device_records`` entry from a ``plan_speed_torch.py --device cuda`` run ``info`` (its
    rows' CUDA-graph part times in ms; rows whose capture failed are left out). ``source`` names
    the run in the ``ZeppFileError`` a malformed one raises."""
    what = "planner device run"
    rows = info.get("rows") if isinstance(info, dict) else None
    if not isinstance(rows, list) or not isinstance(info.get("measured_at"), str):
        raise ZeppFileError(what, source, None, "give the JSON plan_speed_torch.py --device cuda writes "
                            "(rows and measured_at)")
    kept = []
    for i, r in enumerate(rows):
        parts = r.get("parts_ms") if isinstance(r, dict) else None
        if not parts:
            continue
        entries = r.get("entries")
        if not isinstance(entries, int) or isinstance(entries, bool) or entries <= 0:
            raise ZeppFileError(what, source, f"rows[{i}].entries", "give the batch's entry count, a positive integer")
        bad = [k for k, v in parts.items() if not isinstance(v, (int, float)) or isinstance(v, bool)
               or not math.isfinite(v) or v < 0] if isinstance(parts, dict) else ["(not an object)"]
        if bad:
            raise ZeppFileError(what, source, f"rows[{i}].parts_ms {bad[0]}", "give milliseconds, finite and >= 0")
        kept.append(dict(model=r.get("model"), nodes=r.get("nodes"), budget_mb=r.get("mb"), entries=entries,
                         graph_ms=r.get("graph_ms"), eager_ms=r.get("eager_ms"),
                         capture_safe_ms=r.get("capture_safe_ms"), parts_ms=parts))
    if not kept:
        raise ZeppFileError(what, source, "rows", "give a run with at least one CUDA-graph row (parts_ms)")
    return dict(device="cuda", device_name=rows[0].get("device"), cuda_graph=True, measured_at=info["measured_at"],
                hbm_bw=info.get("hbm_bw"), torch=info.get("torch"),
                written_by="benchmarks/planner/plan_speed_torch.py --device cuda", rows=kept)


def device_part_seconds(part: str, entries: int, hbm_bw: float | None = None, *, prefer_graph: bool = True,
                        data: dict | None = None) -> float | None:
    """Seconds of planner part ``part`` for a batch of ``entries`` entries on a GPU of ``hbm_bw``
    bytes/s (``None``: the recorded GPU's), from the device records; ``None`` when none has it.

    Among the records holding ``part``, CUDA-graph ones first (``prefer_graph``), then the latest."""
    if data is None:
        data = _charged[-1] if _charged else recorded_times()
    recs = [r for r in data.get("device_records", []) if any(part in row.get("parts_ms", {}) for row in r["rows"])]
    if not recs:
        return None
    recs.sort(key=lambda r: (bool(r.get("cuda_graph")) == prefer_graph, r.get("measured_at", "")), reverse=True)
    rec = recs[0]
    pts = sorted((int(row["entries"]), float(row["parts_ms"][part]) * 1e-3) for row in rec["rows"]
                 if part in row.get("parts_ms", {}))
    return measured_seconds([p[0] for p in pts], [p[1] for p in pts], entries, rec.get("hbm_bw"), hbm_bw)


def measured_seconds(sizes, seconds, entries: int, recorded_bw: float | None = None,
                     target_bw: float | None = None) -> float:
    """Seconds of a planner part at ``entries`` from its measured ``seconds [m]`` at ascending
    batch ``sizes [m]`` (entries), on a GPU of ``target_bw`` HBM bytes/s when measured on one of
    ``recorded_bw`` (either ``None``: no scaling). The one interpolation of the planner's cost
    records (the op mix of ``zepp.sim.planning_cost`` and the device records here):

    - below the smallest size, the smallest time (the launch-bound floor);
    - between sizes, linear in the entries;
    - above the largest, along the last measured slope, never a falling one (a negative last
      slope, measurement noise, would predict shorter times for larger batches); from a single
      size, in proportion to the entries;
    - the part above the floor scaled by ``recorded_bw / target_bw`` (the floor is kernel
      launches and one host synchronisation, the same on any GPU).
    """
    n = np.asarray(sizes, float)
    t = np.asarray(seconds, float)
    floor = float(t[0])
    x = float(max(entries, 0))
    if x <= n[0]:
        here = floor
    elif x <= n[-1]:
        here = float(np.interp(x, n, t))
    elif len(n) >= 2:
        here = float(t[-1] + (x - n[-1]) * max(t[-1] - t[-2], 0.0) / (n[-1] - n[-2]))
    else:  # one measured size: grow in proportion to the entries above it
        here = float(t[-1] * x / n[-1])
    if not (recorded_bw and target_bw):
        return floor + (here - floor)
    return floor + (here - floor) * float(recorded_bw) / target_bw
