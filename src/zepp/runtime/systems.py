"""The systems ``zepp run`` executes, each a placement + routing + transport (+ overlap, swaps)."""

from __future__ import annotations

from dataclasses import dataclass

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class RunSystem:
    name: str
    placement: str
    routing: str
    transport: str
    overlap: bool = False
    swaps: bool = False
    overlap_comm: str = "collective"  # overlap via async all-to-alls, or "p2p" (batched isend/irecv)


SYSTEMS = {
    s.name: s
    for s in (
        RunSystem("a2av", "home", "home", "a2av"),
        RunSystem("eplb", "eplb", "replica-rr", "a2av"),
        RunSystem("relay", "home", "home", "relay"),
        RunSystem("zepp", "zepp", "zepp", "zepp", overlap=True),
        RunSystem("zepp-a2av", "zepp", "zepp", "a2av"),
        RunSystem("zepp-sync", "zepp", "zepp", "zepp"),  # zepp transport without overlap
        RunSystem("zepp-swap", "zepp", "zepp", "zepp", overlap=True, swaps=True),
        RunSystem("zepp-p2p", "zepp", "zepp", "zepp", overlap=True, overlap_comm="p2p"),
    )
}
DEFAULT_ALL = ("a2av", "eplb", "relay", "zepp", "zepp-a2av")


def parse_systems(text: str) -> list[str]:
    """A comma list of names from ``SYSTEMS``; ``all`` stands for ``DEFAULT_ALL``."""
    names = []
    for s in (s.strip() for s in text.split(",")):
        for n in (DEFAULT_ALL if s == "all" else [s] if s else []):
            if n not in names:
                names.append(n)
    bad = [n for n in names if n not in SYSTEMS]
    if bad or not names:
        raise ZeppInputError(f"--systems: unknown system(s) {bad}; choose from {', '.join(SYSTEMS)} or 'all'")
    return names
