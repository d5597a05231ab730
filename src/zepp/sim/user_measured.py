"""A user's own measured layer times (``zepp bench --measured FILE``), held against the simulator.

The file is JSON: ``{"rows": [{"cluster": "a100", "nodes": 4, "gpus_per_node": 4, "model": "k2",
"budget_mb": 16, "ms": {"zepp": 10.2, "a2av": 38.0}}, ...]}`` (``gpus_per_node`` defaults to the
preset's board), the layout of the paper's table in ``zepp/data/paper_measured.json``. Every
system is a registry name the simulator runs, every time a finite number of milliseconds above
0, every configuration listed once. ``zepp bench`` prints the model's error on Zepp's row where
the file measures it, beside the error on the fastest baseline (a user's figure replaces the
paper's for that cell); the ``--json`` rows keep the paper's figures only.
"""

from __future__ import annotations

import math

from zepp import registry
from zepp.cluster import PRESET_NAMES, preset_gpus_per_node
from zepp.errors import ZeppInputError
from zepp.files.structured import read_json
from zepp.model import PRESET_NAMES as MODEL_NAMES

__all__ = ["read_measured", "apply_measured"]

_ROW_KEYS = {"cluster", "nodes", "gpus_per_node", "model", "budget_mb", "ms"}


def read_measured(path) -> dict[tuple, dict[str, float]]:
    """``(cluster, nodes, gpus_per_node, model, budget_mb) -> {system: ms}`` of a ``--measured``
    file; anything else is one ``ZeppInputError`` naming the row and field."""
    p = path
    data = read_json(path, "--measured file", ".json")  # zepp.files: depth, size, duplicate keys
    if not isinstance(data, dict) or set(data) != {"rows"} or not isinstance(data["rows"], list) or not data["rows"]:
        raise ZeppInputError(f"{p}: expected {{\"rows\": [...]}} with one or more rows (zepp bench --help)")
    out: dict[tuple, dict[str, float]] = {}
    for i, row in enumerate(data["rows"]):
        key, ms = _row(p, i, row)
        if key in out:
            raise ZeppInputError(f"{p}: rows[{i}] repeats configuration {key}; give each configuration once")
        out[key] = ms
    return out


def _row(p, i: int, row) -> tuple[tuple, dict[str, float]]:
    where = f"{p}: rows[{i}]"
    if not isinstance(row, dict) or not {"cluster", "nodes", "model", "budget_mb", "ms"} <= set(row) \
            or not set(row) <= _ROW_KEYS:
        raise ZeppInputError(f"{where}: needs exactly cluster, nodes, model, budget_mb, ms (and optionally "
                             f"gpus_per_node)")
    if row["cluster"] not in PRESET_NAMES:
        raise ZeppInputError(f"{where} field cluster: {row['cluster']!r} is no preset; choose one of "
                             f"{', '.join(PRESET_NAMES)}")
    if row["model"] not in MODEL_NAMES:
        raise ZeppInputError(f"{where} field model: {row['model']!r} is no preset; choose one of {', '.join(MODEL_NAMES)}")
    L = row.get("gpus_per_node", preset_gpus_per_node(row["cluster"]))
    for field, value in (("nodes", row["nodes"]), ("gpus_per_node", L)):
        if type(value) is not int or not 1 <= value <= 4096:
            raise ZeppInputError(f"{where} field {field}: expected an integer in [1, 4096], got {value!r}")
    mb = row["budget_mb"]
    if type(mb) not in (int, float) or not (math.isfinite(mb) and 0 < mb <= 1e6):
        raise ZeppInputError(f"{where} field budget_mb: expected a number of MB in (0, 1e6], got {mb!r}")
    ms = row["ms"]
    if not isinstance(ms, dict) or not ms:
        raise ZeppInputError(f"{where} field ms: expected a mapping {{system: milliseconds}} with one or more systems")
    for name, v in ms.items():
        if name not in registry.SYSTEMS or not registry.SYSTEMS[name].supports("sim"):
            raise ZeppInputError(f"{where} field ms: {name!r} is no system the simulator runs; choose from "
                                 f"{registry.help_list('sim')}")
        if type(v) not in (int, float) or not (math.isfinite(v) and 0 < v <= 1e7):
            raise ZeppInputError(f"{where} field ms.{name}: expected milliseconds in (0, 1e7], got {v!r}")
    return (row["cluster"], row["nodes"], L, row["model"], float(mb)), {k: float(v) for k, v in ms.items()}


def apply_measured(rows: list[dict], measured: dict[tuple, dict[str, float]]) -> tuple[list[dict], list[tuple]]:
    """``(rows, unused)``: copies of ``rows`` whose ``measured_ms`` hold the user's figures too
    (a user's figure replaces the paper's of that cell; ``measured_by_user`` lists them), for the
    printed table only (the ``--json`` rows keep the paper's, so a resumed run never mistakes an
    old file's figures for measured ones); ``unused``: the file's configurations no row holds."""
    used, out = set(), []
    for r in rows:
        key = (r["cluster"], r["nodes"], r.get("gpus_per_node", 4), r["model"], float(r["budget_mb"]))
        if key in measured:
            used.add(key)
            r = dict(r, measured_ms={**(r.get("measured_ms") or {}), **measured[key]},
                     measured_by_user=sorted(measured[key]))
        out.append(r)
    return out, [k for k in measured if k not in used]
