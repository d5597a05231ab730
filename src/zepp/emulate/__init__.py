"""The emulated multi-node cluster: network namespaces with shaped "NIC" links on one machine.

Modules, by what they own:

- ``topology``: ``EmulatedCluster`` (its names, up and down, counters, faults, running ranks in it);
  ``links``: its namespaces, links, routes and shaping; ``host_check``: whether this machine can
  build one; ``exit_teardown``: a run's clusters removed at exit and on SIGTERM;
- ``inventory``: what exists for a prefix (``status``), removing it (``down``), ``attach``;
- ``ownership``: the marks and records that say which namespaces are zepp's and whose;
- ``counters``: the links' byte counters;
- ``launcher``: ``--emulate`` of ``zepp run`` and ``zepp generate`` (the cluster's options checked,
  brought up, the command's ranks run in it through ``zepp.launch.ranks``, torn down);
  ``nic_bytes``: the NIC bytes per system of ``zepp run --emulate`` against the planner's;
- rank entry points (``python -m``): ``worker_rank`` (the runtime worker with per-layer interface
  counters through the worker's hooks), ``serve_rank`` (the serving rank with its NIC counters as
  probe), ``call_rank`` (runs ``module:function`` for ``EmulatedCluster.call``);
- ``a2a_jobs``, ``linkcal``, ``simcheck``: small gloo all-to-all jobs, measuring the links, and
  the simulator against the emulated cluster;
- ``glooexec``: the runtime's gloo executor as the simulator's layer builder sees it (its
  ``Mechanics``, its ``Net`` and cluster from the calibration, the measured GEMM cost).

Processes, temp folders and the watchdog that cleans up after a killed launcher are
``zepp.launch``'s; ``zepp cluster`` is ``zepp.cli.cluster``.
"""

from zepp.emulate.counters import LinkCounters
from zepp.launch.processes import RankGroup, RunResult
from zepp.emulate.inventory import attach, down, status
from zepp.emulate.host_check import availability
from zepp.emulate.links import DEFAULT_RATE_MBIT
from zepp.emulate.topology import DEFAULT_PREFIX, EmulatedCluster
from zepp.errors import EmulationError, EmulationUnavailable, RankFailure

__all__ = [
    "DEFAULT_PREFIX", "DEFAULT_RATE_MBIT", "EmulatedCluster", "EmulationError", "EmulationUnavailable",
    "LinkCounters", "RankFailure", "RankGroup", "RunResult", "attach", "availability", "down", "status",
]
