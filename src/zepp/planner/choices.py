"""One shape for every stage's choices: a record per choice, a table per stage.

Each planner stage (placement, routing, dispatch, combine, overlap, adaptation) keeps one
``ChoiceTable`` of records in the package that implements it. A record holds the choice's
name, its one-line meaning, the function that runs it (``None`` where another part of the
system runs it: COMET's overlap is the simulator's plug-in), whether the torch planner has its
twin, and the stage's capability flags (fields of the stage's record type). Code outside a
table never compares a stage name: it asks the record (``ROUTINGS.choice(name).needs_table``),
as vLLM's modular kernel asks a prepare/finalize what it supports.

The torch twin of a choice is found by its place, not by a second table: the torch planner
mirrors the numpy tree file for file and name for name, so the twin of
``zepp.planner.routing.simple_routing.route_home`` is
``zepp.planner.torch.routing.simple_routing.route_home`` (``Choice.twin``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar

from zepp.errors import ZeppInputError

__all__ = ["Choice", "ChoiceTable", "twin_of"]

TORCH_ROOT = "zepp.planner.torch."
NUMPY_ROOT = "zepp.planner."


@dataclass(frozen=True)
class Choice:
    """One choice of one stage: ``name``, ``meaning`` (one line, shown by ``zepp systems``),
    ``function`` (what runs it; its signature is the stage's, see the stage package) and
    ``torch_twin`` (the torch planner has a function of the same name in the mirrored module)."""

    name: str
    meaning: str
    function: Callable | None = None
    torch_twin: bool = False

    def twin(self) -> Callable:
        """The torch planner's twin of ``function`` (imports torch); ``LookupError`` when there is none."""
        if not self.torch_twin or self.function is None:
            raise LookupError(f"{self.name!r} has no torch twin")
        return twin_of(self.function)


def twin_of(function: Callable) -> Callable:
    """The function of the same name in the torch planner's mirror of ``function``'s module."""
    module = function.__module__
    if not module.startswith(NUMPY_ROOT) or module.startswith(TORCH_ROOT):
        raise LookupError(f"{module}.{function.__name__} is not a numpy planner function")
    return getattr(importlib.import_module(TORCH_ROOT + module[len(NUMPY_ROOT):]), function.__name__)


C = TypeVar("C", bound=Choice)


class ChoiceTable(Mapping, Generic[C]):
    """The choices of one stage, by name, in table order (a read-only mapping name -> record).

    ``choice(name)`` is the lookup for user-given names: an unknown one is a ``ZeppInputError``
    that names the stage and lists the choices."""

    def __init__(self, stage: str, choices: tuple[C, ...]):
        self.stage = stage
        self._by_name: dict[str, C] = {}
        for c in choices:
            if c.name in self._by_name:
                raise AssertionError(f"{stage}: choice {c.name!r} listed twice")
            self._by_name[c.name] = c

    def __getitem__(self, name: str) -> C:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def choice(self, name: str) -> C:
        """The record of ``name``; an unknown name is bad input (the message lists the choices)."""
        c = self._by_name.get(name)
        if c is None:
            raise ZeppInputError(f"unknown {self.stage} {name!r}; choose one of {', '.join(self._by_name)}")
        return c

    def meanings(self) -> dict[str, str]:
        """``{name: one-line meaning}`` (``zepp systems``, ``--json``)."""
        return {n: c.meaning for n, c in self._by_name.items()}

    def having(self, flag: str) -> tuple[str, ...]:
        """Names of the choices whose ``flag`` is true, in table order."""
        return tuple(n for n, c in self._by_name.items() if getattr(c, flag))
