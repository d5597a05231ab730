"""An emulated multi-node cluster on one Linux machine, built from network namespaces.

Layout (prefix ``zepp``, ``N`` nodes of ``L`` ranks, rank ``r = n * L + i``)::

    namespace zepp-n{n}r{i}  (one per rank: its own host view, its own routing table)
        lo                     up; a rank's traffic to itself
        nic   10.213.n.(i+1)/16  the rank's "NIC": veth to the switch, shaped (tbf) both ways
        nv{j}                  one veth per other rank j of the same node: the "NVLink", unshaped
    namespace zepp-sw        (the switch)
        zepp-br                bridge joining the switch-side ends zepp-s{n}r{i} of every NIC

Every rank has exactly one address, its NIC address, which is what gloo advertises
(``GLOO_SOCKET_IFNAME=nic``). A host route ``10.213.n.(j+1)/32 dev nv{j} src <own address>``
sends traffic to a same-node peer over the NVLink veth; everything else follows the /16 route
out of the NIC. Both ends of every TCP connection therefore pick the right link, whoever
initiated it.

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

Nothing is created in the root namespace: interfaces are created directly inside their
namespaces, the address range ``10.213.0.0/16`` exists only inside them, and deleting a
namespace deletes its interfaces. ``down`` (``zepp cluster down``) deletes every namespace
with the prefix, so it also clears the leftovers of a crashed run.

Running ranks (the interface the runtime launcher uses)::

    with EmulatedCluster(nodes=2, gpus_per_node=2) as cl:      # up on enter, down on exit
        before = cl.counters()
        res = cl.run([sys.executable, "-m", "zepp.runtime.worker", ...],
                     env={"EXTRA": "1"}, timeout=120)          # one process per rank
        res.check()                                           # raises RankFailure on failure
        moved = cl.counters() - before                        # LinkCounters, bytes

Each rank process runs via ``ip netns exec zepp-n{n}r{i}`` with the caller's environment
plus ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR`` (rank 0's NIC address), ``MASTER_PORT``, ``GLOO_SOCKET_IFNAME=nic``,
``TP_SOCKET_IFNAME=nic``, ``ZEPP_EMULATE_PREFIX`` and ``OMP_NUM_THREADS=1`` (unless given),
so a worker just calls ``torch.distributed.init_process_group("gloo")``. ``argv`` and ``env``
may also be callables of the rank. ``cl.spawn`` is the non-blocking form (returns
``RankGroup``, whose ``wait`` collects exit codes with a timeout and kills all ranks on
failure); ``cl.call("module:function", kwargs)`` runs a Python function in every rank and
returns its JSON results per rank.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

SUBNET = "10.213"  # the project's own range; exists only inside the emulated namespaces
DEFAULT_PREFIX = "zepp"
NIC_IF = "nic"
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
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")


class EmulationUnavailable(RuntimeError):
    """This machine cannot host the emulated cluster (not root, no netns, missing qdisc)."""


class EmulationError(RuntimeError):
    """A command that builds or inspects the emulated cluster failed."""


class RankFailure(RuntimeError):
    """One or more rank processes failed or timed out; the message carries their output tails."""


def _ip_tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise EmulationUnavailable(f"the emulated cluster needs the `{name}` command (iproute2), which is not installed")
    return path


def _sh(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise EmulationError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def _quiet_ipv6(ip: str, ns: str) -> None:
    """Disable IPv6 in ``ns`` before its interfaces exist: otherwise neighbour discovery and MLD
    put a few hundred bytes on every NIC counter that no rank sent."""
    script = ("for k in all default; do echo 1 > /proc/sys/net/ipv6/conf/$k/disable_ipv6; done 2>/dev/null; "
              "true")
    _sh([ip, "netns", "exec", ns, "sh", "-c", script], check=False)


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
        ip, tc = _ip_tool("ip"), _ip_tool("tc")
    except EmulationUnavailable as exc:
        _AVAILABLE = (False, str(exc))
        return _AVAILABLE
    probe = f"zeppprobe{os.getpid()}"
    try:
        _sh([ip, "netns", "add", probe])
    except (EmulationError, OSError) as exc:
        _AVAILABLE = (False, f"cannot create a network namespace here: {exc}")
        return _AVAILABLE
    try:
        _sh([ip, "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
        _sh([tc, "-n", probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "100mbit",
             "burst", "64kb", "latency", "50ms"])
        _AVAILABLE = (True, "")
    except (EmulationError, OSError) as exc:
        _AVAILABLE = (False, f"network namespaces work but veth or the tbf qdisc do not: {exc}")
    finally:
        _sh([ip, "netns", "del", probe], check=False)
    return _AVAILABLE


def netem_available(ns: str) -> bool:
    """Whether the kernel has ``sch_netem`` (needed for ``delay_ms > 0``), probed inside ``ns``."""
    tc = _ip_tool("tc")
    ok = _sh([tc, "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
    if ok.returncode == 0:
        _sh([tc, "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return ok.returncode == 0


# ---------------------------------------------------------------------------------------------
# counters


@dataclass(frozen=True)
class LinkCounters:
    """Byte counters of the emulated links (kernel interface counters, wire bytes with headers).

    nic_tx [R], nic_rx [R]: bytes sent / received by each rank's NIC.
    nvlink_tx [R, R]: bytes rank i sent to rank j over their NVLink veth (0 across nodes and on
    the diagonal). nic_tx_packets [R]: packets sent by each NIC.
    """

    nic_tx: np.ndarray
    nic_rx: np.ndarray
    nvlink_tx: np.ndarray
    nic_tx_packets: np.ndarray

    def __sub__(self, other: "LinkCounters") -> "LinkCounters":
        return LinkCounters(self.nic_tx - other.nic_tx, self.nic_rx - other.nic_rx,
                            self.nvlink_tx - other.nvlink_tx, self.nic_tx_packets - other.nic_tx_packets)

    def as_dict(self) -> dict:
        return {"nic_tx": self.nic_tx.tolist(), "nic_rx": self.nic_rx.tolist(),
                "nvlink_tx": self.nvlink_tx.tolist(), "nic_tx_packets": self.nic_tx_packets.tolist()}


# ---------------------------------------------------------------------------------------------
# rank processes


@dataclass
class RankResult:
    """Outcome of one rank process."""

    rank: int
    returncode: int | None  # None: still running when killed at the timeout
    stdout: str
    stderr: str
    killed: bool = False


@dataclass
class RunResult:
    """Outcome of all rank processes of one ``run``/``spawn``; ``ok`` when every rank exited 0."""

    ranks: list[RankResult]
    elapsed: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(r.returncode == 0 for r in self.ranks)

    @property
    def returncodes(self) -> list[int | None]:
        return [r.returncode for r in self.ranks]

    def describe(self, tail: int = 1500) -> str:
        lines = [f"ranks exited with {self.returncodes} after {self.elapsed:.1f}s"
                 + (" (timed out, killed)" if self.timed_out else "")]
        for r in self.ranks:
            if r.returncode != 0:
                lines.append(f"--- rank {r.rank} (exit {r.returncode}{', killed' if r.killed else ''}) stderr tail:")
                lines.append(r.stderr[-tail:].rstrip())
        return "\n".join(lines)

    def check(self) -> "RunResult":
        if not self.ok:
            raise RankFailure(self.describe())
        return self


class RankGroup:
    """Running rank processes (one per rank, each in its own session so it can be killed whole)."""

    def __init__(self, procs: list[subprocess.Popen], logdir: str, owns_logdir: bool):
        self.procs = procs
        self.logdir = logdir
        self._owns_logdir = owns_logdir
        self._t0 = time.monotonic()
        self._result: RunResult | None = None
        _LIVE_GROUPS.add(self)

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to rank ``rank``'s process group (a fault: a rank dies)."""
        p = self.procs[rank]
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self) -> None:
        for r in range(len(self.procs)):
            self.kill(r)

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def wait(self, timeout: float, grace: float = 5.0) -> RunResult:
        """Wait for every rank; kill all at ``timeout`` seconds after start, or ``grace`` seconds
        after the first rank failed (the others get that long to end with their own error)."""
        if self._result is not None:
            return self._result
        deadline = self._t0 + timeout
        timed_out = False
        killed: set[int] = set()
        while True:
            codes = self.poll()
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if any(c not in (None, 0) for c in codes):
                deadline = min(deadline, now + grace)
                grace = float("inf")  # only the first failure sets the deadline
            if now >= deadline:
                timed_out = any(c is None for c in codes) and not any(c not in (None, 0) for c in codes)
                for r, c in enumerate(codes):
                    if c is None:
                        killed.add(r)
                        self.kill(r)
                for p in self.procs:
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                break
            time.sleep(0.02)
        ranks = []
        for r, p in enumerate(self.procs):
            out = _read(os.path.join(self.logdir, f"rank{r}.out"))
            err = _read(os.path.join(self.logdir, f"rank{r}.err"))
            ranks.append(RankResult(r, p.poll(), out, err, killed=r in killed))
        self._result = RunResult(ranks, time.monotonic() - self._t0, timed_out)
        _LIVE_GROUPS.discard(self)
        if self._owns_logdir:
            shutil.rmtree(self.logdir, ignore_errors=True)
        return self._result


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# teardown on exit and signals


