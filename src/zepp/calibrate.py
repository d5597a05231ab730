"""Calibration of the simulator: the hardware figures as given, a few free parameters fitted on
the measured ``a2av`` latencies only, and the measured tables the bench compares against.

Given, not fitted (PAPER.md sections 3, 5, 7)
--------------------------------------------
- link rates, peak FLOP/s and HBM bandwidth of the ``a100`` / ``h100`` presets (``zepp.cluster``);
- the GEMM efficiency curve ``eff(n) = 0.5 * n / (n + 64)`` (``n`` rows per expert): 0.43 at the
  ~390 rows per expert of K2 at 4 nodes, 16 MB, where the unfused grouped GEMM reached
  130-135 TFLOP/s (43% of 312), and a ceiling of 50% ("25-50% at 1-2k rows per expert").
  Its small-``n`` slope keeps the roofline's weight-read bound in charge for thin experts.
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
problem, and re-centres. ``benchmarks/calibrate.py`` runs it and writes
``benchmarks/results/calibration.{json,md}``; the values below are its output.
"""

from __future__ import annotations

import time

import numpy as np

from zepp.cluster import Cluster, cluster_preset
from zepp.schedule import Net

# GEMM curve and fixed costs from the figures above (same for both presets).
HARDWARE = dict(gemm_eff_max=0.5, gemm_rows_half=64.0, nvlink_msg_cost=10e-6, kernel_launch=10e-6)

# Output of benchmarks/calibrate.py (see benchmarks/results/calibration.md).
FITTED: dict[str, Net] = {
    "a100": Net(put_c0=47.12e-6, put_c1=1.7687e-6, nic_eff=0.75665),
    "h100": Net(put_c0=48.96e-6, put_c1=3.021e-6, nic_eff=0.86527),
}


def calibrated(preset: str, nodes: int, net: Net | None = None) -> tuple[Cluster, Net]:
    """The preset cluster with the calibration's hardware figures, and its fitted ``Net``."""
    cl = cluster_preset(preset, nodes, **HARDWARE)
    return cl, (FITTED[preset] if net is None else net)


# ----------------------------------------------------------------------------- measurements

SYSTEM_COLUMNS = ("a2av", "fast", "comet", "eplb", "epic", "moonep", "comet+eplb")

# PAPER.md section 4 (A100, Fig. 9), ms per MoE layer: (nodes, model, MB) -> values in SYSTEM_COLUMNS order.
_FIG9 = """
4 k2 1 5.36 10.77 4.04 7.94 8.04 14.65 3.68
4 k2 4 11.70 16.13 6.26 13.92 10.41 24.45 5.54
4 k2 16 40.08 35.68 16.29 37.30 20.99 43.80 14.35
4 qwen 1 5.14 10.02 4.46 6.44 6.98 9.53 3.75
4 qwen 4 12.05 15.92 5.93 12.49 9.46 15.67 4.96
4 qwen 16 40.17 38.59 15.02 35.54 20.20 38.01 12.45
8 k2 1 9.24 30.38 6.77 7.97 9.93 17.62 4.97
8 k2 4 16.77 36.82 10.90 15.97 12.85 26.46 9.00
8 k2 16 44.43 61.81 29.90 46.26 28.46 50.53 26.60
8 qwen 1 9.02 31.72 7.70 7.30 9.32 12.29 5.94
8 qwen 4 17.60 35.19 10.63 14.38 12.68 16.34 8.50
8 qwen 16 52.82 62.27 28.34 44.63 29.51 39.84 24.85
16 k2 1 24.31 193.0 15.30 9.75 16.41 20.30 8.32
16 k2 4 30.75 199.9 23.46 19.83 19.91 27.59 17.61
16 k2 16 63.52 226.4 62.73 59.05 39.39 58.74 56.93
16 qwen 1 24.87 183.4 16.32 8.12 16.45 14.34 10.45
16 qwen 4 34.78 185.9 24.43 16.81 20.22 19.70 17.84
16 qwen 16 76.01 222.4 65.67 57.42 42.78 52.24 57.55
"""

MEASURED: dict[tuple[str, int, str, float], dict[str, float]] = {}
for _line in _FIG9.strip().splitlines():
    _f = _line.split()
    MEASURED[("a100", int(_f[0]), _f[1], float(_f[2]))] = dict(zip(SYSTEM_COLUMNS, map(float, _f[3:])))

