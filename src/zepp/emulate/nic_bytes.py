"""What the NICs of an emulated ``zepp run`` carried, per system, next to the planner's figures.

``nic_bytes_per_system`` folds the per-rank interface counters that ``zepp.emulate.worker_rank``
writes (one snapshot before every layer call and one after the last) into bytes per timed
iteration per rank, and recomputes the planner's payload per rank from the same batches;
``format_emulate`` prints the table ``zepp run --emulate`` shows. Counters are wire bytes
(Ethernet/IP/TCP headers, TCP acknowledgements, one barrier per layer and the layer's metadata
all-gather included).
"""

from __future__ import annotations

import numpy as np


def nic_bytes_per_system(cfg: dict, counters: list[dict], report: dict) -> dict:
    """Per system, mean bytes per timed iteration per rank from the rank counters (see
    ``zepp.emulate.worker_rank`` for the windows), plus the planner's per-rank figures."""
    systems, iters = cfg["systems"], cfg["iters"]
    tx, rx, nv = _counted(systems, counters, cfg["warmup"])
    planned = _planned(cfg, len(counters))
    out = {}
    for name in systems:
        pn, pv = planned.get(name, (None, None))
        meta = report["systems"][name]["metadata_bytes_per_iter"]
        out[name] = {"nic_tx": (tx[name] / iters).tolist(), "nic_rx": (rx[name] / iters).tolist(),
                     "nvlink_tx": (nv[name] / iters).tolist(),
                     "planned_nic": None if pn is None else (pn / iters).tolist(),
                     "planned_nvlink": None if pv is None else (pv / iters).tolist(),
                     "metadata_nic": meta.get("nic", 0)}
    return out


def _counted(systems: list[str], counters: list[dict], warmup: int) -> tuple[dict, dict, dict]:
    """``(nic_tx, nic_rx, nvlink_tx)``: per system ``[R]`` bytes of its timed layer calls, each
    call's window running from its snapshot to the rank's next one."""
    R = len(counters)
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
    return tx, rx, nv


def _planned(cfg: dict, R: int) -> dict:
    """``{system: (nic_send [R], nvlink [R])}`` the planner's payload over the timed batches,
    dispatch + combine. A system that swaps weights plans each batch on the placement its swaps
    made, which only the ranks know: it is left out rather than recomputed wrongly."""
    from zepp.emulate.simcheck import worker_plans
    from zepp.runtime.systems import SYSTEMS

    fixed = [n for n in cfg["systems"] if not SYSTEMS[n].swaps]
    plans = worker_plans(dict(cfg, systems=fixed))["plans"] if fixed else {}
    out = {}
    for name, batch_plans in plans.items():
        pn, pv = np.zeros(R), np.zeros(R)
        for p in batch_plans:
            st = p.stats()  # dispatch + combine
            pn += st.nic_send
            pv += st.nvlink.sum(axis=1)
        out[name] = (pn, pv)
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