_LIVE_CLUSTERS: "weakref.WeakSet[EmulatedCluster]" = weakref.WeakSet()
_LIVE_GROUPS: "weakref.WeakSet[RankGroup]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False


def _teardown_all() -> None:
    for g in list(_LIVE_GROUPS):
        g.kill_all()
    for c in list(_LIVE_CLUSTERS):
        try:
            c.down()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _on_signal(signum, frame):  # noqa: ARG001
    _teardown_all()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_PREVIOUS_HANDLERS: dict[int, object] = {}


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(_teardown_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            _PREVIOUS_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)
    _HANDLERS_INSTALLED = True


# ---------------------------------------------------------------------------------------------
# the cluster


@dataclass(eq=False)
class EmulatedCluster:
    """``nodes`` x ``gpus_per_node`` ranks in network namespaces; see the module docstring.

    rate_mbit: NIC rate per direction (Mbit/s, tbf). delay_ms: added one-way latency per NIC
    direction (needs sch_netem). keep: leave the cluster up when the context exits / the
    process ends (``zepp cluster up``).
    """

    nodes: int
    gpus_per_node: int
    rate_mbit: float = DEFAULT_RATE_MBIT
    delay_ms: float = 0.0
    prefix: str = DEFAULT_PREFIX
    nic_mtu: int = DEFAULT_NIC_MTU
    nvlink_mtu: int = DEFAULT_NVLINK_MTU
    keep: bool = False
    _is_up: bool = field(default=False, init=False, repr=False)
    _port: int = field(default=29400, init=False, repr=False)

    def __post_init__(self) -> None:
        from zepp.errors import ZeppInputError

        if not _PREFIX_RE.match(self.prefix):
            raise ZeppInputError(f"emulated cluster prefix {self.prefix!r}: use 1-6 lowercase letters/digits, "
                                 "starting with a letter (it goes into interface names of at most 15 characters)")
        if not (1 <= int(self.nodes) <= 200 and int(self.nodes) == self.nodes):
            raise ZeppInputError(f"emulated cluster nodes={self.nodes!r}: use an integer in 1..200")
        if not (1 <= int(self.gpus_per_node) <= 64 and int(self.gpus_per_node) == self.gpus_per_node):
            raise ZeppInputError(f"emulated cluster gpus_per_node={self.gpus_per_node!r}: use an integer in 1..64")
        if not self.rate_mbit > 0:
            raise ZeppInputError(f"emulated cluster rate_mbit={self.rate_mbit!r}: must be positive")
        if self.delay_ms < 0:
            raise ZeppInputError(f"emulated cluster delay_ms={self.delay_ms!r}: must be >= 0")
        self.nodes, self.gpus_per_node = int(self.nodes), int(self.gpus_per_node)

    # -- names ---------------------------------------------------------------------------------
    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    def netns(self, rank: int) -> str:
        """Namespace of ``rank`` (``{prefix}-n{node}r{local}``)."""
        n, i = divmod(rank, self.gpus_per_node)
        return f"{self.prefix}-n{n}r{i}"

    def addr(self, rank: int) -> str:
        """NIC address of ``rank``: ``10.213.{node}.{local+1}``."""
        n, i = divmod(rank, self.gpus_per_node)
        return f"{SUBNET}.{n}.{i + 1}"

    def _switch_port(self, rank: int) -> str:
        n, i = divmod(rank, self.gpus_per_node)
        return f"{self.prefix}-s{n}r{i}"

    @classmethod
    def existing(cls, prefix: str = DEFAULT_PREFIX) -> "EmulatedCluster":
        """The cluster ``zepp cluster up --prefix prefix`` left running (shape and rate read back
        from the namespaces); ``keep=True``, so leaving a context does not remove it."""
        st = status(prefix)
        if not st["ranks"] or not st["switch"]:
            raise EmulationError(f"no emulated cluster with prefix {prefix!r} is up (zepp cluster up --prefix {prefix})")
        nodes = 1 + max(e["node"] for e in st["ranks"])
        L = 1 + max(e["local"] for e in st["ranks"])
        if len(st["ranks"]) != nodes * L:
            raise EmulationError(f"emulated cluster {prefix!r} is incomplete ({len(st['ranks'])} of {nodes}x{L} "
                                 f"rank namespaces); run zepp cluster down --prefix {prefix} and up again")
        m = re.search(r"rate (\d+(?:\.\d+)?)([KMG]?)bit", st["ranks"][0]["qdisc"] or "")
        rate = float(m[1]) * {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}[m[2]] if m else DEFAULT_RATE_MBIT
        cl = cls(nodes, L, rate_mbit=rate, prefix=prefix, keep=True)
        cl._is_up = True
        return cl

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        if not self.keep:
            self.down()

    def up(self) -> "EmulatedCluster":
        """Create namespaces, links, routes and shaping. Removes leftovers with the same prefix first."""
        ok, reason = availability()
        if not ok:
            raise EmulationUnavailable(reason)
        ip, tc = _ip_tool("ip"), _ip_tool("tc")
        if not self.keep:
            _install_handlers()
            _LIVE_CLUSTERS.add(self)
        down(self.prefix)
        self._is_up = True
        try:
            self._build(ip, tc)
        except BaseException:
            self.down()
            raise
        return self

    def _build(self, ip: str, tc: str) -> None:
        R, L = self.ranks, self.gpus_per_node
        sw, br = self.switch_ns, f"{self.prefix}-br"
        _sh([ip, "netns", "add", sw])
        _quiet_ipv6(ip, sw)
        _sh([ip, "-n", sw, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        _sh([ip, "-n", sw, "link", "set", br, "mtu", str(self.nic_mtu), "up"])
        if self.delay_ms > 0 and not netem_available(sw):
            raise EmulationUnavailable(
                f"delay_ms={self.delay_ms} needs the netem qdisc, which this kernel lacks "
                "(CONFIG_NET_SCH_NETEM); use delay_ms=0 (the links then carry the real per-message "
                "cost of TCP over veth, see linkcal)")
        for r in range(R):
            ns = self.netns(r)
            _sh([ip, "netns", "add", ns])
            _quiet_ipv6(ip, ns)
            _sh([ip, "-n", ns, "link", "set", "lo", "up"])
            port = self._switch_port(r)
            _sh([ip, "link", "add", NIC_IF, "netns", ns, "mtu", str(self.nic_mtu), "type", "veth",
                 "peer", "name", port, "netns", sw, "mtu", str(self.nic_mtu)])
            _sh([ip, "-n", sw, "link", "set", port, "master", br, "up"])
            _sh([ip, "-n", ns, "addr", "add", f"{self.addr(r)}/16", "dev", NIC_IF])
            _sh([ip, "-n", ns, "link", "set", NIC_IF, "up"])
            self._shape(tc, ns, NIC_IF)
            self._shape(tc, sw, port)
        for n in range(self.nodes):
            for i in range(L):
                for j in range(i + 1, L):
                    a, b = n * L + i, n * L + j
                    _sh([ip, "link", "add", f"nv{j}", "netns", self.netns(a), "mtu", str(self.nvlink_mtu),
                         "type", "veth", "peer", "name", f"nv{i}", "netns", self.netns(b),
                         "mtu", str(self.nvlink_mtu)])
                    for src, dst, dev in ((a, b, f"nv{j}"), (b, a, f"nv{i}")):
                        _sh([ip, "-n", self.netns(src), "link", "set", dev, "up"])
                        _sh([ip, "-n", self.netns(src), "route", "add", f"{self.addr(dst)}/32", "dev", dev,
                             "src", self.addr(src)])

    def _shape(self, tc: str, ns: str, dev: str) -> None:
        rate_bytes = self.rate_mbit * 1e6 / 8
        # burst: >= one 64 KB GSO super-packet and ~1 ms at the rate (tbf on hrtimers); the queue
        # holds 100 ms at the rate so an incast of a few senders queues instead of dropping.
        burst = max(65536 + 2 * self.nic_mtu, int(rate_bytes * 1e-3))
        limit = max(4 * burst, int(rate_bytes * 0.1))
        _sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
             "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "limit", str(limit)])
        if self.delay_ms > 0:
            _sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                 "delay", f"{self.delay_ms}ms", "limit", "100000"])

    def down(self) -> None:
        """Delete everything this cluster's prefix owns (idempotent)."""
        down(self.prefix)
        self._is_up = False
        _LIVE_CLUSTERS.discard(self)

    # -- counters ---------------------------------------------------------------------------------
    def counters(self) -> LinkCounters:
        """Current kernel byte counters of every NIC and NVLink veth (one netlink query per rank)."""
        R, L = self.ranks, self.gpus_per_node
        ip = _ip_tool("ip")
        tx, rx, pk = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
        nv = np.zeros((R, R), np.int64)
        for r in range(R):
            links = json.loads(_sh([ip, "-j", "-s", "-n", self.netns(r), "link", "show"]).stdout)
            node = r // L
            for link in links:
                name, st = link["ifname"], link.get("stats64", {})
                if name == NIC_IF:
                    tx[r], rx[r], pk[r] = st["tx"]["bytes"], st["rx"]["bytes"], st["tx"]["packets"]
                elif name.startswith("nv"):
                    nv[r, node * L + int(name[2:])] = st["tx"]["bytes"]
        return LinkCounters(tx, rx, nv, pk)

    # -- faults ---------------------------------------------------------------------------------
    def set_nic(self, rank: int, up: bool) -> None:
        """Take rank ``rank``'s NIC down (a cable pulled) or back up."""
        _sh([_ip_tool("ip"), "-n", self.netns(rank), "link", "set", NIC_IF, "up" if up else "down"])

    def node_nics_down(self, node: int) -> None:
        """Take every NIC of ``node`` down: the node drops off the network."""
        for i in range(self.gpus_per_node):
            self.set_nic(node * self.gpus_per_node + i, up=False)

    # -- running ranks ---------------------------------------------------------------------------------
    def rank_env(self, rank: int, master_port: int) -> dict[str, str]:
        """The variables every rank process gets (on top of the caller's environment)."""
        return {
            "RANK": str(rank), "WORLD_SIZE": str(self.ranks),
            "LOCAL_RANK": str(rank % self.gpus_per_node), "LOCAL_WORLD_SIZE": str(self.gpus_per_node),
            "NODE_RANK": str(rank // self.gpus_per_node), "GROUP_RANK": str(rank // self.gpus_per_node),
            "MASTER_ADDR": self.addr(0), "MASTER_PORT": str(master_port),
            "GLOO_SOCKET_IFNAME": NIC_IF, "TP_SOCKET_IFNAME": NIC_IF,
            "ZEPP_EMULATE_PREFIX": self.prefix,
        }

    def spawn(self, argv: Sequence[str] | Callable[[int], Sequence[str]],
              env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
              master_port: int | None = None, logdir: str | None = None) -> RankGroup:
        """Start one process per rank inside its namespace; returns at once (see ``RankGroup``).

        argv: the command (or rank -> command). env: extra variables (or rank -> variables),
        applied over ``os.environ``; ``rank_env`` is applied last. Output goes to
        ``logdir/rank{r}.out|err`` (a temporary directory when None, removed after ``wait``).
        """
        if not self._is_up:
            raise EmulationError("the emulated cluster is not up; use it as a context manager or call up()")
        ip = _ip_tool("ip")
        if master_port is None:
            self._port = 29400 + (self._port - 29400 + 1) % 500
            master_port = self._port
        owns = logdir is None
        logdir = logdir or tempfile.mkdtemp(prefix="zepp-emulate-")
        os.makedirs(logdir, exist_ok=True)
        procs = []
        for r in range(self.ranks):
            cmd = list(argv(r) if callable(argv) else argv)
            e = dict(os.environ)
            e.setdefault("OMP_NUM_THREADS", "1")
            e.update({k: str(v) for k, v in ((env(r) if callable(env) else env) or {}).items()})
            e.update(self.rank_env(r, master_port))
            with open(os.path.join(logdir, f"rank{r}.out"), "w") as out, \
                    open(os.path.join(logdir, f"rank{r}.err"), "w") as err:
                procs.append(subprocess.Popen([ip, "netns", "exec", self.netns(r), *cmd], env=e,
                                              stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        return RankGroup(procs, logdir, owns)

    def run(self, argv, env=None, timeout: float = 120.0, grace: float = 5.0,
            master_port: int | None = None) -> RunResult:
        """``spawn`` then ``wait(timeout, grace)``; does not raise on failure (use ``.check()``)."""
        return self.spawn(argv, env, master_port).wait(timeout, grace)

    def call(self, target: str, kwargs: Mapping | None = None, timeout: float = 120.0,
             grace: float = 5.0) -> list:
        """Run ``module:function(**kwargs)`` in every rank (``zepp.emulate.rankmain``); returns the
        JSON-serialisable return values, one per rank. Raises RankFailure when a rank fails."""
        with tempfile.TemporaryDirectory(prefix="zepp-emulate-call-") as d:
            argv = [sys.executable, "-m", "zepp.emulate.rankmain", target, json.dumps(dict(kwargs or {})), d]
            self.run(argv, timeout=timeout, grace=grace).check()
            out = []
            for r in range(self.ranks):
                with open(os.path.join(d, f"result{r}.json")) as f:
                    out.append(json.load(f))
            return out


# ---------------------------------------------------------------------------------------------
# module-level inspection (used by the CLI)


def list_namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Namespaces whose name starts with ``{prefix}-`` (sorted)."""
    ip = _ip_tool("ip")
    proc = _sh([ip, "-j", "netns", "list"], check=False)
    try:
        names = [e["name"] for e in json.loads(proc.stdout or "[]")]
    except (ValueError, KeyError):
        names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(f"{prefix}-"))


def down(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Kill any process left inside a namespace ``{prefix}-*``, then delete those namespaces
    (their interfaces go with them). Returns the names."""
    if os.geteuid() != 0:
        raise EmulationUnavailable("removing the emulated cluster needs root")
    ip = _ip_tool("ip")
    names = list_namespaces(prefix)
    for ns in names:
        # rank processes orphaned by a crashed launcher still run in there: end them by pid
        for pid in _sh([ip, "netns", "pids", ns], check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _sh([ip, "netns", "del", ns], check=False)
    left = list_namespaces(prefix)
    if left:
        raise EmulationError(f"could not delete namespaces {left}")
    return names


_RANK_NS_RE = re.compile(r"^(?P<p>[a-z][a-z0-9]*)-n(?P<n>\d+)r(?P<i>\d+)$")


def status(prefix: str = DEFAULT_PREFIX) -> dict:
    """What exists for ``prefix``: per rank namespace its NIC address, shaping and counters.

    Returns ``{"namespaces": [...], "ranks": [{"netns", "node", "local", "addr", "state",
    "qdisc", "tx_bytes", "rx_bytes", "nvlinks"}], "switch": bool}``.
    """
    ip, tc = _ip_tool("ip"), _ip_tool("tc")
    names = list_namespaces(prefix)
    ranks = []
    for ns in names:
        m = _RANK_NS_RE.match(ns)
        if not m or m["p"] != prefix:
            continue
        entry = {"netns": ns, "node": int(m["n"]), "local": int(m["i"]), "addr": None, "state": None,
                 "qdisc": None, "tx_bytes": None, "rx_bytes": None, "nvlinks": []}
        links = json.loads(_sh([ip, "-j", "-s", "-n", ns, "addr", "show"], check=False).stdout or "[]")
        stats = json.loads(_sh([ip, "-j", "-s", "-n", ns, "link", "show"], check=False).stdout or "[]")
        for link in links:
            if link.get("ifname") == NIC_IF:
                entry["state"] = link.get("operstate")
                for a in link.get("addr_info", []):
                    if a.get("family") == "inet":
                        entry["addr"] = f"{a['local']}/{a['prefixlen']}"
            elif link.get("ifname", "").startswith("nv"):
                entry["nvlinks"].append(link["ifname"])
        for link in stats:
            if link.get("ifname") == NIC_IF:
                entry["tx_bytes"] = link["stats64"]["tx"]["bytes"]
                entry["rx_bytes"] = link["stats64"]["rx"]["bytes"]
        q = _sh([tc, "-n", ns, "qdisc", "show", "dev", NIC_IF], check=False).stdout.strip()
        entry["qdisc"] = " | ".join(line.strip() for line in q.splitlines()) or None
        ranks.append(entry)
    ranks.sort(key=lambda e: (e["node"], e["local"]))
    return {"namespaces": names, "ranks": ranks, "switch": f"{prefix}-sw" in names}
