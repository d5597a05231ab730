"""An emulated multi-node cluster on one Linux machine: network namespaces, links, shaping.

Layout (prefix ``zepp``, ``N`` nodes of ``L`` ranks, rank ``r = n * L + i``)::

    namespace zepp-n{n}r{i}  (one per rank: its own host view, its own routing table)
        lo                     up; a rank's traffic to itself; its alias is the ownership mark
        nic   10.213.n.(i+1)/16  the rank's "NIC": veth to the switch, shaped (tbf) both ways
        nv{j}                  one veth per other rank j of the same node: the "NVLink", unshaped
    namespace zepp-sw        (the switch)
        zepp-br                bridge joining the switch-side ends zepp-s{n}r{i} of every NIC

Every rank has exactly one address, its NIC address, which is what gloo advertises and binds
(``GLOO_SOCKET_IFNAME=nic``). A host route ``10.213.n.(j+1)/32 dev nv{j} src <own address>``
sends traffic to a same-node peer over the NVLink veth; everything else follows the /16 route
out of the NIC. Both ends of every TCP connection therefore pick the right link, whoever
initiated it. The ranks rendezvous through a file (``torch.distributed.FileStore``), so no
rank listens for the rendezvous at all, and nothing listens in the root namespace.

Why one namespace per rank and not one per node: gloo does not bind the source address of
the connections it initiates (checked with ``ss -tn``: in a node namespace with one NIC
address per rank, both ranks' outgoing connections left through the node's first NIC, the
second NIC carried 586 bytes). Source routing cannot fix that, since the kernel chooses the
source before it knows the process. With a namespace per rank each rank's routing table is its
own. The price: same-node ranks talk over a veth pair instead of the loopback device, which
measured (interleaved, loaded 2-core machine) ~200 us against ~100 us small-message latency and
0.7-1.7 GB/s against 1.0-4.2 GB/s for 1-8 MB messages, i.e. up to ~2x slower, still 6-14x the
default NIC. In return the veth counters give the intra-node byte matrix per pair.

Shaping: ``tbf`` on the rank-side ``nic`` (egress of the NIC) and on the switch-side
``zepp-s{n}r{i}`` (its egress is the NIC's ingress), at ``rate_mbit`` each way. Added latency
needs ``sch_netem``; kernels without it (like the one this was developed on) support
``delay_ms=0`` only and say so.

Ownership (``zepp.emulate.ownership``): every namespace carries the cluster's mark and the
cluster has a record under ``/run/zepp``; ``down``/``status`` (``zepp.emulate.inventory``)
touch only marked namespaces of their prefix, ``up`` refuses a prefix that is in use (unless ``replace=True``) and removes only
the leftovers of a run whose launcher is gone. A cluster that belongs to one run
(``keep=False``) is removed when the context exits, at interpreter exit, on SIGTERM (before the
process dies of it, unless the process has its own handler, as ``zepp run`` has: then its
``with`` blocks remove it), and by the launcher's watchdog after ``kill -9``
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

import atexit
import json
import os
import signal
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import zepp.emulate.ownership as own
from zepp.emulate.counters import NIC_IF, LinkCounters, read_link_counters
from zepp.emulate.iproute import sh, tool
from zepp.launch.checks import check_number, check_ranks
from zepp.launch.processes import WATCHDOG, RankGroup, RunResult, temp_folder
from zepp.errors import EmulationError, EmulationUnavailable

SUBNET = "10.213"  # the project's own range; exists only inside the emulated namespaces
DEFAULT_PREFIX = "zepp"
# Defaults, measured in benchmarks/results/emulate_links.md (2 cores, shared and loaded, load
# average 6-8): gloo between two ranks streams 1-8 MB messages at 1.0-4.2 GB/s over loopback and
# 0.3-1.7 GB/s over an unshaped veth (our NVLink), swinging 2-3x with machine load. At 1000 Mbit/s
# (~123 MB/s of payload per direction) the NIC is ~8-30x slower than loopback and ~3-14x slower
# than the NVLink veth, and a 2x2 all-to-all of 1 MB per peer takes 1.9-2.9x as long as
# unshaped. At 2000 Mbit/s the loaded CPU, not the NIC, sets the all-to-all time (1.0-1.4x), so
# NIC bytes would barely show in wall-clock; at 500 Mbit/s runs get slow (4-6x) for no new insight.
# MTU 9000 on both (jumbo frames: fewer packets per byte for a CPU-bound machine; 65520 on the
# veth measured no better).
DEFAULT_RATE_MBIT = 1000.0
DEFAULT_NIC_MTU = 9000
DEFAULT_NVLINK_MTU = 9000
MAX_RATE_MBIT = 100_000.0  # 100 Gbit/s: far beyond what veth carries here; tbf's own limit is higher
MAX_DELAY_MS = 10_000.0


def _quiet_ipv6(ip: str, ns: str) -> None:
    """Disable IPv6 in ``ns`` before its interfaces exist: otherwise neighbour discovery and MLD
    put a few hundred bytes on every NIC counter that no rank sent."""
    script = "for k in all default; do echo 1 > /proc/sys/net/ipv6/conf/$k/disable_ipv6; done 2>/dev/null; true"
    sh([ip, "netns", "exec", ns, "sh", "-c", script], check=False)


# ---------------------------------------------------------------------------------------------
# availability


_AVAILABLE: tuple[bool, str] | None = None


def availability() -> tuple[bool, str]:
    """``(ok, reason)``: can this process build an emulated cluster? Probed once and cached.

    Needs root, the ``ip``/``tc`` tools, network namespaces, veth pairs and the tbf qdisc.
    """
    global _AVAILABLE
    if _AVAILABLE is not None:
        return _AVAILABLE
    if not sys.platform.startswith("linux"):
        _AVAILABLE = (False, "the emulated cluster needs Linux network namespaces")
        return _AVAILABLE
    if os.geteuid() != 0:
        _AVAILABLE = (False, "the emulated cluster needs root (network namespaces, veth, tc); run as root")
        return _AVAILABLE
    try:
        ip, tc = tool("ip"), tool("tc")
    except EmulationUnavailable as exc:
        _AVAILABLE = (False, str(exc))
        return _AVAILABLE
    probe = f"zeppprobe{os.getpid()}"
    try:
        sh([ip, "netns", "add", probe])
    except (EmulationError, OSError) as exc:
        _AVAILABLE = (False, f"cannot create a network namespace here: {exc}")
        return _AVAILABLE
    try:
        sh([ip, "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
        sh([tc, "-n", probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "100mbit",
            "burst", "64kb", "latency", "50ms"])
        _AVAILABLE = (True, "")
    except (EmulationError, OSError) as exc:
        _AVAILABLE = (False, f"network namespaces work but veth or the tbf qdisc do not: {exc}")
    finally:
        sh([ip, "netns", "del", probe], check=False)
    return _AVAILABLE


def netem_available(ns: str) -> bool:
    """Whether the kernel has ``sch_netem`` (needed for ``delay_ms > 0``), probed inside ``ns``."""
    tc = tool("tc")
    ok = sh([tc, "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
    if ok.returncode == 0:
        sh([tc, "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return ok.returncode == 0


# ---------------------------------------------------------------------------------------------
# teardown at exit and on SIGTERM (clusters of one run)


_LIVE_CLUSTERS: "weakref.WeakSet[EmulatedCluster]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False


def _teardown_all() -> None:
    for c in list(_LIVE_CLUSTERS):
        try:
            c.down()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM in a process that did not choose its own handler: remove this process's clusters,
    then die of the signal as it would have (a host such as pytest must not survive it by
    catching a SystemExit); its watchdog removes its temp folders. Launchers that want their
    ``finally`` blocks to run install ``zepp.launch.processes.launcher_signals`` instead."""
    _teardown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(_teardown_all)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)
    _HANDLERS_INSTALLED = True


