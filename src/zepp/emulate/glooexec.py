"""The runtime's gloo executor as the simulator's layer builder sees it, with measured costs.

``zepp.runtime`` runs a FlowPlan on a gloo process group as one ``all_to_all_single`` per
stage (``zepp.runtime.dispatcher``). For ``zepp.sim.layer.build_layer`` that is:

- a ``Mechanics`` record: ``stage_collectives`` (``zepp.sim.collectives``: every pair exchanges
  a message per call, each rank's messages one after another in gloo's ring order, a rank
  leaves a call when its sends and receives are done), no barriers; overlap systems group
  GEMM 1 by arrival stage (the runtime computes each stage's rows while the next stage is on
  the wire) and GEMM 2 in combine waves (one asynchronous call per wave);
- a ``Net``: the cross-node per-message cost is linkcal's measured NIC latency (no proxy);
  ``call_cpu`` is the per-call CPU overhead (free parameter ``stage_overhead``, fitted on a2av)
  plus the measured fixed cost of an empty all-to-all beyond its ``R - 1`` messages' costs;
  ``cpu_per_byte`` (free parameter) times the ranks sharing a core, ``max(1, R / cores)``;
- a ``Cluster`` with linkcal's measured rates and per-message costs (``bw_scale`` multiplies
  both rates);
- the GEMM cost ``AdditiveGemm``: ``c_group * groups + c_row * rows`` per grouped GEMM, fitted
  on the emulated cluster (``zepp.emulate.simcheck.fit_compute``), instead of a GPU roofline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from zepp.cluster import Cluster
from zepp.errors import ZeppInputError
from zepp.sim.mechanics import Mechanics, Net

GLOO_BLOCKING = Mechanics(dispatch_puts="serial", combine_puts="serial", dispatch_barrier=None,
                          combine_barrier=None, stage_collectives=True)
GLOO_OVERLAP = replace(GLOO_BLOCKING, gemm1="stage", gemm2="waves")


def gloo_mechanics(system, cpu: bool = True) -> Mechanics:
    """The record of a registry ``System`` run by the runtime on gloo (collective overlap only).
    On CPU tensors (``cpu``: the emulated cluster) an overlap system's granularity comes from the
    cost model with no separate compute engine (``Figures.overlap = 0``), which picks one
    dispatch group and one combine wave: the blocking schedule (``zepp.runtime.dispatcher``)."""
    ov = system.overlap_choice
    if not ov.overlaps:
        return GLOO_BLOCKING
    if ov.grouped and not ov.per_batch and system.comm_choice.collective:
        return GLOO_BLOCKING if ov.chosen_per_batch(cpu, system.comm_choice) else GLOO_OVERLAP
    raise ZeppInputError(f"system {system.name!r}: the gloo executor model covers blocking and collective-overlap "
                         f"systems, not overlap={system.overlap!r} over {system.overlap_comm!r}")


@dataclass(frozen=True)
class AdditiveGemm:
    """``gemm_cost`` for ``build_layer``: ``up`` / ``down`` = ``(c_group, c_row)`` seconds per
    active slot and per row of GEMM 1 / GEMM 2."""

    up: tuple[float, float]
    down: tuple[float, float]

    def __call__(self, which: int, rows: np.ndarray, groups: np.ndarray) -> np.ndarray:
        c_group, c_row = self.up if which == 1 else self.down
        return c_group * np.asarray(groups, float) + c_row * np.asarray(rows, float)


def emulated_cluster(cal: dict, nodes: int, gpus_per_node: int, bw_scale: float = 1.0) -> Cluster:
    """The calibrated links of ``cal`` (``zepp.emulate.simcheck.calibrate``) as a ``Cluster``; no
    GPU figures are used (the GEMM cost is ``AdditiveGemm``, the reduce is a few microseconds)."""
    f = cal["cluster_fields"]
    return Cluster(name="emulated", nodes=nodes, gpus_per_node=gpus_per_node, nvlink_bw=f["nvlink_bw"] * bw_scale,
                   nic_bw=f["nic_bw"] * bw_scale, nvlink_msg_cost=f["nvlink_msg_cost"],
                   nic_msg_cost=f["nic_msg_cost"], peak_flops=1e12, hbm_bw=1e12, kernel_launch=0.0)


def emulated_net(cal: dict, ranks: int, gpus_per_node: int, stage_overhead: float, cpu_per_byte: float) -> Net:
    """The ``Net`` of the gloo executor on the calibrated cluster (see the module notes)."""
    f = cal["cluster_fields"]
    R, L = ranks, gpus_per_node
    mean_msg = ((L - 1) * f["nvlink_msg_cost"] + (R - L) * f["nic_msg_cost"]) / (R - 1) if R > 1 else 0.0
    empty_extra = max(0.0, cal.get("a2a_empty_s", 0.0) - (R - 1) * mean_msg)
    share = max(1.0, R / cal.get("cores", 2))
    return Net(put_c0=f["nic_msg_cost"], put_c1=0.0, nic_eff=1.0, call_cpu=stage_overhead + empty_extra,
               cpu_per_byte=cpu_per_byte * share)


def emulated_gemm(cal: dict) -> AdditiveGemm:
    c = cal["compute"]
    return AdditiveGemm(up=tuple(c["up"]), down=tuple(c["down"]))
