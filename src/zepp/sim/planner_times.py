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
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import numpy as np


@functools.lru_cache(maxsize=1)
def recorded_times() -> dict:
    """The data file ``zepp/data/planner_torch_times.json``."""
    return json.loads((resources.files("zepp") / "data" / "planner_torch_times.json").read_text())


def device_part_seconds(part: str, entries: int, hbm_bw: float | None = None, *, prefer_graph: bool = True,
                        data: dict | None = None) -> float | None:
    """Seconds of planner part ``part`` for a batch of ``entries`` entries on a GPU of ``hbm_bw``
    bytes/s (``None``: the recorded GPU's), from the device records; ``None`` when none has it.

    Among the records holding ``part``, CUDA-graph ones first (``prefer_graph``), then the latest."""
    data = recorded_times() if data is None else data
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
