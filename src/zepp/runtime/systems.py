"""The systems ``zepp run`` executes: the rows of ``zepp.registry`` that the runtime supports."""

from __future__ import annotations

from zepp.registry import SYSTEMS, System, names_for
from zepp.registry import parse_systems as _parse

RunSystem = System
DEFAULT_ALL = ("a2av", "eplb", "relay", "zepp-overlap", "zepp-a2av")

__all__ = ["SYSTEMS", "RunSystem", "DEFAULT_ALL", "parse_systems", "names_for"]


def parse_systems(text: str) -> list[str]:
    """A comma list of runtime-supported registry names; ``all`` stands for ``DEFAULT_ALL``;
    ``zepp`` (the best of its variants) runs each of its variants."""
    return _parse(text, "runtime", default_all=DEFAULT_ALL, expand=True)
