"""Import paths of earlier releases, kept working: ``from zepp.trace import read_trace`` and the like.

The modules moved into the pipeline's packages (``zepp.traces``, ``zepp.planner``); an old name
resolves to the module that now holds it (the same module object, not a copy). New code imports
the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

OLD_PATHS = {
    "zepp.trace": "zepp.traces",
    "zepp.placement": "zepp.planner.placement",
    "zepp.routing": "zepp.planner.routing",
    "zepp.flows": "zepp.planner.flows",
    "zepp.plan": "zepp.planner.types",
    "zepp.granularity": "zepp.planner.granularity",
    "zepp.torchplan": "zepp.planner.torch",
}


class OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds only the names in ``OLD_PATHS``; loading one returns the module that holds it now."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in OLD_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(OLD_PATHS[spec.name])

    def exec_module(self, module) -> None:
        pass  # the module is already executed under its new name


def install() -> None:
    if not any(isinstance(f, OldPathFinder) for f in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
