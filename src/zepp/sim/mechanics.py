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
  to 128 (its weight pulls from the home ranks are the ``moonep-pulls`` phase).
- ``comet``: fused tile-gated GEMM at 62.5 / 132.5 TFLOP/s of the unfused one, GEMM 1 in two
  groups (own node, remote: tiles wait on per-source flags, only the intra-node part overlaps),
  GEMM 2 in ``L`` column splits (``columns``: "GEMM 2 publishes per column-split barriers"; each
  split reads its slice of w2 once). Its dense all-gather and its in-node ring combine with
  put-with-signal and flag polls are the ``comet-allgather`` and ``comet-ring-combine`` phases
  (``zepp.sim.phases``); the puts-with-signal are fenced (``fenced_signals``: NVSHMEM's proxy on
  Slingshot serves them one after another, each a blocking put).
- ``fast``: synchronous host-driven rounds (the ``fast-rounds`` phase), nothing overlaps.

DeepEP's kernels (today's clusters; figures in ``DEEPEP_NET``, PAPER.md sections 5 and 6):

- ``deepep-normal``: DeepEP's normal (high-throughput) kernels: GPU-initiated puts (no host
  proxy, no world barrier), two kernels per dispatch (count notify, then dispatch) and one per
  combine, FP8 rows on the dispatch wire (BF16 combine); run with the ``relay`` dispatch
  (one NIC crossing per token and node, NVLink fan-out) and ``reduce`` combine.
- ``deepep-ll``: DeepEP's low-latency kernels: the same GPU-initiated puts straight to the
  computing GPU (``a2av`` both ways, one row per entry), one kernel per phase.
