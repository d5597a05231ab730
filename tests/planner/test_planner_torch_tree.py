"""The torch planner mirrors the numpy planner file for file and name for name, and finds its
functions through the numpy stage records (``Choice.twin``): every record with a torch twin
resolves to a callable of the same name in the mirrored module, every torch module has a numpy
module at the same relative path (torch-only helpers named here), and a choice without a twin
is refused with one ``ZeppInputError``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import zepp.planner.torch as tp
import zepp.planner.torch.flows as torch_flows
from planner_cases import random_placement
from zepp.errors import ZeppInputError
from zepp.planner.adaptation import ADAPTATIONS
from zepp.planner.choices import ChoiceTable
from zepp.planner.flows import COMBINES, DISPATCHES
from zepp.planner.overlap import OVERLAP_COMMS, OVERLAPS
from zepp.planner.placement import PLACEMENTS
from zepp.planner.routing import ROUTINGS

PLANNER = Path(__file__).resolve().parents[2] / "src" / "zepp" / "planner"
TORCH = PLANNER / "torch"
TABLES = (PLACEMENTS, ROUTINGS, DISPATCHES, COMBINES, OVERLAPS, OVERLAP_COMMS, ADAPTATIONS)

# Torch-only modules (relative to planner/torch/): no numpy twin, by design.
TORCH_ONLY_MODULES = {
    "_ops.py": "tensor building blocks (the numpy planner's are numpy calls)",
    "routing/device_placement.py": "a placement's static tables copied to a device once",
    "flows/hop_parts.py": "filling a fixed-capacity device hop table (numpy: Hops.make / Hops.concat)",
    "host_traffic.py": "the CPU check that the capture-safe path does nothing a CUDA graph refuses",
}
# Public names of mirrored torch modules that have no numpy namesake (``TorchX`` twins numpy ``X``).
TORCH_ONLY_NAMES = {
    "types.py": {"IncompletePlan", "route_to_torch"},
    "routing/base_routing.py": {"default_sync", "as_device_ids"},
    "routing/table_routing.py": {"TableTensors", "table_tensors"},
}


def _torch_modules() -> list[str]:
    return sorted(str(p.relative_to(TORCH)) for p in TORCH.rglob("*.py"))


def _defined(path: Path) -> set[str]:
    """Public functions and classes a module defines at its top level."""
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")}


def test_every_twin_resolves_to_the_same_name_in_the_mirrored_module():
    checked = 0
    for table in TABLES:
        for name, choice in table.items():
            if not choice.torch_twin:
                continue
            twin = choice.twin()
            numpy_module = choice.function.__module__
            assert callable(twin) and twin is not choice.function, f"{table.stage} {name}"
            mirrored = "zepp.planner.torch." + numpy_module[len("zepp.planner."):]
            assert twin.__module__ == mirrored, f"{table.stage} {name}"
            assert twin.__name__ == choice.function.__name__, f"{table.stage} {name}"
            checked += 1
    assert checked == len(ROUTINGS.having("torch_twin")) + len(DISPATCHES) + len(COMBINES)


def test_the_torch_planner_covers_every_transport_and_the_per_batch_routings():
    # MoonEP's planner loops over ranks on the host; SGLang's lp solves a float LP and its dynamic
    # dispatch draws per entry (baselines', numpy only); the table routings' lookup is
    # zepp.planner.torch.routing.table_routing.rank_slots
    assert set(ROUTINGS.having("torch_twin")) == set(ROUTINGS) - {"moonep", "lp", "sglang-dynamic", "sglang-lp",
                                                                  *ROUTINGS.having("needs_table")}
    assert DISPATCHES.having("torch_twin") == tuple(DISPATCHES)
    assert COMBINES.having("torch_twin") == tuple(COMBINES)


def test_every_torch_module_mirrors_a_numpy_module():
    assert set(TORCH_ONLY_MODULES) <= set(_torch_modules()), "a torch-only helper named here is gone"
    missing = [rel for rel in _torch_modules() if rel not in TORCH_ONLY_MODULES and not (PLANNER / rel).exists()]
    assert not missing, f"torch modules without a numpy module at the same path: {missing}"


def test_every_torch_name_mirrors_a_numpy_name():
    """A mirrored module's public functions and classes carry the names of its numpy twin's."""
    stray = []
    for rel in _torch_modules():
        if rel in TORCH_ONLY_MODULES:
            continue
        numpy_names = _defined(PLANNER / rel)
        for name in _defined(TORCH / rel):
            twin = name[len("Torch"):] if name.startswith("Torch") else name
            if twin not in numpy_names and name not in TORCH_ONLY_NAMES.get(rel, ()):
                stray.append(f"{rel}: {name}")
    assert not stray, f"torch names without a numpy namesake: {stray}"
    for rel, names in TORCH_ONLY_NAMES.items():
        assert names <= _defined(TORCH / rel), f"{rel}: a torch-only name listed here is gone"


def test_choices_without_a_twin_are_refused(monkeypatch):
    rng = np.random.default_rng(0)
    pl = random_placement(rng, 1, 2, 2, 0)
    ids = torch.zeros((2, 1, 1), dtype=torch.int64)
    no_twin = [n for n, c in ROUTINGS.items() if not c.torch_twin]
    assert no_twin
    for name in no_twin:
        with pytest.raises(LookupError):
            ROUTINGS[name].twin()
        with pytest.raises(ZeppInputError, match=f"routing {name!r} has no torch planner"):
            tp.route(name, ids, pl)
    r = tp.route("home", ids, pl)
    # a transport whose record says it has no twin is refused, even though a twin of that name exists
    for stage in ("DISPATCHES", "COMBINES"):
        table = getattr(torch_flows, stage)
        records = tuple(dataclasses.replace(c, torch_twin=c.name != "dedup") for c in table.values())
        monkeypatch.setattr(torch_flows, stage, ChoiceTable(table.stage, records))
        with pytest.raises(ZeppInputError, match="dedup/dedup has no torch planner"):
            tp.build_flows(r, "dedup", 8, "dedup")
        monkeypatch.undo()
    tp.build_flows(r, "dedup", 8, "dedup")
