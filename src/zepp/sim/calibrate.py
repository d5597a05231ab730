"""Calibration of the simulator: the hardware figures as given and a few free parameters fitted
on the measured ``a2av`` latencies only (the measured tables themselves: ``zepp.sim.measured``).

Given, not fitted (PAPER.md sections 3, 5, 7, and our measurements)
-------------------------------------------------------------------
- link rates, peak FLOP/s, HBM bandwidth and SM counts of the presets (``zepp.cluster``);
- the grouped-GEMM efficiency curve ``eff(n) = eff_max * n / (n + rows_half)`` (``n`` rows per
  expert) and the rate at which a grouped GEMM streams its weights (``weight_read_eff`` of the HBM
  bandwidth): measured on an H200 (``benchmarks/results/gpu_gemm_h200.md``, torch's grouped GEMM):
  ``eff_max`` 0.72, ``rows_half`` 127 (half the efficiency at one 128-row tile), and below ~128
  rows per expert a flat time about 1.8x the weight-read floor, i.e. weights stream at 0.55 of HBM
  bandwidth. The Hopper presets take these as measured. The A100 presets keep the curve's shape
  (``rows_half`` 127: the same 128-row tiles) and the same weight-read efficiency, and take
  ``eff_max`` from PAPER.md section 7's testbed measurement: the unfused grouped GEMM of K2 reached
  130-135 TFLOP/s (43% of 312) at ~390 rows per expert, so ``eff_max = 0.43 * (390 + 127) / 390 =
  0.57``. (Before issue 26 every preset used ``eff_max`` 0.5, ``rows_half`` 64 and the full HBM
  rate for weights.)
- COMET's fused, tile-gated GEMM at 62.5 / 132.5 of that efficiency; a proxy keeps 14.5 puts in
  flight; a receiver's signal wait costs 2 us; NVLink message cost 10 us; kernel launch 10 us.

Fitted on the ``a2av`` column only (three parameters per preset)
---------------------------------------------------------------
- ``put_c0``, ``put_c1``: a cross-node put through the host proxy costs ``put_c0 + put_c1 * W``
  seconds of fixed time in a job of ``W`` ranks. The measured ``a2av`` latency at 1 MB (where
  bytes are negligible) grows roughly with ``W**2`` although it issues only ``2 (W - 1)`` puts
  per rank, so the per-put cost itself grows with ``W``; the section-7 figures (0.12 ms alone,
  0.2 ms through the proxy, 0.34-0.59 ms under concurrency) bracket the fitted values.
- ``nic_eff``: the fraction of the NIC's nominal rate bulk puts reach (section 7 observed about
  16-17 of 25 GB/s).

The fit (``fit_a2av``) minimises the squared relative error of the simulated ``a2av`` median
over the cells given; the latency is close to affine in ``(put_c0, put_c1, 1 / nic_eff)``, so
each round simulates every cell at four parameter points, solves the linear least-squares
problem, and re-centres. ``benchmarks/fit/calibrate.py`` runs it and writes
``benchmarks/results/calibration.{json,md}``; the values below are its output.

Today's presets (``h100-8``, ``h200-8``, ``gb200-nvl72``) have no measured column to fit: their
``Net`` is DeepEP's published figures (``PUBLISHED``; ``zepp.sim.mechanics.DEEPEP_NET``).
"""

from __future__ import annotations

import numpy as np

from zepp.cluster import Cluster, cluster_preset
from zepp.errors import ZeppInputError
from zepp.sim.measured import fig9, weak_a2av
from zepp.sim.mechanics import DEEPEP_NET, Net

# GEMM curve and fixed costs from the figures above, per preset: the A100's curve anchored on PAPER.md
# section 7, Hopper's as measured on the H200 (GB200: no measurement; Hopper's curve on its own peak).
_FIXED = dict(nvlink_msg_cost=10e-6, kernel_launch=10e-6)
A100_GEMM = dict(gemm_eff_max=0.43 * (390 + 127) / 390, gemm_rows_half=127.0, weight_read_eff=0.55)
HOPPER_GEMM = dict(gemm_eff_max=0.72, gemm_rows_half=127.0, weight_read_eff=0.55)
HARDWARE: dict[str, dict] = {"a100": dict(_FIXED, **A100_GEMM), "h100": dict(_FIXED, **HOPPER_GEMM),
                             "h100-8": dict(_FIXED, **HOPPER_GEMM), "h200-8": dict(_FIXED, **HOPPER_GEMM),
                             "gb200-nvl72": dict(_FIXED, **HOPPER_GEMM)}

# Output of benchmarks/fit/calibrate.py (see benchmarks/results/calibration.md).
FITTED: dict[str, Net] = {
    "a100": Net(put_c0=44.82e-6, put_c1=1.7918e-6, nic_eff=0.77272),
    "h100": Net(put_c0=24.79e-6, put_c1=3.4143e-6, nic_eff=0.82223),
}


# Today's clusters: nothing measured here to fit, so their network stack is DeepEP's from its
# published figures (``zepp.sim.mechanics.DEEPEP_NET``, PAPER.md section 5), not a fit.
PUBLISHED: dict[str, Net] = {"h100-8": DEEPEP_NET, "h200-8": DEEPEP_NET, "gb200-nvl72": DEEPEP_NET}


def network_of(preset: str) -> tuple[Net, str]:
    """A preset's simulator ``Net`` and where it comes from (``fitted`` on the paper's ``a2av``
    column, or ``published``: DeepEP's figures)."""
    if preset in FITTED:
        return FITTED[preset], "fitted"
    if preset in PUBLISHED:
        return PUBLISHED[preset], "published"
    raise ZeppInputError(f"cluster preset {preset!r} has no network figures for the simulator; simulated presets: "
                         f"{', '.join((*FITTED, *PUBLISHED))}")


