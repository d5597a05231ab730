"""Byte counters of the emulated links: from outside (netlink, every rank's namespace) and from
inside a rank (``/sys/class/net``, which in a rank's namespace shows only its own links)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from zepp.emulate.iproute import sh, tool

NIC_IF = "nic"


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


def read_link_counters(namespaces: list[str], gpus_per_node: int) -> LinkCounters:
    """Counters of every rank's NIC and NVLink veths (one netlink query per rank namespace;
    ``namespaces[r]`` is rank ``r``'s)."""
    R, L = len(namespaces), gpus_per_node
    ip = tool("ip")
    tx, rx, pk = np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.int64)
    nv = np.zeros((R, R), np.int64)
    for r, ns in enumerate(namespaces):
        links = json.loads(sh([ip, "-j", "-s", "-n", ns, "link", "show"]).stdout)
        node = r // L
        for link in links:
            name, st = link["ifname"], link.get("stats64", {})
            if name == NIC_IF:
                tx[r], rx[r], pk[r] = st["tx"]["bytes"], st["rx"]["bytes"], st["tx"]["packets"]
            elif name.startswith("nv"):
                nv[r, node * L + int(name[2:])] = st["tx"]["bytes"]
    return LinkCounters(tx, rx, nv, pk)


def read_own_counters(base: str = "/sys/class/net") -> list[int]:
    """``[nic_tx, nic_rx, nvlink_tx]`` bytes of the calling process's namespace (a rank's own
    NIC and the sum over its NVLink veths)."""
    out = [0, 0, 0]
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            if name == NIC_IF:
                with open(f"{base}/{NIC_IF}/statistics/tx_bytes") as f:
                    out[0] = int(f.read())
                with open(f"{base}/{NIC_IF}/statistics/rx_bytes") as f:
                    out[1] = int(f.read())
            elif name.startswith("nv"):
                with open(f"{base}/{name}/statistics/tx_bytes") as f:
                    out[2] += int(f.read())
        except OSError:
            pass
    return out