- ``deepep-ll-cols``: ``deepep-ll`` for Zepp's table-routed variants: one row per (token, GPU)
  both ways (``dedup``, outputs of a token's experts on one GPU summed there), and GEMM 2 in
  column splits (as many as ``zepp.planner.overlap.granularity.column_splits`` chooses per batch) whose
  epilogues send their slice of the partials at once, so the combine overlaps the rest of GEMM 2
  (weights still read once; a launch and a message per split).
- ``deepep-ll-relay``: a hierarchical low-latency kernel for Zepp's table-routed ``relay`` /
  ``reduce`` variant (one kernel per phase, GPU-initiated, worst-case buffers, no host sync, as
  NVIDIA's Hybrid-EP): a token crosses the NIC once per node to the GPU of its local index, which
  forwards it over NVLink chunk by chunk as it arrives (``chunked``, DeepEP's normal-kernel
  pipelining); partials are reduced in the node before the NIC.
- ``deepep-overlap``: ``deepep-normal``'s figures with Zepp's dispatch groups and combine waves
  (Zepp's overlap on DeepEP's transport, not a DeepEP kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class Net:
    """Calibrated implementation figures of the network stack (see ``zepp.sim.calibrate``).

    ``put_c0 + put_c1 * W``: seconds of fixed cost of one cross-node put through the host proxy
    in a job of ``W`` ranks; ``nic_eff``: fraction of the NIC's nominal rate that bulk puts
    reach; ``proxy_inflight``: puts one proxy keeps in flight (PAPER.md section 7: 14-15), so a
    non-blocking put holds the proxy for ``put / proxy_inflight``; ``signal``: a receiver's wait
    on a flag (2 us). ``call_cpu`` / ``cpu_per_byte``: host CPU seconds a rank spends before
    it posts one collective call, fixed and per byte it sends plus receives in that call (used
    by ``Mechanics.stage_collectives`` only; 0 for the GPU stacks, whose puts cost no host CPU).
    """

    put_c0: float = 50e-6
    put_c1: float = 2e-6
    nic_eff: float = 0.7
    proxy_inflight: float = 14.5
    signal: float = 2e-6
    call_cpu: float = 0.0
    cpu_per_byte: float = 0.0
    nvlink_eff: float = 1.0  # fraction of the cluster's NVLink rate the kernels reach

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
      | ``local-remote`` | ``stage`` (own rows, then the rows first delivered by each dispatch
      stage: ``zepp.planner.overlap.grouping.arrival_stage``); ``gemm2``: ``single`` | ``waves`` (one wave per
      destination node, ring order, own node last) | ``columns`` (``L`` column splits in sequence,
      each reading its slice of the weights once; a custom combine may start on each split).
    - ``gemm_eff_scale``: GEMM efficiency relative to the unfused grouped GEMM;
      ``per_expert_gemm``: one kernel per slot; ``pad_rows``: rows per slot rounded up.
    - ``stage_collectives``: each stage is one collective call per rank, as
      ``all_to_all_single`` on a host process group (``zepp.sim.collectives``); ``serial``
      puts are then ordered per call in ring order (every pair exchanges a message, empty or
      not) and the barriers should be ``None`` (a rank leaves a call when its own sends and
      receives are done).
    - ``proxy``: ``concurrent`` cross-node puts take an issue slot on the source's host proxy
      (NVSHMEM's proxy); ``False``: GPU-initiated puts (DeepEP), no proxy task.
    - ``kernel_calls``: ``(dispatch, combine)`` kernels per phase, each costing every rank a
      kernel launch plus one flag wait (``Net.signal``): dispatch ones before its first put
      leaves, combine ones after its last partial arrives.
    - ``gemm2_splits``: with ``gemm2 = "column-sends"``, GEMM 2 runs as this many column splits
      (0: as many as the planner chooses per batch)
      in sequence (each reading its slice of the weights once, plus a launch) and each split's
      slice of every partial leaves as soon as the split is done (its own message; one-stage
      combines only); the receivers' combine kernel waits for every slice.
    - ``dispatch_value_bytes``: bytes per hidden value on the dispatch wire (``None``: the
      model's dtype); the combine always moves the model's dtype.
    - ``serial_put``: seconds of fixed cost of one cross-node put of the ``serial`` stages where
      the system's own measured figure is known (``None``: the calibrated ``Net.put(W)``).
    - ``chunked``: messages on a relay path move as a stream of chunks and a forwarder passes
      each chunk on as it lands (DeepEP's normal kernels; ``zepp.sim.chunks``).
    - ``ordered_sends``: (chunked mechanics with dispatch groups) each GPU sends its dispatch
      messages per link kind one send class after another, so every receiver's groups land in
      the order its GEMMs take them (``zepp.sim.chunks.order_sends``).
    - ``predispatch``: rows no plan can reroute (straight to the single copy of an expert in the
      owner's node) leave after the gather, during planning, in one more kernel call
      (``zepp.sim.predispatch``).
    - ``comm_sms``: streaming multiprocessors the communication kernels hold while a phase's
      transfers overlap its GEMMs (forwarding, pre-reducing, signalling); a GEMM that runs beside
      them (a phase with more than one GEMM) gets the other ``sms - comm_sms`` (0: nothing taken).
    - ``hbm_passes``: rows are packed and unpacked by separate memory-bound kernels: each rank
      gathers the rows it sends into its send buffers before its first dispatch message leaves,
      a GEMM's input rows are gathered into expert order before it and its output rows scattered
      into the combine's buffers after it, each pass reading and writing every row once at the
      GPU's HBM rate (``False``: kernels that read and write the rows in place as they move them,
      DeepEP's and COMET's fused ones).
    - ``fenced_signals``: a put-with-signal through the host proxy runs as put, fence, signal, and
      the fence is a quiet (NVSHMEM's libfabric transport, Slingshot's): the proxy thread waits
      for every put it has outstanding before it takes the next request, so one rank's
      puts-with-signal go one after another, each a blocking put (``Net.put``, as ``a2av``'s),
      in ring order of their destinations (COMET's combine; ``zepp.sim.phases.comet``).
    - ``sim_cost``: CPU time of simulating a layer with these mechanics relative to
      ``serial-barrier``'s (16 nodes, K2, 4 MB; measured once): only ``zepp bench``'s progress
      estimate and the order of its units of work read it, never a simulated figure.
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
    stage_collectives: bool = False
    proxy: bool = True
    kernel_calls: tuple[int, int] = (0, 0)
    dispatch_value_bytes: float | None = None
    gemm2_splits: int = 1
    serial_put: float | None = None
    chunked: bool = False
    ordered_sends: bool = False
    predispatch: bool = False
    comm_sms: int = 0
    hbm_passes: bool = False
    fenced_signals: bool = False
    sim_cost: float = 1.0


# DeepEP on 8-GPU NVSwitch nodes with one 400 Gb/s NIC per GPU (PAPER.md section 5):
# - put_c0: one GPU-initiated RDMA put's fixed cost, "RDMA one-way latency about 1-2 us raw"
#   (the upper figure); put_c1 = 0: no host proxy whose queue grows with the job.
# - nic_eff = 1: DeepEP's normal kernels reach "43-58 GB/s RDMA bottleneck bandwidth at EP
#   16-64", which brackets the NDR NIC's achieved "45-48 GB/s" (the presets' nic_bw, 46 GB/s):
#   its kernels run the NIC at its achieved rate.
# - nvlink_eff: DeepEP's "153-158 GB/s NVLink intra-node" (the lower figure) over NCCL's
#   "about 370 GB/s effective per GPU ... on 8-GPU NVSwitch boards" (the presets' NVLink rate).
# - signal: a receiver's flag wait, 2 us (PAPER.md section 7, as for the paper's testbeds).
# Not fitted to anything; tests/sim/test_sim_today.py checks the low-latency kernels against DeepEP's
# published "dispatch 77-194 us, combine 114-369 us for EP 8-256" at 128 tokens.
DEEPEP_NET = Net(put_c0=2e-6, put_c1=0.0, nic_eff=1.0, signal=2e-6, nvlink_eff=153e9 / 370e9)
# FP8 values plus one fp32 scale per 128 values: DeepEP's published benchmarks (both kernel
# modes) dispatch FP8 and combine BF16 (DeepEP's README; not a PAPER.md figure).
DEEPEP_FP8 = 1.0 + 4.0 / 128


# deepep-ll-cols: GEMM 2 in column splits, each sending its slice of the partials from its epilogue
# (puts issued by the GEMM kernel, as COMET's tile-level sends; no extra kernel); gemm2_splits = 0:
# the count is chosen per batch (zepp.planner.overlap.granularity.column_splits, in zepp.sim.run).
COMET_FUSED_EFF = 62.5 / 132.5  # fused tile-gated vs unfused grouped GEMM TFLOP/s (PAPER.md section 7)
# EPIC's serial relay stages: "about 0.34-0.45 ms per proxy put per round" (PAPER.md section 7, epic); midpoint.
EPIC_RELAY_PUT = 0.5 * (0.34e-3 + 0.45e-3)
# The communication kernels that run beside an overlapped GEMM: DeepEP's normal kernels hold 20 SMs
# by default (Buffer.num_sms = 20, "20 of 132 SMs on H100"; TODAY.md, issue 26); the same figure is
# taken for Zepp's forward / pre-reduce kernels on the paper's testbeds (no published figure of theirs).
COMM_SMS = 20
# PAPER.md section 7's stacks move rows with NVSHMEM puts from packed symmetric buffers: packing and
# unpacking are kernels of their own (hbm_passes); DeepEP's and COMET's kernels read rows in place.
_NVSHMEM = dict(hbm_passes=True)
_CONCURRENT = dict(dispatch_puts="concurrent", combine_puts="concurrent", dispatch_barrier=None, combine_barrier=None)
_DEEPEP = dict(_CONCURRENT, proxy=False, dispatch_value_bytes=DEEPEP_FP8)

MECHANICS: dict[str, Mechanics] = {
    # PAPER.md section 7, a2av: "one blocking put per destination rank, in ring order (W-1 puts in
    # series per rank), then a world barrier"; unfused grouped GEMM after the barrier.
    "serial-barrier": Mechanics(**_NVSHMEM),
    "signals": Mechanics(**_CONCURRENT, **_NVSHMEM, sim_cost=0.8),
    "zepp-overlap": Mechanics(**_CONCURRENT, **_NVSHMEM, gemm1="arrival", gemm2="waves", comm_sms=COMM_SMS),
    # PAPER.md section 7, eplb: "a staged all-to-all (one non-blocking put per destination, two
    # team barriers per call; hidden rows and fp32 route weights as separate calls), per-expert
    # GEMM, combine as the mirror image". The team barrier is Net.barrier (ceil(log2 W) rounds at
    # the a2av-fitted put), dearer than EPLB's measured phase times allow at 64 ranks
    # (benchmarks/results/baseline_mechanics.md); its planner is the eplb-torch planning model.
    "eplb-staged": Mechanics(**_CONCURRENT, **_NVSHMEM, calls=2, per_expert_gemm=True, sim_cost=2.7),
    # PAPER.md section 7, epic: relay dispatch whose NIC stage (stage 1) is a round of blocking
    # proxy puts, one per remote node, at EPIC_RELAY_PUT each; "hierarchical combine with one round
    # of N-1 puts after GEMM 2" (reduce-direct's stage 1), the same serial proxy puts; no barrier.
    "epic-relay": Mechanics(dispatch_puts="serial", serial_stages=(1,), combine_puts="serial",
                            dispatch_barrier=None, combine_barrier=None, serial_put=EPIC_RELAY_PUT, sim_cost=0.55,
                            **_NVSHMEM),
    # PAPER.md section 7, moonep: "segments padded to 128 rows", "two all-to-all calls (rows, then
    # fp32 weights), two barriers each"; the pulls from the hot home ranks are moonep-pulls.
    "moonep": Mechanics(**_CONCURRENT, **_NVSHMEM, calls=2, pad_rows=128, sim_cost=1.6),
    # PAPER.md section 7, comet: GEMM tiles wait on per-source flags, "so only the intra-node part
    # overlaps compute" (GEMM 1 in two groups: own node, remote); GEMM 2 is split by columns, not
    # by destination ("GEMM 2 publishes per column-split barriers"; each split reads its slice of
    # w2 once: one GEMM 2 of weight reads);
    # the fused tile-gated kernel at COMET_FUSED_EFF. Its dense all-gather and ring combine are the
    # comet-allgather and comet-ring-combine phases (zepp.sim.phases). Its combine's puts-with-signal
    # are fenced (one after another per GPU, each a blocking put): NVSHMEM's put-with-signal through the
    # host proxy is put + fence + signal and its libfabric transport's fence is a quiet
    # (transport_common.cpp nvshmemt_put_signal, libfabric.cpp nvshmemt_libfabric_fence, commit 2d820ea).
    "comet": Mechanics(**_CONCURRENT, gemm1="local-remote", gemm2="columns", gemm_eff_scale=COMET_FUSED_EFF,
                       fenced_signals=True, sim_cost=0.95),
    # PAPER.md section 7, fast: "rounds are synchronous and host-driven; nothing overlaps" (the
    # rounds, each ending in a world barrier, are the fast-rounds phase; one GEMM after them).
    "fast": Mechanics(dispatch_barrier=None, combine_barrier=None, sim_cost=0.35, **_NVSHMEM),
    "deepep-normal": Mechanics(**_DEEPEP, kernel_calls=(2, 1), chunked=True, sim_cost=0.8),
    "deepep-ll": Mechanics(**_DEEPEP, kernel_calls=(1, 1), sim_cost=0.8),
    "deepep-overlap": Mechanics(**_DEEPEP, kernel_calls=(2, 1), gemm1="arrival", gemm2="waves", chunked=True,
                                ordered_sends=True, predispatch=True, comm_sms=COMM_SMS),
    "deepep-ll-relay": Mechanics(**_DEEPEP, kernel_calls=(1, 1), chunked=True, sim_cost=0.8),
    "deepep-ll-cols": Mechanics(**_DEEPEP, kernel_calls=(1, 1), gemm2="column-sends", gemm2_splits=0,
                                sim_cost=1.0),
}


def mechanics(name: str) -> Mechanics:
    if name not in MECHANICS:
        raise ZeppInputError(f"unknown simulator mechanics {name!r}; choose one of {', '.join(MECHANICS)}")
    return MECHANICS[name]
