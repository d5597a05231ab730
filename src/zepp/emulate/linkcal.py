"""Link calibration of the emulated cluster: point-to-point bandwidth and latency, with gloo.

Measured between real rank processes in the namespaces, with ``torch.distributed`` send/recv:

- latency: half the round trip of a ping-pong of a 4-byte tensor (median of ``reps``);
- bandwidth: a one-way stream of ``reps`` back-to-back sends of ``size`` bytes, closed by a
  4-byte acknowledgement; ``size * reps / elapsed`` (median over ``trials``).

Pairs: ``nvlink`` = ranks 0 and 1 (one node, over their NVLink veth); ``nic`` = ranks 0 and
``L`` (two nodes, same local index, over both shaped NICs and the switch). Only one pair talks at
a time. ``nic_concurrent`` has every rank of node 0 stream to its same-index peer on node 1 at
once (all NICs of a node busy, as in an all-to-all); it is reported per NIC.

The result maps onto ``zepp.cluster.Cluster`` fields: ``nvlink_bw``/``nic_bw`` in bytes/s and
``nvlink_msg_cost``/``nic_msg_cost`` in seconds (the one-way latency of a small message, which is
the fixed cost per message gloo pays on these links). ``LinkCalibration.cluster_fields()``
returns exactly those four; CPU GEMM figures come from the compute calibration, not from here.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field

from zepp.emulate.topology import EmulatedCluster

DEFAULT_SIZES = (4096, 65536, 1 << 20, 8 << 20)


class _PairBench:
    """The measurements of one rank process (every rank runs the same calls; only the pair's
    ranks move bytes, the others pass the barriers). Needs an initialised process group."""

    def __init__(self, reps: int, trials: int):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank = int(os.environ["RANK"])
        self.reps, self.trials = reps, trials
        self.tiny = torch.zeros(1)

    def stream(self, a: int, b: int, buf) -> float:
        """``reps`` sends of ``buf`` from ``a`` to ``b``, closed by a tiny acknowledgement; seconds."""
        dist, tiny = self.dist, self.tiny
        t0 = time.perf_counter()
        if self.rank == a:
            for _ in range(self.reps):
                dist.send(buf, b)
            dist.recv(tiny, b)
        elif self.rank == b:
            for _ in range(self.reps):
                dist.recv(buf, a)
            dist.send(tiny, a)
        return time.perf_counter() - t0

    def latency(self, a: int, b: int) -> float:
        """Half the median round trip of a 4-byte ping-pong (the first 5 of ``2 reps + 5`` dropped)."""
        dist, tiny = self.dist, self.tiny
        rtts = []
        for _ in range(2 * self.reps + 5):
            dist.barrier()
            t0 = time.perf_counter()
            if self.rank == a:
                dist.send(tiny, b)
                dist.recv(tiny, b)
            elif self.rank == b:
                dist.recv(tiny, a)
                dist.send(tiny, a)
            rtts.append(time.perf_counter() - t0)
        return statistics.median(rtts[5:]) / 2

    def bandwidth(self, a: int, b: int, size: int) -> float:
        """Median over ``trials`` (after one warm-up trial) of the stream's bytes/s."""
        buf = self.torch.zeros(size // 4)
        samples = []
        for t in range(self.trials + 1):
            self.dist.barrier()
            dt = self.stream(a, b, buf)
            if t > 0:  # the first trial warms the connection up
                samples.append(size * self.reps / dt)
        return statistics.median(samples)

    def concurrent(self, pairs: list, size: int) -> list[float]:
        """Every pair ``[a, b]`` streams at once; per pair the median bytes/s over the trials."""
        torch, dist = self.torch, self.dist
        buf = torch.zeros(size // 4)
        mine = [(a, b) for a, b in pairs if self.rank in (a, b)]
        idx = [i for i, (a, b) in enumerate(pairs) if a == self.rank]
        per_trial = []
        for t in range(self.trials + 1):
            dist.barrier()
            dt = self.stream(*mine[0], buf) if mine else 0.0
            rates = [None] * len(pairs)
            # (pair index, rate) of every sender as plain float64 tensors (pair -1: not a sender)
            mine_rate = torch.tensor([idx[0] if idx else -1, size * self.reps / dt if idx else 0.0],
                                     dtype=torch.float64)
            gathered = [torch.empty(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, mine_rate)
            for g in gathered:
                if g[0] >= 0:
                    rates[int(g[0])] = float(g[1])
            if t > 0:
                per_trial.append(rates)
        return [statistics.median(tr[i] for tr in per_trial) for i in range(len(pairs))]


def _pair_worker(pairs: list, sizes: list, reps: int, trials: int, concurrent: list | None = None) -> dict:
    """Runs in every rank (via ``EmulatedCluster.call``). Rank 0 returns the measurements.

    pairs: [[name, a, b], ...]; sizes: bytes; concurrent: [[a, b], ...] streamed at once.
    Returns {name: {"latency_s": float, "bw": {size: bytes/s}}, "concurrent": {size: [bytes/s per pair]}}.
    """
    from zepp.runtime.rank_process import init_group

    init_group("gloo", 60.0)
    bench = _PairBench(reps, trials)
    out: dict = {}
    for name, a, b in pairs:
        lat = bench.latency(a, b)
        out[name] = {"latency_s": lat, "bw": {int(size): bench.bandwidth(a, b, size) for size in sizes}}
    if concurrent:
        out["concurrent"] = {int(size): bench.concurrent(concurrent, size) for size in sizes}
    bench.dist.barrier()
    bench.dist.destroy_process_group()
    return out if bench.rank == 0 else {}


@dataclass
class LinkCalibration:
    """Measured link figures of an emulated cluster (bytes/s and seconds).

    bw tables map message size in bytes -> achieved bytes/s.
    """

    nodes: int
    gpus_per_node: int
    rate_mbit: float
    nvlink_latency_s: float
    nic_latency_s: float
    nvlink_bw_by_size: dict = field(default_factory=dict)
    nic_bw_by_size: dict = field(default_factory=dict)
    nic_concurrent_bw_by_size: dict = field(default_factory=dict)  # size -> [bytes/s per NIC]

    @property
    def nvlink_bw(self) -> float:
        """Streaming bandwidth at the largest measured size."""
        return self.nvlink_bw_by_size[max(self.nvlink_bw_by_size)]

    @property
    def nic_bw(self) -> float:
        return self.nic_bw_by_size[max(self.nic_bw_by_size)]

    def cluster_fields(self) -> dict:
        """Keyword arguments for ``zepp.cluster.Cluster`` (``Cluster(name=..., nodes=..., **fields)``)."""
        return {"nvlink_bw": self.nvlink_bw, "nic_bw": self.nic_bw,
                "nvlink_msg_cost": self.nvlink_latency_s, "nic_msg_cost": self.nic_latency_s}

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(self.cluster_fields())
        return d


def calibrate_links(cluster: EmulatedCluster, sizes=DEFAULT_SIZES, reps: int = 8, trials: int = 3,
                    concurrent: bool = True, timeout: float = 180.0) -> LinkCalibration:
    """Measure the NVLink and NIC pairs of a running ``cluster`` (needs >= 2 nodes and >= 2 ranks
    per node for both; missing kinds are skipped and left absent)."""
    L = cluster.gpus_per_node
    pairs = []
    if L >= 2:
        pairs.append(["nvlink", 0, 1])
    if cluster.nodes >= 2:
        pairs.append(["nic", 0, L])
    conc = [[i, L + i] for i in range(L)] if concurrent and cluster.nodes >= 2 and L >= 2 else None
    res = cluster.call("zepp.emulate.linkcal:_pair_worker",
                       {"pairs": pairs, "sizes": [int(s) for s in sizes], "reps": reps, "trials": trials,
                        "concurrent": conc}, timeout=timeout)[0]

    def table(name):
        return {int(k): v for k, v in res[name]["bw"].items()} if name in res else {}
    return LinkCalibration(
        nodes=cluster.nodes, gpus_per_node=L, rate_mbit=cluster.rate_mbit,
        nvlink_latency_s=res["nvlink"]["latency_s"] if "nvlink" in res else float("nan"),
        nic_latency_s=res["nic"]["latency_s"] if "nic" in res else float("nan"),
        nvlink_bw_by_size=table("nvlink"), nic_bw_by_size=table("nic"),
        nic_concurrent_bw_by_size={int(k): v for k, v in res.get("concurrent", {}).items()},
    )


def measure_loopback(cluster: EmulatedCluster, sizes=DEFAULT_SIZES, reps: int = 8, trials: int = 3,
                     timeout: float = 120.0) -> dict:
    """The same measurements between two processes in ONE namespace over its loopback device:
    the reference the NIC is made slower than. Returns {"latency_s", "bw": {size: bytes/s}}."""
    import json
    import sys

    from zepp.emulate.iproute import tool
    from zepp.launch.processes import RankGroup, temp_folder

    ns = cluster.netns(0)
    kwargs = {"pairs": [["loopback", 0, 1]], "sizes": [int(s) for s in sizes], "reps": reps, "trials": trials}
    with temp_folder("zepp-loopback-") as d:
        cmd = [tool("ip"), "netns", "exec", ns, sys.executable, "-m", "zepp.emulate.call_rank",
               "zepp.emulate.linkcal:_pair_worker", json.dumps(kwargs), d]
        envs = [dict(os.environ, RANK=str(r), WORLD_SIZE="2", ZEPP_STORE_FILE=os.path.join(d, "store"),
                     GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
                for r in range(2)]
        with RankGroup([cmd, cmd], envs, os.path.join(d, "logs")) as group:
            group.wait(timeout).check("loopback measurement failed")
        with open(os.path.join(d, "result0.json")) as f:
            res = json.load(f)["loopback"]
    return {"latency_s": res["latency_s"], "bw": {int(k): v for k, v in res["bw"].items()}}
