"""Systems as one choice per planning stage, shared by ``zepp plan`` and ``zepp run``.

The simulator (``zepp.systems``) adds each system's execution mechanics on top; the planner
and the real executor only need placement, routing, transport and how the executor overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class StageChoice:
    """A system: placement, routing and transport, plus how the real executor runs it."""

    name: str
    placement: str
    routing: str
    transport: str
    overlap: bool = False  # compute on arrived groups while the rest is in flight
    swaps: bool = False  # intra-node expert swaps between layers
    overlap_comm: str = "collective"  # overlap via async all-to-alls, or "p2p" (batched isend/irecv)


SYSTEMS = {
    s.name: s
    for s in (
        StageChoice("a2av", "home", "home", "a2av"),
        StageChoice("relay", "home", "home", "relay"),
        StageChoice("eplb", "eplb", "replica-rr", "a2av"),
        StageChoice("sglang", "eplb", "locality", "a2av"),
        StageChoice("epic", "epic", "locality", "relay"),
        StageChoice("zepp-a2av", "zepp", "zepp", "a2av"),
        StageChoice("zepp-relay", "zepp", "zepp", "relay"),
        StageChoice("zepp", "zepp", "zepp", "zepp", overlap=True),
        StageChoice("zepp-sync", "zepp", "zepp", "zepp"),  # zepp transport without overlap
        StageChoice("zepp-swap", "zepp", "zepp", "zepp", overlap=True, swaps=True),
        StageChoice("zepp-p2p", "zepp", "zepp", "zepp", overlap=True, overlap_comm="p2p"),
        # zepp with the combine's pre-reduced rows sent straight to the owner: one stage fewer
        StageChoice("zepp-direct", "zepp", "zepp", "zepp-direct"),
    )
}

# Systems whose plans differ (the last three share zepp's plan and differ only in execution).
PLAN_SYSTEMS = ("a2av", "relay", "eplb", "sglang", "epic", "zepp-a2av", "zepp-relay", "zepp", "zepp-direct")


def parse_system_names(text: str, known: tuple[str, ...] | list[str], everything: tuple[str, ...]) -> list[str]:
    """A comma list of names from ``known``; ``all`` stands for ``everything``."""
    names: list[str] = []
    for s in (s.strip() for s in text.split(",")):
        for n in (everything if s == "all" else [s] if s else []):
            if n not in names:
                names.append(n)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ZeppInputError(f"--systems: unknown system(s) {bad}; choose from {', '.join(known)} or 'all'")
    return names
