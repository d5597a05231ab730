"""How each system executes a layer on the simulated network: the ``Net`` figures of the
network stack and one ``Mechanics`` record per name of ``zepp.registry`` (``System.mechanics``).

Sources (PAPER.md section 7, "How the baselines were run"):

- ``serial-barrier`` (``a2av``, ``zepp-a2av``): one blocking put per destination rank in ring
  order (``W-1`` puts in series per rank), then a world barrier; one unfused grouped GEMM; the
  combine mirrors the dispatch.
- ``signals`` (``relay``, ``sglang``, ``zepp-relay``, ``zepp-sync``, ``zepp-direct``): non-blocking
  puts through the proxy with per-message signals, no world barrier; one grouped GEMM.
- ``zepp-overlap``: ``signals`` plus GEMM 1 in dispatch groups run in arrival order and GEMM 2
  in waves per destination node (ring order, own node last).
- ``eplb-staged``: one non-blocking put per destination, two team barriers per call, hidden rows
  and fp32 route weights as separate calls, one kernel per expert (per-expert GEMM).
- ``epic-relay``: relay dispatch whose NIC stage (stage 1) runs as serial blocking proxy puts,
  one per remote node, at EPIC's own measured ``EPIC_RELAY_PUT`` (0.34-0.45 ms "per proxy put per
  round", not the a2av-fitted put), and the hierarchical combine's "one round of N-1 puts after
  GEMM 2" (``reduce-direct``'s stage 1) the same way (``serial_put``); one un-overlapped GEMM.
- ``moonep``: two calls (rows, then fp32 weights) with two barriers each, rows per slot padded
  to 128 (its weight pulls from the home ranks are the ``moonep-pulls`` plug-in).
- ``comet``: fused tile-gated GEMM at 62.5 / 132.5 TFLOP/s of the unfused one, GEMM 1 in two
  groups (own node, remote: tiles wait on per-source flags, only the intra-node part overlaps),
  GEMM 2 in ``L`` column splits (``columns``: "GEMM 2 publishes per column-split barriers"; each
  split reads its slice of w2 once). Its dense all-gather and its in-node ring combine with
  put-with-signal and flag polls are the ``comet-allgather`` and ``comet-ring-combine`` plug-ins.
- ``fast``: synchronous host-driven rounds (the ``fast-rounds`` plug-in), nothing overlaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class Net:
    """Calibrated implementation figures of the network stack (see ``zepp.calibrate``).

    ``put_c0 + put_c1 * W``: seconds of fixed cost of one cross-node put through the host proxy
    in a job of ``W`` ranks; ``nic_eff``: fraction of the NIC's nominal rate that bulk puts
    reach; ``proxy_inflight``: puts one proxy keeps in flight (PAPER.md section 7: 14-15), so a
    non-blocking put holds the proxy for ``put / proxy_inflight``; ``signal``: a receiver's wait
    on a flag (2 us).
    """

    put_c0: float = 50e-6
    put_c1: float = 2e-6
    nic_eff: float = 0.7
    proxy_inflight: float = 14.5
    signal: float = 2e-6

    def put(self, ranks: int) -> float:
        return self.put_c0 + self.put_c1 * ranks

    def barrier(self, ranks: int) -> float:
        """A dissemination barrier over ``ranks``: ``ceil(log2 W)`` rounds of one put each."""
        return math.ceil(math.log2(ranks)) * self.put(ranks) if ranks > 1 else 0.0

    def node_barrier(self, gpus_per_node: int) -> float:
        return math.ceil(math.log2(max(gpus_per_node, 2))) * self.signal

    def allgather(self, ranks: int, nbytes_per_rank: float, nic_bw: float) -> float:
        """Recursive-doubling all-gather: ``ceil(log2 W)`` put rounds plus the bytes."""
        if ranks <= 1:
            return 0.0
        return math.ceil(math.log2(ranks)) * self.put(ranks) + nbytes_per_rank * (ranks - 1) / (nic_bw * self.nic_eff)


@dataclass(frozen=True)
class Mechanics:
    """How a system executes a layer (one choice per field; see ``zepp.sim.mechanics.MECHANICS``).

    - ``dispatch_puts`` / ``combine_puts``: ``serial`` (one blocking put after another per
      rank, destinations in ring order) or ``concurrent`` (non-blocking puts issued through the
      rank's proxy). ``serial_stages``: which stages the ``serial`` rule applies to (others are
      concurrent).
    - ``dispatch_barrier`` / ``combine_barrier``: ``world`` (every rank waits for the whole
      phase plus a barrier), ``None`` (per-message signals only).
    - ``stage_node_barrier``: a node barrier between dispatch stages (COMET's gets).
    - ``calls``: all-to-all calls per phase; each adds two world barriers, the second call
      moves ``extra_call_bytes`` per row (fp32 route weights).
    - ``gemm1``: ``single`` | ``arrival`` (own GPU, own node, each remote node as it arrives)
      | ``local-remote``; ``gemm2``: ``single`` | ``waves`` (one wave per destination node,
      ring order, own node last) | ``columns`` (``L`` column splits in sequence, each reading its
      slice of the weights once; a custom combine may start on each split).
    - ``gemm_eff_scale``: GEMM efficiency relative to the unfused grouped GEMM;
      ``per_expert_gemm``: one kernel per slot; ``pad_rows``: rows per slot rounded up.
    - ``serial_put``: seconds of fixed cost of one cross-node put of the ``serial`` stages where
      the system's own measured figure is known (``None``: the calibrated ``Net.put(W)``).
    """

    dispatch_puts: str = "serial"
    combine_puts: str = "serial"
    serial_stages: tuple[int, ...] = (0, 1, 2)
    dispatch_barrier: str | None = "world"
    combine_barrier: str | None = "world"
    stage_node_barrier: bool = False
    calls: int = 1
    extra_call_bytes: int = 4
    gemm1: str = "single"
    gemm2: str = "single"
    gemm_eff_scale: float = 1.0
    per_expert_gemm: bool = False
    pad_rows: int = 1
    serial_put: float | None = None


COMET_FUSED_EFF = 62.5 / 132.5  # fused tile-gated vs unfused grouped GEMM TFLOP/s (PAPER.md section 7)
# EPIC's serial relay stages: "about 0.34-0.45 ms per proxy put per round" (PAPER.md section 7, epic); midpoint.
EPIC_RELAY_PUT = 0.5 * (0.34e-3 + 0.45e-3)
_CONCURRENT = dict(dispatch_puts="concurrent", combine_puts="concurrent", dispatch_barrier=None, combine_barrier=None)

MECHANICS: dict[str, Mechanics] = {
    # PAPER.md section 7, a2av: "one blocking put per destination rank, in ring order (W-1 puts in
    # series per rank), then a world barrier"; unfused grouped GEMM after the barrier.
    "serial-barrier": Mechanics(),
    "signals": Mechanics(**_CONCURRENT),
    "zepp-overlap": Mechanics(**_CONCURRENT, gemm1="arrival", gemm2="waves"),
    # PAPER.md section 7, eplb: "a staged all-to-all (one non-blocking put per destination, two
    # team barriers per call; hidden rows and fp32 route weights as separate calls), per-expert
    # GEMM, combine as the mirror image". The team barrier is Net.barrier (ceil(log2 W) rounds at
    # the a2av-fitted put), dearer than EPLB's measured phase times allow at 64 ranks
    # (benchmarks/results/baseline_mechanics.md); its planner is the eplb-torch planning model.
    "eplb-staged": Mechanics(**_CONCURRENT, calls=2, per_expert_gemm=True),
    # PAPER.md section 7, epic: relay dispatch whose NIC stage (stage 1) is a round of blocking
    # proxy puts, one per remote node, at EPIC_RELAY_PUT each; "hierarchical combine with one round
    # of N-1 puts after GEMM 2" (reduce-direct's stage 1), the same serial proxy puts; no barrier.
    "epic-relay": Mechanics(dispatch_puts="serial", serial_stages=(1,), combine_puts="serial",
                            dispatch_barrier=None, combine_barrier=None, serial_put=EPIC_RELAY_PUT),
    # PAPER.md section 7, moonep: "segments padded to 128 rows", "two all-to-all calls (rows, then
    # fp32 weights), two barriers each"; the pulls from the hot home ranks are moonep-pulls.
    "moonep": Mechanics(**_CONCURRENT, calls=2, pad_rows=128),
    # PAPER.md section 7, comet: GEMM tiles wait on per-source flags, "so only the intra-node part
    # overlaps compute" (GEMM 1 in two groups: own node, remote); GEMM 2 is split by columns, not
    # by destination ("GEMM 2 publishes per column-split barriers"; each split reads its slice of
    # w2 once: one GEMM 2 of weight reads);
    # the fused tile-gated kernel at COMET_FUSED_EFF. Its dense all-gather and ring combine are the
    # comet-allgather and comet-ring-combine plug-ins.
    "comet": Mechanics(**_CONCURRENT, gemm1="local-remote", gemm2="columns", gemm_eff_scale=COMET_FUSED_EFF),
    # PAPER.md section 7, fast: "rounds are synchronous and host-driven; nothing overlaps" (the
    # rounds, each ending in a world barrier, are the fast-rounds plug-in; one GEMM after them).
    "fast": Mechanics(dispatch_barrier=None, combine_barrier=None),
}


def mechanics(name: str) -> Mechanics:
    if name not in MECHANICS:
        raise ZeppInputError(f"unknown simulator mechanics {name!r}; choose one of {', '.join(MECHANICS)}")
    return MECHANICS[name]
