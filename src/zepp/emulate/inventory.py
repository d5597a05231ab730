"""What exists of the emulated clusters of a prefix, and removing it: ``status``, ``down``,
``list_namespaces`` and ``attach`` (a running cluster made by ``zepp cluster up``).

Only namespaces carrying zepp's mark for the prefix count (``zepp.emulate.ownership``); the
others with the prefix are reported as skipped and left alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import zepp.emulate.ownership as own
from zepp.emulate.counters import NIC_IF
from zepp.emulate.iproute import sh, tool
from zepp.emulate.topology import DEFAULT_PREFIX, EmulatedCluster
from zepp.errors import EmulationError, EmulationUnavailable


def list_namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """zepp's namespaces of ``prefix`` (those carrying a mark naming it), sorted."""
    return own.scan(prefix).of(None)


@dataclass
class DownResult:
    """What ``down`` removed, and the namespaces with the prefix it left alone (not zepp's)."""

    removed: list[str]
    skipped: list[str]


def down(prefix: str = DEFAULT_PREFIX, cluster_id: str | None = None) -> DownResult:
    """Remove zepp's emulated cluster(s) of ``prefix``: kill the processes left inside its
    marked namespaces, delete those namespaces and the record. Namespaces with the prefix that
    are not zepp's (no mark, or, with ``cluster_id``, another cluster's) are left alone."""
    own.check_prefix(prefix)
    if os.geteuid() != 0:
        raise EmulationUnavailable("removing the emulated cluster needs root")
    with own.prefix_lock(prefix):
        sc = own.scan(prefix)
        removed = own.remove_marked(prefix, cluster_id)
        own.remove_record(prefix, cluster_id)
    skipped = sc.foreign + [ns for ns in sc.of(None) if ns not in removed]
    return DownResult(removed, sorted(skipped))


def _rank_entry(ip: str, tc: str, ns: str, node: int, local: int) -> dict:
    entry = {"netns": ns, "node": node, "local": local, "addr": None, "state": None, "qdisc": None,
             "tx_bytes": None, "rx_bytes": None, "nvlinks": []}
    links = json.loads(sh([ip, "-j", "-s", "-n", ns, "addr", "show"], check=False).stdout or "[]")
    stats = json.loads(sh([ip, "-j", "-s", "-n", ns, "link", "show"], check=False).stdout or "[]")
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
    q = sh([tc, "-n", ns, "qdisc", "show", "dev", NIC_IF], check=False).stdout.strip()
    entry["qdisc"] = " | ".join(line.strip() for line in q.splitlines()) or None
    return entry


def status(prefix: str = DEFAULT_PREFIX) -> dict:
    """What exists for ``prefix``, and whether it is a complete cluster.

    Returns ``{"prefix", "record" (dict or None), "namespaces" (zepp's), "skipped" (others with
    the prefix), "ranks": [{"netns", "node", "local", "addr", "state", "qdisc", "tx_bytes",
    "rx_bytes", "nvlinks"}], "switch": bool, "complete": bool, "problems": [str]}``. Complete
    means: a record in state ``up``, every namespace of its shape present with its mark, every
    NIC with its address and shaping, every NVLink veth present.
    """
    ip, tc = tool("ip"), tool("tc")
    sc, rec = own.scan(prefix), own.read_record(prefix)
    names = sc.of(None)
    problems: list[str] = []
    ranks = []
    for ns in names:
        rest = ns[len(prefix) + 1:]
        if rest.startswith("n") and "r" in rest:
            n, _, i = rest[1:].partition("r")
            if n.isdigit() and i.isdigit():
                ranks.append(_rank_entry(ip, tc, ns, int(n), int(i)))
    ranks.sort(key=lambda e: (e["node"], e["local"]))
    if rec is None:
        if names:
            problems.append("no record of the cluster (made by a crashed or older zepp)")
    else:
        if rec.get("state") != "up":
            who = ("being built by pid " + str(rec.get("owner_pid"))) if own.owner_alive(rec) else \
                "half-built: the process that was building it is gone"
            problems.append(f"state {rec.get('state')!r} ({who})")
        if len(sc.ids) > 1 or (sc.ids and sc.ids != [rec.get("id")]):
            problems.append(f"namespaces of other clusters with this prefix: ids {', '.join(sc.ids)}")
        want = EmulatedCluster(rec["nodes"], rec["gpus_per_node"], prefix=prefix)
        missing = [ns for ns in want.namespaces() if sc.owned.get(ns) != rec.get("id")]
        if missing:
            problems.append(f"missing namespaces: {' '.join(missing)}")
        by_ns = {e["netns"]: e for e in ranks}
        for r in range(want.ranks):
            e = by_ns.get(want.netns(r))
            if e is None:
                continue
            if e["addr"] != f"{want.addr(r)}/16":
                problems.append(f"{e['netns']}: NIC address {e['addr']} (expected {want.addr(r)}/16)")
            if not e["qdisc"] or "tbf" not in e["qdisc"]:
                problems.append(f"{e['netns']}: NIC not shaped")
            if len(e["nvlinks"]) != want.gpus_per_node - 1:
                problems.append(f"{e['netns']}: {len(e['nvlinks'])} of {want.gpus_per_node - 1} NVLink veths")
    complete = rec is not None and not problems
    return {"prefix": prefix, "record": rec, "namespaces": names, "skipped": sc.foreign, "ranks": ranks,
            "switch": f"{prefix}-sw" in names, "complete": complete, "problems": problems}


def attach(prefix: str = DEFAULT_PREFIX) -> EmulatedCluster:
    """The complete cluster ``zepp cluster up --prefix prefix`` left running (shape and rate
    from its record), as an ``EmulatedCluster`` with ``keep=True`` (leaving a context does not
    remove it). ``EmulationError`` when there is none or it is incomplete."""
    st = status(prefix)
    if st["record"] is None and not st["namespaces"]:
        raise EmulationError(f"no emulated cluster with prefix {prefix!r} is up (zepp cluster up --prefix {prefix})")
    if not st["complete"]:
        raise EmulationError(f"emulated cluster {prefix!r} is incomplete: {'; '.join(st['problems'])}; run "
                             f"zepp cluster down --prefix {prefix} and up again")
    rec = st["record"]
    cl = EmulatedCluster(rec["nodes"], rec["gpus_per_node"], rate_mbit=rec["rate_mbit"], delay_ms=rec["delay_ms"],
                         prefix=prefix, nic_mtu=rec["nic_mtu"], nvlink_mtu=rec["nvlink_mtu"], keep=True)
    cl.attached(rec["id"])
    return cl
