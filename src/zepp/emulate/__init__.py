"""The emulated multi-node cluster: network namespaces with shaped "NIC" links on one machine.

``EmulatedCluster`` builds it (see ``zepp.emulate.netns`` for the layout and the interface the
runtime launcher uses), ``zepp.emulate.linkcal`` measures its links, ``zepp cluster up|down|status``
drives it from the command line. ``zepp run --emulate`` runs the runtime in it
(``zepp.emulate.runner``, with per-layer interface counters from ``zepp.emulate.rankrun``);
``zepp.emulate.simcheck`` calibrates it and simulates the runtime's executor to compare.
"""

from zepp.emulate.netns import (
    DEFAULT_PREFIX,
    DEFAULT_RATE_MBIT,
    EmulatedCluster,
    EmulationError,
    EmulationUnavailable,
    LinkCounters,
    RankFailure,
    RankGroup,
    RunResult,
    availability,
    down,
    status,
)

__all__ = [
    "DEFAULT_PREFIX", "DEFAULT_RATE_MBIT", "EmulatedCluster", "EmulationError", "EmulationUnavailable",
    "LinkCounters", "RankFailure", "RankGroup", "RunResult", "availability", "down", "status",
]
