"""``--emulate``: the ranks of ``zepp run`` and ``zepp generate`` inside an emulated cluster.

Both bring up ``cfg["nodes"] x cfg["gpus_per_node"]`` rank namespaces (``zepp.emulate.topology``),
start the command's ranks in them with the one launch path (``zepp.launch.ranks.RankRun``), wait,
tear the cluster down (always: also on Ctrl-C, SIGTERM, a crashed or hung rank) and return rank
0's report with an ``"emulate"`` section. A failure raises ``zepp.errors.RankFailure`` (the same
message format as local ranks).

- ``run_emulated``: ``zepp run``'s ranks (``python -m zepp.emulate.worker_rank CONFIG OUTDIR``:
  the unchanged runtime worker plus per-layer interface counters); ``report["emulate"]``::

    {"rate_mbit", "delay_ms", "prefix", "nodes", "gpus_per_node",
     "systems": {name: {"nic_tx" [R], "nic_rx" [R], "nvlink_tx" [R],   # kernel counters, bytes per
                        "planned_nic" [R], "planned_nvlink" [R],        # timed iteration (mean);
                                                                        # planned: None for swapping systems
                        "metadata_nic": bytes of the id/weight all-gather per iteration, all ranks}}}

  (``zepp.emulate.nic_bytes``). ``nic_fault=(rank, call)``: tests take rank ``rank``'s node off
  the network at the start of its layer call ``call`` (see ``zepp.emulate.worker_rank``).
- ``generate_emulated``: ``zepp generate``'s ranks (``python -m zepp.emulate.serve_rank CONFIG``:
  the serving rank with its NIC counters as probe); ``report["emulate"]`` holds the rate and shape.
- ``check_cluster``: the options of an emulated cluster checked, and whether this machine can
  host one, before anything starts (the cluster it returns is not up yet).

Temp files live in the run's ``zepp-emurun-*`` / ``zepp-generate-emu-*`` folder, removed on every
exit path (``zepp.launch.processes.temp_folder``).
"""

from __future__ import annotations

import json
import os

from zepp.emulate.host_check import availability
from zepp.emulate.links import DEFAULT_RATE_MBIT
from zepp.emulate.topology import EmulatedCluster
from zepp.errors import ZeppInputError
from zepp.launch.ranks import RankRun, thread_env


def check_cluster(nodes: int, gpus_per_node: int, rate_mbit: float | None = None, delay_ms: float = 0.0,
                  prefix: str = "zepp") -> EmulatedCluster:
    """The (not yet up) cluster for these options; ``ZeppInputError`` for a bad value or when this
    machine cannot host an emulated cluster (not root, no network namespaces)."""
    cl = EmulatedCluster(nodes, gpus_per_node, rate_mbit=DEFAULT_RATE_MBIT if rate_mbit is None else rate_mbit,
                         delay_ms=delay_ms, prefix=prefix)  # validates rate, delay, prefix
    ok, reason = availability()
    if not ok:
        raise ZeppInputError(f"--emulate: emulated cluster unavailable: {reason}")
    return cl


def _check_shape(cl: EmulatedCluster, cfg: dict) -> None:
    if cl.ranks != cfg["nodes"] * cfg["gpus_per_node"] or cl.gpus_per_node != cfg["gpus_per_node"]:
        raise ValueError(f"cluster {cl.nodes}x{cl.gpus_per_node} does not match the config's "
                         f"{cfg['nodes']}x{cfg['gpus_per_node']}")


def run_emulated(cfg: dict, rate_mbit: float = DEFAULT_RATE_MBIT, delay_ms: float = 0.0, threads: int = 1,
                 prefix: str = "zepp", nic_fault: tuple[int, int] | None = None, run_timeout: float | None = None,
                 grace: float | None = None, cluster: EmulatedCluster | None = None) -> dict:
    """Run ``cfg`` (a ``zepp.runtime.worker`` config) in an emulated cluster; see the module doc.

    ``cluster``: an ``EmulatedCluster`` of the right shape; already up, it is kept up afterwards;
    not up, it is brought up and torn down like the one made by default from ``rate_mbit``,
    ``delay_ms`` and ``prefix``. ``run_timeout``: an overall limit in seconds (None: none; a hung
    collective ends by ``cfg["timeout"]``).
    """
    cl = cluster if cluster is not None else EmulatedCluster(cfg["nodes"], cfg["gpus_per_node"], rate_mbit=rate_mbit,
                                                             delay_ms=delay_ms, prefix=prefix)
    _check_shape(cl, cfg)
    if cl.is_up:
        return _run_in(cl, cfg, threads, nic_fault, run_timeout, grace)
    with cl:
        return _run_in(cl, cfg, threads, nic_fault, run_timeout, grace)


class _NicFault:
    """``on_poll`` of the wait: takes the rank's node off the network once the rank asks for it
    (it creates ``OUTDIR/nic_fault`` at the start of the chosen layer call)."""

    def __init__(self, cl: EmulatedCluster, folder: str, fault: tuple[int, int] | None):
        self.cl, self.flag, self.fault = cl, os.path.join(folder, "nic_fault"), fault
        self.injected = False

    def __call__(self, codes) -> None:
        if self.fault is not None and not self.injected and os.path.exists(self.flag):
            self.cl.node_nics_down(self.fault[0] // self.cl.gpus_per_node)
            self.injected = True

    def context(self) -> str:
        if not self.injected:
            return ""
        return (f"fault injected: the NICs of node {self.fault[0] // self.cl.gpus_per_node} were taken down at "
                f"rank {self.fault[0]}'s layer call {self.fault[1]}")


def _run_in(cl: EmulatedCluster, cfg: dict, threads: int, nic_fault, run_timeout, grace) -> dict:
    from zepp.emulate.nic_bytes import nic_bytes_per_system

    with RankRun("zepp.emulate.worker_rank", cfg, "zepp-emurun-") as run:
        env = thread_env(threads)
        if nic_fault is not None:
            env["ZEPP_EMULATE_NIC_FAULT"] = f"{nic_fault[0]}:{nic_fault[1]}"
        inject = _NicFault(cl, run.folder, nic_fault)
        report = run.wait(cl, args=[run.folder], env=env, timeout=run_timeout, grace=grace, on_poll=inject,
                          poll_s=0.05, context=inject.context)
        counters = []
        for r in range(cl.ranks):
            with open(os.path.join(run.folder, f"counters{r}.json")) as f:
                counters.append(json.load(f))
    report["emulate"] = {"rate_mbit": cl.rate_mbit, "delay_ms": cl.delay_ms, "prefix": cl.prefix,
                         "nodes": cl.nodes, "gpus_per_node": cl.gpus_per_node,
                         "systems": nic_bytes_per_system(cfg, counters, report)}
    return report


def generate_emulated(cfg: dict, cluster: EmulatedCluster, threads: int = 1) -> dict:
    """Run ``cfg`` (a ``zepp.serve.rank`` config) in ``cluster`` (brought up and torn down here)."""
    _check_shape(cluster, cfg)
    env = {**thread_env(threads), "TOKENIZERS_PARALLELISM": "false"}
    with cluster, RankRun("zepp.emulate.serve_rank", cfg, "zepp-generate-emu-") as run:
        report = run.wait(cluster, env=env)
    report["emulate"] = {"rate_mbit": cluster.rate_mbit, "nodes": cfg["nodes"], "gpus_per_node": cfg["gpus_per_node"]}
    return report