# PAPER.md section 4, weak scaling (Fig. 10), K2, a2av ms: (cluster, nodes, MB) -> ms.
WEAK_A2AV: dict[tuple[str, int, float], float] = {}
for _n, _a1, _a64, _h1, _h64 in ((2, 5.00, 105.5, 3.42, 83.7), (4, 5.36, 139.7, 4.74, 109.3),
                                 (8, 9.24, 166.8, 11.29, 145.7), (16, 24.31, 209.5, 35.73, 179.1),
                                 (32, 81.77, 368.6, 122.8, 317.0)):
    WEAK_A2AV[("a100", _n, 1.0)] = _a1
    WEAK_A2AV[("a100", _n, 64.0)] = _a64
    WEAK_A2AV[("h100", _n, 1.0)] = _h1
    WEAK_A2AV[("h100", _n, 64.0)] = _h64


def measured_ms(cluster: str, nodes: int, model: str, mb: float) -> dict[str, float | None]:
    """Measured latency per baseline for a configuration (``None`` where the paper has none)."""
    row = MEASURED.get((cluster, nodes, model, float(mb)))
    out: dict[str, float | None] = {s: (row[s] if row else None) for s in SYSTEM_COLUMNS}
    if model == "k2" and out["a2av"] is None:
        out["a2av"] = WEAK_A2AV.get((cluster, nodes, float(mb)))
    return out


def fit_cells(preset: str) -> list[tuple[int, str, float, float]]:
    """``(nodes, model, MB, measured a2av ms)`` cells the fit uses for a preset."""
    cells = []
    if preset == "a100":
        cells += [(n, m, mb, v["a2av"]) for (c, n, m, mb), v in MEASURED.items() if c == preset]
    have = {(n, m, mb) for n, m, mb, _ in cells}
    cells += [(n, "k2", mb, v) for (c, n, mb), v in WEAK_A2AV.items() if c == preset and (n, "k2", mb) not in have]
    return sorted(cells)


# ----------------------------------------------------------------------------- fitting


# Planner op mix (argsort, bincount, gather, cumsum, searchsorted, where over n int64 entries;
# benchmarks/calibrate_planner_gpu.py), timed with torch on an H200: entries -> seconds for the
# whole mix. Used: the mixes queued back to back with one host synchronisation per batch of
# mixes (``gpu-pipelined``, benchmarks/results/calibration_planner_gpu_pipelined.json), as a
# GPU port issues its passes. Kept for comparison: each op synchronised (``gpu``,
# calibration_planner_gpu.json), which charges a host round trip per pass.
GPU_OPMIX_H200 = {9_216: 193.5e-6, 37_888: 214.6e-6, 149_504: 226.4e-6, 598_016: 294.5e-6}
GPU_OPMIX_H200_SYNCED = {9_216: 266e-6, 37_888: 276e-6, 149_504: 307e-6, 598_016: 370e-6}
H200_HBM_BW = 4.8e12


def gpu_opmix_seconds(entries: int, cluster: Cluster, table: dict[int, float] | None = None) -> float:
    """The op mix's GPU time at ``entries`` on ``cluster``'s GPU.

    The H200 measurement (log-log interpolation, flat beyond the ends) splits into a floor, the
    mix's time at the smallest size (9k entries: kilobytes of data, so launch and host overhead
    only), which is taken as the same on any GPU, and the part above it, which grows with the
    bytes moved and is scaled by the HBM bandwidth ratio (A100: x3.1, H100: x1.2). Before this
    split the whole time was scaled, which charged the A100 3.1x the H200's launch overhead.
    """
    table = GPU_OPMIX_H200 if table is None else table
    n = np.array(sorted(table), float)
    t = np.array([table[k] for k in sorted(table)])
    x = float(np.clip(np.log(max(entries, 1)), np.log(n[0]), np.log(n[-1])))
    here = float(np.exp(np.interp(x, np.log(n), np.log(t))))
    floor = float(t[0])
    return floor + (here - floor) * H200_HBM_BW / cluster.hbm_bw


def cpu_opmix_seconds(entries: int, repeats: int = 3, seed: int = 0) -> float:
    """The same op mix with numpy on one core of this machine, now (best of ``repeats`` per op)."""
    rng = np.random.default_rng(seed)
    n = max(int(entries), 16)
    key = rng.integers(0, n * 8, n)
    small = rng.integers(0, 4096, n)
    idx = rng.permutation(n)
    srt = np.sort(key)
    ops = (lambda: np.argsort(key, kind="stable"), lambda: np.bincount(small, minlength=4096), lambda: key[idx],
           lambda: np.cumsum(small), lambda: np.searchsorted(srt, key), lambda: np.where(key > n, key, small))
    total = 0.0
    for f in ops:
        best = np.inf
        for _ in range(repeats):
            t = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t)
        total += best
    return total


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
