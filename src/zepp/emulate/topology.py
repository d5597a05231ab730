"""An emulated multi-node cluster on one Linux machine: ``EmulatedCluster``.

``nodes`` x ``gpus_per_node`` ranks, one network namespace each, joined by shaped "NIC" links
through a switch namespace and unshaped "NVLink" veths inside a node: the layout, the routes and
the shaping are ``zepp.emulate.links``; whether this machine can build one is
``zepp.emulate.host_check``.

Ownership (``zepp.emulate.ownership``): every namespace carries the cluster's mark and the
cluster has a record under ``/run/zepp``; ``down``/``status`` (``zepp.emulate.inventory``)
touch only marked namespaces of their prefix, ``up`` refuses a prefix that is in use (unless ``replace=True``) and removes only
the leftovers of a run whose launcher is gone. A cluster that belongs to one run
(``keep=False``) is removed when the context exits, at interpreter exit and on SIGTERM
(``zepp.emulate.exit_teardown``), and by the launcher's watchdog after ``kill -9``
(``zepp.launch.processes``).

Running ranks (the interface the runtime launcher uses)::

    with EmulatedCluster(nodes=2, gpus_per_node=2) as cl:      # up on enter, down on exit
        before = cl.counters()
        res = cl.run([sys.executable, "-m", "zepp.emulate.call_rank", ...], timeout=120)
        res.check()                                           # raises RankFailure on failure
        moved = cl.counters() - before                        # LinkCounters, bytes

Each rank process runs via ``ip netns exec zepp-n{n}r{i}`` with the caller's environment plus
``rank_env`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR`` = rank 0's NIC address, ``ZEPP_STORE_FILE``, ``GLOO_SOCKET_IFNAME=nic``,
``ZEPP_EMULATE_PREFIX``) and ``OMP_NUM_THREADS=1`` unless given; a worker joins with
``zepp.runtime.rank_process.init_group``. ``cl.spawn`` is the non-blocking form (a
``zepp.launch.processes.RankGroup``); ``cl.call("module:function", kwargs)`` runs a Python
function in every rank and returns its JSON results per rank.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import zepp.emulate.ownership as own
from zepp.emulate import exit_teardown
from zepp.emulate.counters import NIC_IF, LinkCounters, read_link_counters
from zepp.emulate.host_check import availability
from zepp.emulate.iproute import sh, tool
from zepp.emulate.links import (DEFAULT_NIC_MTU, DEFAULT_NVLINK_MTU, DEFAULT_RATE_MBIT, MAX_DELAY_MS, MAX_RATE_MBIT,
                                SUBNET, build_links)
from zepp.errors import EmulationError, EmulationUnavailable
from zepp.launch.checks import check_number, check_ranks
from zepp.launch.processes import WATCHDOG, RankGroup, RunResult, temp_folder

__all__ = ["EmulatedCluster", "DEFAULT_PREFIX", "DEFAULT_RATE_MBIT", "DEFAULT_NIC_MTU", "DEFAULT_NVLINK_MTU",
           "availability"]

DEFAULT_PREFIX = "zepp"


@dataclass(eq=False)
class EmulatedCluster:
    """``nodes`` x ``gpus_per_node`` ranks in network namespaces; see the module docstring.

    rate_mbit: NIC rate per direction (Mbit/s, tbf). delay_ms: added one-way latency per NIC
    direction (needs sch_netem). keep: leave the cluster up when the context exits / the
    process ends (``zepp cluster up``). replace: ``up`` removes a cluster of the same prefix
    instead of refusing.
    """

    nodes: int
    gpus_per_node: int
    rate_mbit: float = DEFAULT_RATE_MBIT
    delay_ms: float = 0.0
    prefix: str = DEFAULT_PREFIX
    nic_mtu: int = DEFAULT_NIC_MTU
    nvlink_mtu: int = DEFAULT_NVLINK_MTU
    keep: bool = False
    replace: bool = False
    id: str = field(default="", init=False)
    notes: list = field(default_factory=list, init=False, repr=False)  # what `up` cleaned first
    _is_up: bool = field(default=False, init=False, repr=False)
    _spawns: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        # the command-line options' rules and messages (zepp.launch.checks), whoever builds it
        own.check_prefix(self.prefix)
        self.nodes, self.gpus_per_node = check_ranks(self.nodes, self.gpus_per_node)
        self.rate_mbit = float(check_number("--rate-mbit", self.rate_mbit, 0.001, MAX_RATE_MBIT))
        self.delay_ms = float(check_number("--delay-ms", self.delay_ms, 0, MAX_DELAY_MS))
        self.nic_mtu = check_number("--nic-mtu", self.nic_mtu, 576, 65535, integer=True)
        self.nvlink_mtu = check_number("--nvlink-mtu", self.nvlink_mtu, 576, 65535, integer=True)

    # -- names ---------------------------------------------------------------------------------
    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def is_up(self) -> bool:
        """Whether this object's cluster is up (``up`` ran, or ``inventory.attach`` found it) and not down."""
        return self._is_up

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    def netns(self, rank: int) -> str:
        """Namespace of ``rank`` (``{prefix}-n{node}r{local}``)."""
        n, i = divmod(rank, self.gpus_per_node)
        return f"{self.prefix}-n{n}r{i}"

    def namespaces(self) -> list[str]:
        """Every namespace of this cluster: the ranks' then the switch."""
        return [self.netns(r) for r in range(self.ranks)] + [self.switch_ns]

    def addr(self, rank: int) -> str:
        """NIC address of ``rank``: ``10.213.{node}.{local+1}``."""
        n, i = divmod(rank, self.gpus_per_node)
        return f"{SUBNET}.{n}.{i + 1}"

    def switch_port(self, rank: int) -> str:
        """Switch-side end of ``rank``'s NIC (``{prefix}-s{node}r{local}``)."""
        n, i = divmod(rank, self.gpus_per_node)
        return f"{self.prefix}-s{n}r{i}"

    def record(self, state: str) -> dict:
        return {"prefix": self.prefix, "id": self.id, "state": state, "keep": self.keep, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "rate_mbit": self.rate_mbit, "delay_ms": self.delay_ms,
                "nic_mtu": self.nic_mtu, "nvlink_mtu": self.nvlink_mtu, "namespaces": self.namespaces(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **own.owner_fields()}

    def attached(self, cluster_id: str) -> "EmulatedCluster":
        """Mark this object as the running cluster ``cluster_id`` (``inventory.attach``)."""
        self.id, self._is_up = cluster_id, True
        return self

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        if not self.keep:
            self.down()

    def up(self) -> "EmulatedCluster":
        """Create namespaces (each marked), links, routes and shaping. Refuses a prefix in use
        (``EmulationError``) unless ``replace``; removes the leftovers of a dead run first."""
        ok, reason = availability()
        if not ok:
            raise EmulationUnavailable(reason)
        ip, tc = tool("ip"), tool("tc")
        with own.prefix_lock(self.prefix):
            self._claim_prefix()
            self.id = own.new_id()
            if not self.keep:
                exit_teardown.track(self)
                WATCHDOG.add("file", own.record_path(self.prefix))
                WATCHDOG.add("file", own.lock_path(self.prefix))
            own.write_record(self.prefix, self.record("building"))
            self._is_up = True
            try:
                build_links(self, ip, tc)
                own.write_record(self.prefix, self.record("up"))
            except BaseException:
                self._down_locked()
                raise
        return self

    def _claim_prefix(self) -> None:
        sc, rec = own.scan(self.prefix), own.read_record(self.prefix)
        clash = sorted(set(sc.foreign) & set(self.namespaces()))
        if clash:
            raise EmulationError(f"namespace(s) {' '.join(clash)} exist and were not made by zepp (no zepp mark); "
                                 f"remove them yourself or choose another prefix")
        if not sc.owned and rec is None:
            return
        stale = rec is None or (not own.owner_alive(rec) and (not rec.get("keep") or rec.get("state") != "up"))
        if not (stale or self.replace):
            what = (f"{rec.get('nodes')}x{rec.get('gpus_per_node')} ranks, {rec.get('state')}, "
                    f"{'kept by zepp cluster up' if rec.get('keep') else 'owned by the run of pid ' + str(rec.get('owner_pid'))}"
                    f", id {rec.get('id')}") if rec else f"namespaces {' '.join(sc.of(None))}"
            raise EmulationError(f"prefix {self.prefix!r} is in use by an emulated cluster ({what}); run "
                                 f"`zepp cluster down --prefix {self.prefix}` first, or use another prefix")
        removed = own.remove_marked(self.prefix, None)
        own.remove_record(self.prefix)
        self.notes.append(f"removed {'the leftovers of a run that is gone' if stale else 'the cluster it replaces'}"
                          f" ({len(removed)} namespaces)")

    def add_namespace(self, ip: str, ns: str) -> None:
        """Create ``ns`` with this cluster's mark (and, for a cluster of one run, on the watchdog's list)."""
        sh([ip, "netns", "add", ns])
        try:
            own.set_mark(ns, self.prefix, self.id)
        except BaseException:
            sh([ip, "netns", "del", ns], check=False)  # never leave an unmarked namespace behind
            raise
        if not self.keep:
            WATCHDOG.add("netns", ns, mark=own.mark_text(self.prefix, self.id))

    def down(self) -> None:
        """Delete this cluster's namespaces (only those carrying its mark; idempotent)."""
        if not self.id:
            return
        with own.prefix_lock(self.prefix):
            self._down_locked()

    def _down_locked(self) -> None:
        own.remove_marked(self.prefix, self.id)
        own.remove_record(self.prefix, self.id)
        for ns in self.namespaces():
            WATCHDOG.remove("netns", ns)
        WATCHDOG.remove("file", own.record_path(self.prefix))
        WATCHDOG.remove("file", own.lock_path(self.prefix))
        self._is_up = False
        exit_teardown.untrack(self)

    # -- counters ---------------------------------------------------------------------------------
    def counters(self) -> LinkCounters:
        """Current kernel byte counters of every NIC and NVLink veth (one netlink query per rank)."""
        return read_link_counters([self.netns(r) for r in range(self.ranks)], self.gpus_per_node)

    # -- faults ---------------------------------------------------------------------------------
    def set_nic(self, rank: int, up: bool) -> None:
        """Take rank ``rank``'s NIC down (a cable pulled) or back up."""
        sh([tool("ip"), "-n", self.netns(rank), "link", "set", NIC_IF, "up" if up else "down"])

    def node_nics_down(self, node: int) -> None:
        """Take every NIC of ``node`` down: the node drops off the network."""
        for i in range(self.gpus_per_node):
            self.set_nic(node * self.gpus_per_node + i, up=False)

    # -- running ranks ---------------------------------------------------------------------------------
    def rank_env(self, rank: int, store_file: str) -> dict[str, str]:
        """The variables every rank process gets (on top of the caller's environment)."""
        return {
            "RANK": str(rank), "WORLD_SIZE": str(self.ranks),
            "LOCAL_RANK": str(rank % self.gpus_per_node), "LOCAL_WORLD_SIZE": str(self.gpus_per_node),
            "NODE_RANK": str(rank // self.gpus_per_node), "GROUP_RANK": str(rank // self.gpus_per_node),
            "MASTER_ADDR": self.addr(0), "ZEPP_STORE_FILE": store_file,
            "GLOO_SOCKET_IFNAME": NIC_IF, "TP_SOCKET_IFNAME": NIC_IF,
            "ZEPP_EMULATE_PREFIX": self.prefix,
        }

    def spawn(self, argv: Sequence[str] | Callable[[int], Sequence[str]],
              env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
              logdir: str | None = None) -> RankGroup:
        """Start one process per rank inside its namespace; returns at once (a ``RankGroup``).

        argv: the command (or rank -> command). env: extra variables (or rank -> variables),
        applied over ``os.environ``; ``rank_env`` is applied last. Output goes to
        ``logdir/rank{r}.out|err`` (a temp folder when None, removed after ``wait``).
        """
        if not self._is_up:
            raise EmulationError("the emulated cluster is not up; use it as a context manager or call up()")
        ip = tool("ip")
        group_dir = logdir
        if group_dir is None:  # the group removes it after wait (the watchdog if we are killed)
            group_dir = tempfile.mkdtemp(prefix="zepp-emulate-")
            WATCHDOG.add("dir", group_dir)
        self._spawns += 1
        store = os.path.join(group_dir, f"store{self._spawns}")
        cmds, envs = [], []
        for r in range(self.ranks):
            cmds.append([ip, "netns", "exec", self.netns(r), *(argv(r) if callable(argv) else argv)])
            e = dict(os.environ)
            e.setdefault("OMP_NUM_THREADS", "1")
            e.update({k: str(v) for k, v in ((env(r) if callable(env) else env) or {}).items()})
            e.update(self.rank_env(r, store))
            envs.append(e)
        return RankGroup(cmds, envs, group_dir, owns_logdir=logdir is None)

    def run(self, argv, env=None, timeout: float = 120.0, grace: float = 5.0) -> RunResult:
        """``spawn`` then ``wait(timeout, grace)``; does not raise on failure (use ``.check()``)."""
        with self.spawn(argv, env) as group:
            return group.wait(timeout, grace)

    def call(self, target: str, kwargs: Mapping | None = None, timeout: float = 120.0,
             grace: float = 5.0) -> list:
        """Run ``module:function(**kwargs)`` in every rank (``zepp.emulate.call_rank``); returns the
        JSON-serialisable return values, one per rank. Raises RankFailure when a rank fails."""
        with temp_folder("zepp-emulate-call-") as d:
            argv = [sys.executable, "-m", "zepp.emulate.call_rank", target, json.dumps(dict(kwargs or {})), d]
            self.run(argv, timeout=timeout, grace=grace).check()
            out = []
            for r in range(self.ranks):
                with open(os.path.join(d, f"result{r}.json")) as f:
                    out.append(json.load(f))
            return out