# ---------------------------------------------------------------------------------------------
# the cluster


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

    def _switch_port(self, rank: int) -> str:
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
                _install_handlers()
                _LIVE_CLUSTERS.add(self)
                WATCHDOG.add("file", own.record_path(self.prefix))
                WATCHDOG.add("file", own.lock_path(self.prefix))
            own.write_record(self.prefix, self.record("building"))
            self._is_up = True
            try:
                self._build(ip, tc)
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

    def _add_ns(self, ip: str, ns: str) -> None:
        sh([ip, "netns", "add", ns])
        try:
            own.set_mark(ns, self.prefix, self.id)
        except BaseException:
            sh([ip, "netns", "del", ns], check=False)  # never leave an unmarked namespace behind
            raise
        if not self.keep:
            WATCHDOG.add("netns", ns, mark=own.mark_text(self.prefix, self.id))

    def _build(self, ip: str, tc: str) -> None:
        R, L = self.ranks, self.gpus_per_node
        sw, br = self.switch_ns, f"{self.prefix}-br"
        self._add_ns(ip, sw)
        _quiet_ipv6(ip, sw)
        sh([ip, "-n", sw, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        sh([ip, "-n", sw, "link", "set", br, "mtu", str(self.nic_mtu), "up"])
        if self.delay_ms > 0 and not netem_available(sw):
            raise EmulationUnavailable(
                f"delay_ms={self.delay_ms} needs the netem qdisc, which this kernel lacks "
                "(CONFIG_NET_SCH_NETEM); use delay_ms=0 (the links then carry the real per-message "
                "cost of TCP over veth, see linkcal)")
        for r in range(R):
            ns = self.netns(r)
            self._add_ns(ip, ns)
            _quiet_ipv6(ip, ns)
            sh([ip, "-n", ns, "link", "set", "lo", "up"])
            port = self._switch_port(r)
            sh([ip, "link", "add", NIC_IF, "netns", ns, "mtu", str(self.nic_mtu), "type", "veth",
                "peer", "name", port, "netns", sw, "mtu", str(self.nic_mtu)])
            sh([ip, "-n", sw, "link", "set", port, "master", br, "up"])
            sh([ip, "-n", ns, "addr", "add", f"{self.addr(r)}/16", "dev", NIC_IF])
            sh([ip, "-n", ns, "link", "set", NIC_IF, "up"])
            self._shape(tc, ns, NIC_IF)
            self._shape(tc, sw, port)
        for n in range(self.nodes):
            for i in range(L):
                for j in range(i + 1, L):
                    a, b = n * L + i, n * L + j
                    sh([ip, "link", "add", f"nv{j}", "netns", self.netns(a), "mtu", str(self.nvlink_mtu),
                        "type", "veth", "peer", "name", f"nv{i}", "netns", self.netns(b),
                        "mtu", str(self.nvlink_mtu)])
                    for src, dst, dev in ((a, b, f"nv{j}"), (b, a, f"nv{i}")):
                        sh([ip, "-n", self.netns(src), "link", "set", dev, "up"])
                        sh([ip, "-n", self.netns(src), "route", "add", f"{self.addr(dst)}/32", "dev", dev,
                            "src", self.addr(src)])

    def _shape(self, tc: str, ns: str, dev: str) -> None:
        rate_bytes = self.rate_mbit * 1e6 / 8
        # burst: >= one 64 KB GSO super-packet and ~1 ms at the rate (tbf on hrtimers); the queue
        # holds 100 ms at the rate so an incast of a few senders queues instead of dropping.
        burst = max(65536 + 2 * self.nic_mtu, int(rate_bytes * 1e-3))
        limit = max(4 * burst, int(rate_bytes * 0.1))
        sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
            "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "limit", str(limit)])
        if self.delay_ms > 0:
            sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                "delay", f"{self.delay_ms}ms", "limit", "100000"])

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
        _LIVE_CLUSTERS.discard(self)

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
