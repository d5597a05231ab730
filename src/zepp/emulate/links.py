"""The links of an emulated cluster: one network namespace per rank, NICs through a switch,
NVLink veths inside a node, routes, and the NICs' shaping.

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
"""

from __future__ import annotations

from zepp.emulate.counters import NIC_IF
from zepp.emulate.host_check import netem_available
from zepp.emulate.iproute import sh
from zepp.errors import EmulationUnavailable

SUBNET = "10.213"  # the project's own range; exists only inside the emulated namespaces
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


def quiet_ipv6(ip: str, ns: str) -> None:
    """Disable IPv6 in ``ns`` before its interfaces exist: otherwise neighbour discovery and MLD
    put a few hundred bytes on every NIC counter that no rank sent."""
    script = "for k in all default; do echo 1 > /proc/sys/net/ipv6/conf/$k/disable_ipv6; done 2>/dev/null; true"
    sh([ip, "netns", "exec", ns, "sh", "-c", script], check=False)


def build_links(cl, ip: str, tc: str) -> None:
    """Namespaces (through ``cl.add_namespace``, which marks each), the switch, every rank's
    shaped NIC and the NVLink veths with their routes, of the ``EmulatedCluster`` ``cl``."""
    R, L = cl.ranks, cl.gpus_per_node
    sw, br = cl.switch_ns, f"{cl.prefix}-br"
    cl.add_namespace(ip, sw)
    quiet_ipv6(ip, sw)
    sh([ip, "-n", sw, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    sh([ip, "-n", sw, "link", "set", br, "mtu", str(cl.nic_mtu), "up"])
    if cl.delay_ms > 0 and not netem_available(sw):
        raise EmulationUnavailable(
            f"delay_ms={cl.delay_ms} needs the netem qdisc, which this kernel lacks "
            "(CONFIG_NET_SCH_NETEM); use delay_ms=0 (the links then carry the real per-message "
            "cost of TCP over veth, see linkcal)")
    for r in range(R):
        ns = cl.netns(r)
        cl.add_namespace(ip, ns)
        quiet_ipv6(ip, ns)
        sh([ip, "-n", ns, "link", "set", "lo", "up"])
        port = cl.switch_port(r)
        sh([ip, "link", "add", NIC_IF, "netns", ns, "mtu", str(cl.nic_mtu), "type", "veth",
            "peer", "name", port, "netns", sw, "mtu", str(cl.nic_mtu)])
        sh([ip, "-n", sw, "link", "set", port, "master", br, "up"])
        sh([ip, "-n", ns, "addr", "add", f"{cl.addr(r)}/16", "dev", NIC_IF])
        sh([ip, "-n", ns, "link", "set", NIC_IF, "up"])
        shape(tc, ns, NIC_IF, cl.rate_mbit, cl.delay_ms, cl.nic_mtu)
        shape(tc, sw, port, cl.rate_mbit, cl.delay_ms, cl.nic_mtu)
    for n in range(cl.nodes):
        for i in range(L):
            for j in range(i + 1, L):
                _nvlink(cl, ip, n * L + i, n * L + j, i, j)


def _nvlink(cl, ip: str, a: int, b: int, i: int, j: int) -> None:
    """The veth between ranks ``a`` (local index ``i``) and ``b`` (``j``) of one node, up, with a
    host route each way."""
    sh([ip, "link", "add", f"nv{j}", "netns", cl.netns(a), "mtu", str(cl.nvlink_mtu),
        "type", "veth", "peer", "name", f"nv{i}", "netns", cl.netns(b), "mtu", str(cl.nvlink_mtu)])
    for src, dst, dev in ((a, b, f"nv{j}"), (b, a, f"nv{i}")):
        sh([ip, "-n", cl.netns(src), "link", "set", dev, "up"])
        sh([ip, "-n", cl.netns(src), "route", "add", f"{cl.addr(dst)}/32", "dev", dev, "src", cl.addr(src)])


def shape(tc: str, ns: str, dev: str, rate_mbit: float, delay_ms: float, nic_mtu: int) -> None:
    """tbf at ``rate_mbit`` on ``dev`` in ``ns`` (and netem ``delay_ms`` under it when positive)."""
    rate_bytes = rate_mbit * 1e6 / 8
    # burst: >= one 64 KB GSO super-packet and ~1 ms at the rate (tbf on hrtimers); the queue
    # holds 100 ms at the rate so an incast of a few senders queues instead of dropping.
    burst = max(65536 + 2 * nic_mtu, int(rate_bytes * 1e-3))
    limit = max(4 * burst, int(rate_bytes * 0.1))
    sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
        "rate", f"{rate_mbit}mbit", "burst", str(burst), "limit", str(limit)])
    if delay_ms > 0:
        sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
            "delay", f"{delay_ms}ms", "limit", "100000"])
