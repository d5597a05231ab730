"""The systems ``zepp run`` executes (see ``zepp.stages``): placement + routing + transport,
plus overlap and swaps."""

from __future__ import annotations

from zepp.stages import SYSTEMS, StageChoice, parse_system_names

RunSystem = StageChoice
DEFAULT_ALL = ("a2av", "eplb", "relay", "zepp", "zepp-a2av")

__all__ = ["SYSTEMS", "RunSystem", "DEFAULT_ALL", "parse_systems"]


def parse_systems(text: str) -> list[str]:
    """A comma list of names from ``SYSTEMS``; ``all`` stands for ``DEFAULT_ALL``."""
    return parse_system_names(text, tuple(SYSTEMS), DEFAULT_ALL)
