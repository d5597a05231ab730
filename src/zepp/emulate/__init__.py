"""The emulated multi-node cluster: network namespaces with shaped "NIC" links on one machine.

Modules, by what they own:

- ``topology``: ``EmulatedCluster`` (namespaces, links, shaping, faults, running ranks in it);
- ``inventory``: what exists for a prefix (``status``), removing it (``down``), ``attach``;
- ``ownership``: the marks and records that say which namespaces are zepp's and whose;
- ``processes``: starting, waiting for and ending rank processes (one wait-and-kill loop for
  every launcher in zepp), temp folders, and what is guaranteed when a launcher is killed;
- ``watchdog``: the helper process that cleans up after a launcher killed with ``kill -9``;
- ``counters``: the links' byte counters;
- ``cli``: ``zepp cluster up|down|status|check|calibrate``;
- ``runner`` + ``rankrun``: ``zepp run --emulate`` (the runtime worker in every rank, with
  per-layer interface counters through the worker's hooks);
- ``linkcal``, ``jobs``, ``rankmain``, ``simcheck``: measuring the links, small gloo jobs, the
  entry point of ``EmulatedCluster.call``, and the simulator against the emulated cluster;
- ``glooexec``: the runtime's gloo executor as the simulator's layer builder sees it (its
  ``Mechanics``, its ``Net`` and cluster from the calibration, the measured GEMM cost).
"""

from zepp.emulate.counters import LinkCounters
from zepp.launch.processes import RankGroup, RunResult
from zepp.emulate.inventory import attach, down, status
from zepp.emulate.topology import DEFAULT_PREFIX, DEFAULT_RATE_MBIT, EmulatedCluster, availability
from zepp.errors import EmulationError, EmulationUnavailable, RankFailure

__all__ = [
    "DEFAULT_PREFIX", "DEFAULT_RATE_MBIT", "EmulatedCluster", "EmulationError", "EmulationUnavailable",
    "LinkCounters", "RankFailure", "RankGroup", "RunResult", "attach", "availability", "down", "status",
]
