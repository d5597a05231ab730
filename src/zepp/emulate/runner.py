"""``zepp run --emulate``: run the runtime's systems in an emulated cluster and read the NICs.

``run_emulated(cfg, rate_mbit, delay_ms)`` brings up ``cfg["nodes"] x cfg["gpus_per_node"]``
rank namespaces (``zepp.emulate.topology``), starts ``python -m zepp.emulate.rankrun CONFIG OUTDIR``
in each (the unchanged runtime worker plus per-layer interface counters), waits, tears the
cluster down (always: also on Ctrl-C, SIGTERM, a crashed or hung rank) and returns the worker's
report with an ``"emulate"`` section::

    {"rate_mbit", "delay_ms", "prefix", "nodes", "gpus_per_node",
     "systems": {name: {"nic_tx" [R], "nic_rx" [R], "nvlink_tx" [R],   # kernel counters, bytes per
                        "planned_nic" [R], "planned_nvlink" [R],        # timed iteration (mean);
                                                                        # planned: None for swapping systems
                        "metadata_nic": bytes of the id/weight all-gather per iteration, all ranks}}}

Counters are wire bytes (Ethernet/IP/TCP headers, TCP acknowledgements, one barrier per layer
and the layer's metadata all-gather included); ``planned_*`` is the planner's payload per rank
(``FlowPlan`` link stats of dispatch + combine), recomputed here from the same batches.

A failure raises ``zepp.errors.RankFailure`` (the same message format as ``zepp run``).
``nic_fault=(rank, call)``: tests take rank ``rank``'s node off the network at the start of its
layer call ``call`` (see ``zepp.emulate.rankrun``). Temp files live in a ``zepp-emurun-*``
folder removed on every exit path (``zepp.launch.processes.temp_folder``).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from zepp.launch.processes import temp_folder
from zepp.emulate.topology import EmulatedCluster


def run_emulated(cfg: dict, rate_mbit: float, delay_ms: float = 0.0, threads: int = 1, prefix: str = "zepp",
                 nic_fault: tuple[int, int] | None = None, run_timeout: float | None = None,
                 grace: float | None = None, cluster: EmulatedCluster | None = None) -> dict:
    """Run ``cfg`` (a ``zepp.runtime.worker`` config) in an emulated cluster; see the module doc.

    ``cluster``: an already running ``EmulatedCluster`` of the right shape (kept up afterwards);
    by default one is created for this call and torn down before returning. ``run_timeout``:
    an overall limit in seconds (None: none; a hung collective ends by ``cfg["timeout"]``).
    """
    if cluster is not None:
        return _run_in(cluster, cfg, threads, nic_fault, run_timeout, grace)
    with EmulatedCluster(cfg["nodes"], cfg["gpus_per_node"], rate_mbit=rate_mbit, delay_ms=delay_ms,
                         prefix=prefix) as cl:
        return _run_in(cl, cfg, threads, nic_fault, run_timeout, grace)


def _run_in(cl: EmulatedCluster, cfg: dict, threads: int, nic_fault, run_timeout, grace) -> dict:
    R = cl.ranks
    if R != cfg["nodes"] * cfg["gpus_per_node"] or cl.gpus_per_node != cfg["gpus_per_node"]:
        raise ValueError(f"cluster {cl.nodes}x{cl.gpus_per_node} does not match the config's "
                         f"{cfg['nodes']}x{cfg['gpus_per_node']}")
    grace = float(cfg["timeout"]) + 15 if grace is None else grace
    with temp_folder("zepp-emurun-") as tmp:
        cfg = dict(cfg, out=os.path.join(tmp, "report.json"))
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        env = {"ZEPP_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        if nic_fault is not None:
            env["ZEPP_EMULATE_NIC_FAULT"] = f"{nic_fault[0]}:{nic_fault[1]}"
        faulted = []

        def inject(codes) -> None:  # the rank asked for its node's NICs to go down now
            if nic_fault is not None and not faulted and os.path.exists(os.path.join(tmp, "nic_fault")):
                cl.node_nics_down(nic_fault[0] // cl.gpus_per_node)
                faulted.append(True)

        with cl.spawn([sys.executable, "-m", "zepp.emulate.rankrun", path, tmp], env=env,
                      logdir=os.path.join(tmp, "logs")) as group:
            res = group.wait(timeout=run_timeout, grace=grace, on_poll=inject, poll_s=0.05)
        if not res.ok:
            context = (f"fault injected: the NICs of node {nic_fault[0] // cl.gpus_per_node} were taken down at "
                       f"rank {nic_fault[0]}'s layer call {nic_fault[1]}") if faulted else ""
            raise res.failure(context)
        with open(cfg["out"]) as f:
            report = json.load(f)
        counters = []
        for r in range(R):
            with open(os.path.join(tmp, f"counters{r}.json")) as f:
                counters.append(json.load(f))
    report["emulate"] = {"rate_mbit": cl.rate_mbit, "delay_ms": cl.delay_ms, "prefix": cl.prefix,
                         "nodes": cl.nodes, "gpus_per_node": cl.gpus_per_node,
                         "systems": nic_bytes_per_system(cfg, counters, report)}
    return report


def nic_bytes_per_system(cfg: dict, counters: list[dict], report: dict) -> dict:
    """Per system, mean bytes per timed iteration per rank from the rank counters (see
    ``zepp.emulate.rankrun`` for the windows), plus the planner's per-rank figures."""
    from zepp.emulate.simcheck import worker_plans

    systems = cfg["systems"]
    R = len(counters)
    warmup = cfg["warmup"]
    tx = {s: np.zeros(R) for s in systems}
    rx = {s: np.zeros(R) for s in systems}
    nv = {s: np.zeros(R) for s in systems}
    for r, c in enumerate(counters):
        # every snapshot of this rank in time order: (seq, layer, call index, counters)
        snaps = sorted((v[0], li, ci, v[1:]) for li, layer in enumerate(c["layers"])
                       for ci, v in enumerate(layer["calls"]))
        snaps.append((None, None, None, c["final"]))
        for (_, li, ci, v), (_, _, _, nxt) in zip(snaps[:-1], snaps[1:]):
            if ci < warmup:
                continue
            name = systems[li % len(systems)]
            tx[name][r] += nxt[0] - v[0]
            rx[name][r] += nxt[1] - v[1]
            nv[name][r] += nxt[2] - v[2]
    iters = cfg["iters"]
    from zepp.runtime.systems import SYSTEMS

    # a system that swaps weights plans each batch on the placement its swaps made, which only
    # the ranks know: its planned figures are left out (None) rather than recomputed wrongly
    fixed = [n for n in systems if not SYSTEMS[n].swaps]
    plans = worker_plans(dict(cfg, systems=fixed))["plans"] if fixed else {}
    out = {}
    for name in systems:
        pn = pv = None
        if name in plans:
            pn, pv = np.zeros(R), np.zeros(R)
            for p in plans[name]:
                st = p.stats()  # dispatch + combine
                pn += st.nic_send
                pv += st.nvlink.sum(axis=1)
        meta = report["systems"][name]["metadata_bytes_per_iter"]
        out[name] = {"nic_tx": (tx[name] / iters).tolist(), "nic_rx": (rx[name] / iters).tolist(),
                     "nvlink_tx": (nv[name] / iters).tolist(),
                     "planned_nic": None if pn is None else (pn / iters).tolist(),
                     "planned_nvlink": None if pv is None else (pv / iters).tolist(),
                     "metadata_nic": meta.get("nic", 0)}
    return out