def has_network(preset: str) -> bool:
    """Whether the simulator has network figures (fitted or published) for ``preset``."""
    return preset in FITTED or preset in PUBLISHED


def network_label(preset: str) -> str:
    """How ``preset``'s network figures are described to the user."""
    if not has_network(preset):
        return "no network figures (not simulated)"
    return {"fitted": "its fitted network figures",
            "published": "DeepEP's published network figures"}[network_of(preset)[1]]


def on_network(cluster: Cluster) -> tuple[Cluster, Net]:
    """``cluster`` with the calibration's hardware figures (``HARDWARE``; a field a cluster file
    set, ``Cluster.given``, is kept as the file says) and the ``Net`` of its preset
    (``network_of``: fitted, or DeepEP's published figures for today's clusters); a
    cluster whose name is no simulated preset is a ``ZeppInputError``."""
    net, _ = network_of(cluster.name)
    return cluster.with_(**{k: v for k, v in HARDWARE[cluster.name].items() if k not in cluster.given}), net


# cluster fields the simulator does not read when it has a preset's network: the preset's put
# costs replace the flat per-NIC-message cost; weight copies are not simulated
SIM_UNUSED = ("nic_msg_cost", "weight_copy_bw")


def unused_note(cluster: Cluster) -> str | None:
    """A note naming the fields a cluster file set that the simulated times do not use
    (``SIM_UNUSED``), or ``None`` when there are none (or nothing is simulated)."""
    unused = [k for k in SIM_UNUSED if k in cluster.given] if has_network(cluster.name) else []
    if not unused:
        return None
    return (f"note: the simulated times do not use the cluster file's {', '.join(unused)} (the simulator's network "
            f"figures of {cluster.name!r} give the per-message costs; weight copies are not simulated)")


def calibrated(preset: str, nodes: int, net: Net | None = None, gpus_per_node: int = 4) -> tuple[Cluster, Net]:
    """The preset cluster with the calibration's hardware figures, and its ``Net`` (``on_network``;
    ``net`` replaces the preset's)."""
    cl, preset_net = on_network(cluster_preset(preset, nodes, gpus_per_node))
    return cl, preset_net if net is None else net


# ----------------------------------------------------------------------------- cells


def fit_cells(preset: str) -> list[tuple[int, str, float, float]]:
    """``(nodes, model, MB, measured a2av ms)`` cells the fit uses for a preset."""
    cells = []
    if preset == "a100":
        cells += [(n, m, mb, v["a2av"]) for (c, n, m, mb), v in fig9().items() if c == preset]
    have = {(n, m, mb) for n, m, mb, _ in cells}
    cells += [(n, "k2", mb, v) for (c, n, mb), v in weak_a2av().items() if c == preset and (n, "k2", mb) not in have]
    return sorted(cells)


# ----------------------------------------------------------------------------- fitting


def _net_of(theta: np.ndarray, base: Net) -> Net:
    c0, c1, inv_eff = theta
    return Net(put_c0=float(c0), put_c1=float(c1), nic_eff=float(1 / inv_eff), proxy_inflight=base.proxy_inflight,
               signal=base.signal)


def fit_a2av(preset: str, cells, sim_cell, start: Net | None = None, rounds: int = 3, log=print) -> dict:
    """Fit ``(put_c0, put_c1, nic_eff)`` for ``preset``.

    ``cells``: ``[(nodes, model, MB, measured_ms)]``; ``sim_cell(cell, net) -> simulated a2av
    median seconds``. Returns the fitted ``Net`` and per-cell results.
    """
    base = start or Net()
    theta = np.array([base.put_c0, base.put_c1, 1 / base.nic_eff])
    meas = np.array([c[3] for c in cells]) * 1e-3
    history = []
    for rnd in range(rounds):
        steps = np.maximum(np.abs(theta) * 0.25, [10e-6, 0.5e-6, 0.1])
        pts = [theta] + [theta + np.eye(3)[i] * steps[i] for i in range(3)]
        sims = np.array([[sim_cell(c, _net_of(p, base)) for c in cells] for p in pts])  # [4, cells]
        J = (sims[1:] - sims[0]) / steps[:, None]  # [3, cells] d latency / d theta
        A0 = sims[0] - J.T @ theta  # affine intercept per cell
        # min sum ((A0 + J^T th) / meas - 1)^2 subject to th >= lower bounds (active-set on 3 vars)
        M = (J / meas).T
        y = 1 - A0 / meas
        lower = np.array([0.0, 0.0, 1.0])
        free = np.ones(3, bool)
        for _ in range(4):
            th = lower.copy()
            if free.any():
                sol, *_ = np.linalg.lstsq(M[:, free], y - M[:, ~free] @ lower[~free], rcond=None)
                th[free] = sol
            bad = free & (th < lower)
            if not bad.any():
                break
            free &= ~bad
        err0 = sims[0] / meas - 1
        history.append(dict(round=rnd, theta=theta.tolist(), rms_rel_error=float(np.sqrt(np.mean(err0 ** 2)))))
        log(f"[fit {preset}] round {rnd}: theta {theta} rms rel error {history[-1]['rms_rel_error']:.3f} -> {th}")
        theta = th
    final = np.array([sim_cell(c, _net_of(theta, base)) for c in cells])
    err = final / meas - 1
    net = _net_of(theta, base)
    return dict(net=net, cells=[dict(nodes=c[0], model=c[1], budget_mb=c[2], measured_ms=c[3],
                                     simulated_ms=float(s * 1e3), rel_error=float(e))
                                for c, s, e in zip(cells, final, err)],
                rms_rel_error=float(np.sqrt(np.mean(err ** 2))), median_abs_rel_error=float(np.median(np.abs(err))),
                history=history)
