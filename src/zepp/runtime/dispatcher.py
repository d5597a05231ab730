"""The Dispatcher: runs a FlowPlan's dispatch and combine hop tables on torch.distributed.

One ``Dispatcher`` per process group (as DeepEP's ``Buffer``): it owns the staging buffers, plans
every batch identically on every rank (all-gather of the ids and gate weights,
``zepp.runtime.metadata``, then ``zepp.planner.plan_batch``), compiles its own rank's part
(``zepp.runtime.program``) and executes it stage by stage; the calls on the wire (groups, scopes,
all-to-alls, point-to-point chunks) are ``zepp.runtime.collectives``.

Execution modes, same hop tables, same bytes. The combine sums in one fixed order in every mode
(``zepp.runtime.program``), so each mode is bit-for-bit repeatable whatever the arrival timing;
across modes the expert GEMMs run on different row groups, which BLAS may round differently in
the last bit, so overlapped and blocking results agree to fp rounding (about 1e-7 in fp32):

- ``overlap=False``: per stage one blocking ``all_to_all_single`` with uneven splits.
- ``overlap=True``: the expert layer computes on groups as they arrive and the combine's stage 0
  goes out in waves (``zepp.runtime.overlap``: ``overlap_comm`` ``"collective"`` or ``"p2p"``,
  ``granularity`` ``"per-node"`` or ``"auto"``).

Wire dtypes: dispatch rows travel in the activation dtype. Combine partials accumulate in fp32
and travel in ``combine_dtype`` (default: the activation dtype, so the wire bytes equal the
planner's ``row_bytes = hidden * dtype_bytes``; pass ``torch.float32`` to send fp32 partials).

Ragged batches are first-class: rank ``r`` passes its own ``T_r`` tokens (zero is fine; see
``zepp.runtime.metadata``, and ``expect_tokens`` for a caller that knows every rank's count).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError
from zepp.model import MoESpec
from zepp.planner.batch import Stages, plan_batch
from zepp.planner.flows import DISPATCHES, check_transports
from zepp.planner.flows.call_scopes import CallScopes
from zepp.planner.overlap import OVERLAP_COMMS
from zepp.planner.routing import ROUTINGS
from zepp.planner.types import FlowPlan, Placement
from zepp.runtime.collectives import LinkCounter, all_to_all, plan_scopes, stage_groups
from zepp.runtime.metadata import gather_metadata
from zepp.runtime.overlap import CombineStream, arrivals
from zepp.runtime.program import RankProgram, Stage, compile_rank

__all__ = ["Dispatcher", "DispatchHandle", "ExpertInputs", "HOST_PARTS", "LinkCounter"]

# per-layer host work the Dispatcher times (``Dispatcher.timing``): the id/weight all-gather
# (``metadata``), routing and flows (``plan``), the plan's hop tables, every rank's, built on first
# use (``hops``), this rank's program and the call scopes (``compile``), the gate weights and
# staging buffers (``pack``); the stages are ``d<s>`` / ``c<s>``; ``host_cpu``: this process's CPU
# time (every thread, gloo's too, user and system) over those parts, against their wall time
HOST_PARTS = ("metadata", "plan", "hops", "compile", "pack")


@dataclass
class ExpertInputs:
    """Grouped-GEMM input: ``rows [n, H]`` sorted by local slot; ``counts [S]`` rows per slot;
    ``slot [n]`` (numpy) local slot of each row. Valid until the next ``dispatch``."""

    rows: torch.Tensor
    counts: np.ndarray
    slot: np.ndarray


@dataclass
class DispatchHandle:
    """What ``combine`` needs from ``dispatch``: the plan, this rank's program and the gate
    weights ``weights [n]`` (fp32) of the entries in expert-input order."""

    plan: FlowPlan
    prog: RankProgram
    weights: torch.Tensor
    dtype: torch.dtype
    inputs: ExpertInputs
    _held: torch.Tensor | None = field(default=None, repr=False)
    scopes: CallScopes | None = None  # per call (see ``plan_scopes``): which group runs it

    def call(self, phase: str, stage: int, wave: int = 0) -> int:
        """Index of a stage's (wave's) call in ``scopes``."""
        nd = len(self.prog.dispatch)
        if phase == "dispatch":
            return stage
        return nd + (wave if stage == 0 else self.prog.num_waves - 1 + stage)


class Dispatcher:
    """Expert-parallel dispatch/combine for one process group (see module docstring).

    ``spec``: the MoE layer shape; ``placement``: which expert each slot of each rank holds
    (``placement.ranks`` must equal the group size); ``gpus_per_node``: consecutive ranks that
    form a node (defaults to, and must match, the placement's); ``routing``:
    a name of ``zepp.registry.ROUTINGS``; ``relaxation``: C; ``dispatch`` / ``combine``: transports
    of ``zepp.registry`` (``combine=None``: the dispatch's natural one); ``overlap``: compute on arrival;
    ``device``: where tensors live (``cuda:i`` with NCCL); ``combine_dtype``: wire dtype of partials.

    Counters: ``counter.by_dst[phase] [R]`` bytes this rank sent per destination (``dispatch``,
    ``combine`` payload, ``metadata`` for the id/weight all-gather), cumulative until
    ``counter.reset()``. ``timing`` holds the last batch's ``metadata``/``plan``/``dispatch``/
    ``combine`` seconds; ``last_plan`` its FlowPlan; ``metadata_log`` the wall-clock times each
    batch's metadata all-gather began and ended on this rank.
    """

    def __init__(self, spec: MoESpec, placement: Placement, *, gpus_per_node: int | None = None,
                 routing: str = "zepp", relaxation: float = 0.25, dispatch: str = "zepp", combine: str | None = None,
                 overlap: bool = False, group=None, device=None, combine_dtype: torch.dtype | None = None,
                 overlap_comm: str = "collective", planner: str = "auto", granularity: str = "per-node",
                 figures=None):
        dispatch, combine = check_transports(dispatch, combine)
        if not DISPATCHES[dispatch].has_hops:
            raise ZeppInputError(f"the runtime executes hop tables; the {dispatch!r} dispatch has none")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        _check_layout(spec, placement, self.world, gpus_per_node)
        comm = _check_options(overlap_comm, planner, granularity)
        self.p2p = overlap and not comm.collective
        self.spec, self.placement, self.gpus_per_node = spec, placement, placement.gpus_per_node
        self.routing, self.relaxation = routing, relaxation
        self.dispatch_transport, self.combine_transport = dispatch, combine
        self.overlap = overlap
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.combine_dtype = combine_dtype
        # gloo's send/recv take host memory only: stage point-to-point chunks through the CPU
        self.host_p2p = dist.get_backend(self.group) == "gloo" and self.device.type == "cuda"
        self.planner = planner  # see plan()
        self.granularity = granularity
        self.figures = figures  # zepp.planner.overlap.granularity.Figures for granularity="auto" (None: a100 preset figures)
        self.last_granularity = None  # the last batch's zepp.planner.overlap.granularity.Granularity (auto only)
        self.counter = LinkCounter(self.world)
        self.timing: dict[str, float] = {}
        # (entered, left) wall-clock seconds of each batch's metadata all-gather, the last 1024: with
        # every rank's, a benchmark tells waiting for the last rank to arrive from the transfer after it
        self.metadata_log: deque = deque(maxlen=1024)
        self._buf: dict[str, torch.Tensor] = {}
        self.last_plan: FlowPlan | None = None
        self.expected_counts: np.ndarray | None = None  # [R] token counts of the coming batches (expect_tokens)
        self.last_ids: torch.Tensor | None = None  # [R, Tmax, k] ids of the last batch, -1 padded (device)
        self.last_counts: np.ndarray | None = None  # [R] token counts of the last batch
        # stages on the groups that carry them (zepp.planner.flows.call_scopes): only over the default group
        self.use_groups = group is None or group is dist.group.WORLD
        self.node_groups, self.rail_groups = (stage_groups(dist.group.WORLD, self.world, self.gpus_per_node)
                                              if self.use_groups and self.world > 1 else ([], []))
        self.calls_run = 0  # collective calls this rank ran (cumulative), and skipped (no rows on its group)
        self.calls_skipped = 0

    @classmethod
    def for_system(cls, spec: MoESpec, placement: Placement, system, relaxation: float = 0.25, **kw) -> "Dispatcher":
        """A Dispatcher running registry row ``system`` (a ``zepp.registry.System`` or its name)."""
        from zepp.registry import system as lookup

        s = lookup(system) if isinstance(system, str) else system
        if not s.supports("runtime"):
            raise ZeppInputError(f"system {s.name!r} does not run in the runtime (runs in: {', '.join(s.executors)})")
        if s.best_of:
            raise ZeppInputError(f"system {s.name!r} is the best of {', '.join(s.best_of)}; pick one of those")
        on_cpu = torch.device(kw.get("device") or "cpu").type == "cpu"
        auto = s.overlap_choice.chosen_per_batch(on_cpu, s.comm_choice)
        return cls(spec, placement, routing=s.routing, relaxation=relaxation, dispatch=s.dispatch, combine=s.combine,
                   overlap=s.overlap_choice.grouped, overlap_comm=s.overlap_comm,
                   granularity="auto" if auto else "per-node", **kw)

    # ------------------------------------------------------------------ buffers
    def _buffer(self, name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """A staging buffer of at least ``rows`` rows, grown (by 1.25x) when a batch needs more."""
        b = self._buf.get(name)
        if b is None or b.shape[0] < rows or b.shape[1] != cols or b.dtype != dtype:
            cap = max(rows, int(1.25 * b.shape[0]) if b is not None and b.shape[1] == cols else rows)
            b = torch.empty(cap, cols, dtype=dtype, device=self.device)
            self._buf[name] = b
        return b[:rows]

    def _idx(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.int64, device=self.device)

    # ------------------------------------------------------------------ planning
    def set_placement(self, placement: Placement) -> None:
        """Use a new placement from the next batch on (after weight swaps)."""
        if placement.ranks != self.world or placement.gpus_per_node != self.gpus_per_node:
            raise ZeppInputError("new placement has another cluster shape")
        self.placement = placement

    def expect_tokens(self, counts) -> None:
        """Every rank's token count ``counts [R]`` for the coming batches (same on every rank), or
        ``None``: the metadata all-gather then skips its count all-gather (and checks this rank's)."""
        self.expected_counts = None if counts is None else np.asarray(counts, np.int64).reshape(self.world)

    def plan(self, topk_ids_all, row_bytes: int) -> FlowPlan:
        """Plan ``topk_ids_all [R, T, k]`` (``-1`` padded; numpy or a tensor) identically on every rank.

        Which planner: ``zepp.planner.torch`` on the ids' device when they are a tensor off the CPU
        (the ids stay there; one host read of the table sizes brings the hop tables back for
        the program compiler), or when ``planner="torch"`` (constructor or attribute; a numpy
        batch then moves to ``self.device``); the numpy planner when ``self.planner == "numpy"``
        or otherwise. Both give the same plan element for element. Routings without a torch
        twin (``ROUTINGS[routing].torch_twin`` false) always use numpy.
        """
        on_device = isinstance(topk_ids_all, torch.Tensor) and topk_ids_all.device.type != "cpu"
        use_torch = ROUTINGS.choice(self.routing).torch_twin and (
            self.planner == "torch" or (self.planner == "auto" and on_device))
        device = None if isinstance(topk_ids_all, torch.Tensor) else self.device
        stages = Stages(self.routing, self.dispatch_transport, self.combine_transport)
        return plan_batch(topk_ids_all, self.placement, stages, row_bytes, self.relaxation,
                          backend="torch" if use_torch else "numpy", device=device, host=True)

    # ------------------------------------------------------------------ dispatch
    def _prepare(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DispatchHandle:
        if x.dim() != 2 or x.shape[1] != self.spec.hidden:
            raise ZeppInputError(f"x must be [tokens, {self.spec.hidden}], got {tuple(x.shape)}")
        if topk_ids.shape != (x.shape[0], self.spec.top_k) or topk_weights.shape != topk_ids.shape:
            raise ZeppInputError(f"topk_ids/topk_weights must be [{x.shape[0]}, {self.spec.top_k}], got "
                                 f"{tuple(topk_ids.shape)} / {tuple(topk_weights.shape)}")
        t0, entered = time.perf_counter(), time.time()
        c0 = time.process_time()
        batch = gather_metadata(self, topk_ids, topk_weights)
        self.last_ids, self.last_counts = batch.device_ids, batch.counts
        t1 = time.perf_counter()
        self.metadata_log.append((entered, entered + (t1 - t0)))
        plan = self.plan(batch.ids, x.shape[1] * x.element_size())
        gran = self._choose_granularity(plan) if self.overlap and self.granularity == "auto" else None
        th = time.perf_counter()
        plan.hop_tables  # noqa: B018 - built on first use: timed as their own part, not as this rank's compile
        t2 = time.perf_counter()
        prog = compile_rank(plan, self.rank, waves=self.overlap, granularity=gran)
        wmap = None if not self.overlap else (gran.wave_map() if gran is not None else
                                              np.arange(self.world // self.gpus_per_node))
        scopes = plan_scopes(plan, prog.num_waves, wmap) if self.use_groups else None
        t3 = time.perf_counter()
        self.last_plan = plan
        self.last_granularity = gran
        weights = batch.weights[self._idx(prog.e_owner), self._idx(prog.e_token), self._idx(prog.e_j)]
        held = self._buffer("held", prog.held_size, x.shape[1], x.dtype)
        held[: prog.tokens].copy_(x)
        rows = self._buffer("inputs", prog.n_entries, x.shape[1], x.dtype)
        self.timing = {"metadata": t1 - t0, "plan": th - t1, "hops": t2 - th, "compile": t3 - t2,
                       "pack": time.perf_counter() - t3, "host_cpu": time.process_time() - c0}
        inputs = ExpertInputs(rows, prog.counts, prog.e_slot)
        return DispatchHandle(plan, prog, weights, x.dtype, inputs, held, scopes=scopes)

    def _choose_granularity(self, plan: FlowPlan):
        """``zepp.planner.overlap.granularity.choose`` on this batch's plan with ``self.figures`` (default: the
        ``a100`` preset's figures at this shape); identical on every rank."""
        from zepp.planner.overlap.granularity import Figures, choose

        fig = self.figures
        if fig is None:
            from zepp.cluster import cluster_preset

            fig = self.figures = Figures.of(cluster_preset("a100", self.world // self.gpus_per_node,
                                                           self.gpus_per_node),
                                            overlap=0.0 if self.device.type == "cpu" else 1.0)
        return choose(plan, self.spec, fig)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """``x [T, H]``, ``topk_ids [T, k]``, ``topk_weights [T, k]`` -> ``(ExpertInputs, handle)``.

        Blocking: every stage runs as one ``all_to_all_single`` (with ``overlap=True`` it runs
        the point-to-point schedule and returns when everything arrived).
        """
        h = self._prepare(x, topk_ids, topk_weights)
        t0 = time.perf_counter()
        if self.overlap and not h.prog.single_gemm:
            for _ in self.arrivals(h):
                pass
        else:
            self.dispatch_blocking(h)
        self.timing["dispatch"] = time.perf_counter() - t0
        return h.inputs, h

    def dispatch_blocking(self, h: DispatchHandle) -> None:
        """Run a prepared batch's dispatch with one blocking all-to-all per stage (also what an
        overlapped Dispatcher does when the batch's granularity is one GEMM per phase)."""
        held = h._held
        for s, st in enumerate(h.prog.dispatch):
            send = self._gather_rows("send", held, st.send_idx)
            recv = held[st.recv_off: st.recv_off + st.n_recv]
            all_to_all(self, recv, send, st, "dispatch", h=h, stage=s)
        torch.index_select(held, 0, self._idx(h.prog.e_pos), out=h.inputs.rows)

    def dispatch_begin(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DispatchHandle:
        """Plan and stage a batch for ``arrivals`` (overlapped dispatch)."""
        return self._prepare(x, topk_ids, topk_weights)

    def arrivals(self, h: DispatchHandle):
        """Run the dispatch of ``h`` overlapped, yielding ``idx [m]`` (ascending positions in
        ``h.inputs.rows``, filled in) for each arrival group (``zepp.runtime.overlap.arrivals``)."""
        return arrivals(self, h)

    # ------------------------------------------------------------------ combine
    def combine(self, expert_outputs: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
        """``expert_outputs [n, H]`` (expert-input order) -> ``y [T, H]`` in the activation dtype:
        ``y[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` (fixed summation order, see
        ``zepp.runtime.program``)."""
        t0 = time.perf_counter()
        if self.overlap and not h.prog.single_gemm:
            cs = self.combine_begin(h)
            for grp in cs.waves():
                cs.submit(grp, expert_outputs[self._idx(grp)])
            y = cs.finish()
        else:
            y = self.combine_blocking(expert_outputs, h)
        self.timing["combine"] = time.perf_counter() - t0
        return y

    def combine_blocking(self, expert_outputs: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
        """The combine with one blocking all-to-all per stage (see ``dispatch_blocking``)."""
        prog = h.prog
        store = self._new_store(h, expert_outputs.shape[1])
        self._accumulate_entries(store, h, np.arange(prog.n_entries), expert_outputs)
        for s, st in enumerate(prog.combine):
            send = self._take_units(store, st.send_idx, h)
            recv = self._buffer("crecv", st.n_recv, store.shape[1], send.dtype)
            all_to_all(self, recv, send, st, "combine", h=h, stage=s)
            self._accumulate_received(store, recv, st)
        return self._final(store, h)

    def combine_begin(self, h: DispatchHandle) -> CombineStream:
        """Start an overlapped combine: iterate ``waves()``, ``submit`` each wave's outputs."""
        return CombineStream(self, h)

    # ------------------------------------------------------------------ helpers
    def _wire(self, h: DispatchHandle) -> torch.dtype:
        return self.combine_dtype or h.dtype

    def _gather_rows(self, name, src: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        out = self._buffer(name, idx.shape[0], src.shape[1], src.dtype)
        torch.index_select(src, 0, self._idx(idx), out=out)
        return out

    def _new_store(self, h: DispatchHandle, hidden: int) -> torch.Tensor:
        store = self._buffer("store", h.prog.store_size, hidden, torch.float32)
        store.zero_()
        return store

    def _accumulate_entries(self, store, h: DispatchHandle, idx: np.ndarray, out: torch.Tensor) -> None:
        """Add entries ``idx`` (outputs ``out [len(idx), H]``) into their units, in increasing j."""
        prog = h.prog
        contrib = out.to(torch.float32) * h.weights[self._idx(idx)][:, None]
        ej = prog.e_j[idx]
        for j in range(prog.top_k):
            m = np.flatnonzero(ej == j)
            if m.size:
                store.index_add_(0, self._idx(prog.e_unit[idx[m]]), contrib[self._idx(m)])

    def _take_units(self, store, send_idx: np.ndarray, h: DispatchHandle) -> torch.Tensor:
        """Gather the units to send (moving them: their store rows become zero)."""
        ti = self._idx(send_idx)
        out = store[ti].to(self._wire(h))
        store[ti] = 0.0
        return out

    def _accumulate_received(self, store, recv: torch.Tensor, st: Stage) -> None:
        r32 = recv.to(torch.float32)
        for pos, sidx in st.rounds:
            store.index_add_(0, self._idx(sidx), r32[self._idx(pos)])

    def _final(self, store, h: DispatchHandle) -> torch.Tensor:
        prog = h.prog
        y = torch.zeros(prog.tokens, store.shape[1], dtype=torch.float32, device=self.device)
        for tok, sidx in prog.final_rounds:
            y.index_add_(0, self._idx(tok), store[self._idx(sidx)])
        return y.to(h.dtype)


def _check_layout(spec: MoESpec, placement: Placement, world: int, gpus_per_node: int | None) -> None:
    """The placement fits the process group (``world`` ranks), the node size asked and the model."""
    if placement.ranks != world:
        raise ZeppInputError(f"placement has {placement.ranks} ranks but the process group has {world}")
    if gpus_per_node is not None and gpus_per_node != placement.gpus_per_node:
        raise ZeppInputError(f"gpus_per_node={gpus_per_node} but the placement was built for "
                             f"{placement.gpus_per_node} GPUs per node")
    if placement.num_experts != spec.num_experts:
        raise ZeppInputError(f"placement has {placement.num_experts} experts, model {spec.name!r} has "
                             f"{spec.num_experts}")


def _check_options(overlap_comm: str, planner: str, granularity: str):
    """The record of ``overlap_comm`` (``OVERLAP_COMMS``), once ``planner`` and ``granularity`` are known."""
    comm = OVERLAP_COMMS.choice(overlap_comm)
    if planner not in ("auto", "numpy", "torch"):
        raise ZeppInputError(f"planner must be 'auto', 'numpy' or 'torch', got {planner!r}")
    if granularity not in ("per-node", "auto"):
        raise ZeppInputError(f"granularity must be 'per-node' or 'auto', got {granularity!r}")
    return comm