def format_emulate(report: dict) -> str:
    """The NIC table: per system, measured (interface counters) against planned bytes per iteration."""
    em = report["emulate"]
    kb = 1024
    lines = [f"emulated cluster: {em['nodes']} nodes x {em['gpus_per_node']} ranks, NIC {em['rate_mbit']:g} Mbit/s "
             f"per direction, delay {em['delay_ms']:g} ms; bytes per iteration from the interface counters "
             "(wire bytes: headers, ACKs, barrier, metadata all-gather included) against the planner's payload",
             f"{'system':<11} {'layer ms':>9} {'NIC tx KB (sum)':>16} {'planned KB':>11} {'+meta KB':>9} "
             f"{'ratio':>6} {'busiest NIC tx KB':>18} {'planned':>8}  NIC tx KB per rank"]
    for name, s in em["systems"].items():
        tx = np.asarray(s["nic_tx"])
        if s["planned_nic"] is None:  # swaps: not recomputed outside the ranks
            p_sum = ratio = p_max = "-"
        else:
            pn = np.asarray(s["planned_nic"])
            planned = pn.sum() + s["metadata_nic"]
            p_sum, p_max = f"{pn.sum() / kb:.1f}", f"{pn.max() / kb:.1f}"
            ratio = f"{tx.sum() / planned:.3f}" if planned else "nan"
        lines.append(f"{name:<11} {report['systems'][name]['median_layer_ms']:>9.2f} {tx.sum() / kb:>16.1f} "
                     f"{p_sum:>11} {s['metadata_nic'] / kb:>9.1f} {ratio:>6} {tx.max() / kb:>18.1f} "
                     f"{p_max:>8}  " + " ".join(f"{v / kb:.0f}" for v in tx))
    return "\n".join(lines)
