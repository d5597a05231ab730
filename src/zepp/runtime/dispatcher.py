"""The Dispatcher: runs a FlowPlan's dispatch and combine hop tables on torch.distributed.

One ``Dispatcher`` per process group (as DeepEP's ``Buffer``): it owns the staging buffers, plans
every batch identically on every rank (all-gather of the ids and gate weights, then
``zepp.planner.plan_batch``), compiles its own rank's part
(``zepp.runtime.program``) and executes it stage by stage.

Execution modes, same hop tables, same bytes. The combine sums in one fixed order in every mode
(``zepp.runtime.program``), so each mode is bit-for-bit repeatable whatever the arrival timing;
across modes the expert GEMMs run on different row groups, which BLAS may round differently in
the last bit, so overlapped and blocking results agree to fp rounding (about 1e-7 in fp32):

- ``overlap=False``: per stage one blocking ``all_to_all_single`` with uneven splits.
- ``overlap=True``: the expert layer computes on groups as they arrive: its own tokens while
  stage 0 is on the wire, each stage's rows while the next stage is on the wire; the combine's
  stage 0 goes out in waves, one per destination node in ring order (own node last), each sent
  as soon as its second GEMM is done while the next wave computes. ``overlap_comm="collective"``
  (default) posts each stage / wave as one asynchronous ``all_to_all_single``;
  ``overlap_comm="p2p"`` posts ``batch_isend_irecv`` chunks instead and also splits a stage
  into own-node rows (computed first) and remote rows. Every rank posts the same sequence of
  operations (wave ``i`` sends to node ``node+i+1`` and receives from ``node-i-1``), as NCCL
  needs. Waits happen in a fixed order, never "whichever comes first".
- ``granularity="auto"`` (with ``overlap``; registry overlap ``zepp-auto``): per batch,
  ``zepp.planner.overlap.granularity.choose`` picks how many dispatch groups and combine waves to run from the
  FlowPlan and the cost figures ``figures`` (the same on every rank, so every rank picks the
  same): GEMM 1 then runs per coarse dispatch group (``zepp.planner.overlap.grouping``'s groups merged), each as
  soon as the arrival events it needs are in, and the combine's stage 0 in that many waves.
  ``"per-node"`` (default) keeps the arrival-event groups and one wave per node.

Wire dtypes: dispatch rows travel in the activation dtype. Combine partials accumulate in fp32
and travel in ``combine_dtype`` (default: the activation dtype, so the wire bytes equal the
planner's ``row_bytes = hidden * dtype_bytes``; pass ``torch.float32`` to send fp32 partials).

Ragged batches are first-class: rank ``r`` passes its own ``T_r`` tokens (zero is fine: a rank
with nothing to send still takes part). The metadata all-gather first exchanges the counts
``T_r``, then the ids and gate weights padded with ``-1`` / ``0`` to ``Tmax = max T_r``; the planner
sees ``topk_ids [R, Tmax, k]`` with ``-1`` for missing entries, which produce no hops, so padding
never reaches the wire. A caller that already knows every rank's count for a step (a serving
engine, once per step for all layers) passes it with ``expect_tokens`` and saves that collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError
from zepp.planner.batch import Stages, plan_batch
from zepp.planner.flows import DISPATCHES, check_transports
from zepp.planner.overlap import OVERLAP_COMMS
from zepp.planner.routing import ROUTINGS
from zepp.model import MoESpec
from zepp.planner.types import FlowPlan, Placement
from zepp.planner.overlap.grouping import combine_wave
from zepp.planner.flows.call_scopes import NODE, RAIL, CallScopes, call_scopes
from zepp.runtime.program import RankProgram, Stage, compile_rank

# per-layer host work the Dispatcher times (``Dispatcher.timing``): the id/weight all-gather
# (``metadata``), routing and flows (``plan``), this rank's program and the call scopes
# (``compile``), the gate weights and staging buffers (``pack``); the stages are ``d<s>`` / ``c<s>``
HOST_PARTS = ("metadata", "plan", "compile", "pack")

_GROUPS: list = []  # [(world group, ranks, L, node groups, rail groups)]: created once per process group


def stage_groups(world, ranks: int, gpus_per_node: int) -> tuple[list, list]:
    """``(node groups [N], rail groups [L])`` of process group ``world`` (the default group):
    created on first use, by every rank in the same order (``new_group`` is collective over the
    default group), then reused by every Dispatcher of the process. A group of one rank is ``None``."""
    for w, r, l, nodes, rails in _GROUPS:
        if w is world and r == ranks and l == gpus_per_node:
            return nodes, rails
    L, N = gpus_per_node, ranks // gpus_per_node

    def new(members):
        return dist.new_group(members) if len(members) > 1 else None

    nodes = [new(list(range(n * L, n * L + L))) for n in range(N)]
    rails = [new(list(range(q, ranks, L))) for q in range(L)]
    _GROUPS.append((world, ranks, L, nodes, rails))
    return nodes, rails


def plan_scopes(plan: FlowPlan, waves: int, wmap: np.ndarray | None) -> CallScopes:
    """Scopes (``zepp.planner.flows.call_scopes``) of a plan's calls: dispatch stages, then combine
    stage 0 (``waves`` calls, wave of a hop ``wmap[combine_wave]``; ``wmap=None``: one call), then
    the other combine stages. The same on every rank (the plan is)."""
    d, c, L = plan.dispatch, plan.combine, plan.gpus_per_node
    R = plan.routing.topk_ids.shape[0]
    nd = d.num_stages
    if wmap is not None:
        w = wmap[combine_wave(c.owner, c.src, L, R // L)]
        c_call = np.where(c.stage == 0, w, waves - 1 + c.stage.astype(np.int64))
        n_cc = waves + max(c.num_stages - 1, 0) if c.num_stages else 0
    else:
        c_call, n_cc = c.stage.astype(np.int64), c.num_stages
    call = np.concatenate([d.stage.astype(np.int64), nd + c_call])
    return call_scopes(call, np.concatenate([d.src, c.src]), np.concatenate([d.dst, c.dst]), nd + n_cc, R, L)



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


class LinkCounter:
    """Bytes this rank put on the wire, per destination rank, per phase."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.reset()

    def reset(self) -> None:
        self.by_dst = {p: np.zeros(self.ranks, np.int64) for p in ("dispatch", "combine", "metadata")}

    def add(self, phase: str, dst: int, nbytes: int) -> None:
        self.by_dst[phase][dst] += int(nbytes)

    def split(self, phase: str, rank: int, gpus_per_node: int) -> dict:
        """``{"nvlink": bytes to own-node ranks, "nic": bytes to other nodes}``."""
        b = self.by_dst[phase]
        same = (np.arange(self.ranks) // gpus_per_node) == rank // gpus_per_node
        return {"nvlink": int(b[same].sum()), "nic": int(b[~same].sum())}


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
    ``combine`` seconds; ``last_plan`` its FlowPlan.
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
        if placement.ranks != self.world:
            raise ZeppInputError(f"placement has {placement.ranks} ranks but the process group has {self.world}")
        if gpus_per_node is not None and gpus_per_node != placement.gpus_per_node:
            raise ZeppInputError(f"gpus_per_node={gpus_per_node} but the placement was built for "
                                 f"{placement.gpus_per_node} GPUs per node")
        if placement.num_experts != spec.num_experts:
            raise ZeppInputError(f"placement has {placement.num_experts} experts, model {spec.name!r} has "
                                 f"{spec.num_experts}")
        self.spec = spec
        self.placement = placement
        self.gpus_per_node = placement.gpus_per_node
        self.routing = routing
        self.relaxation = relaxation
        self.dispatch_transport, self.combine_transport = dispatch, combine
        self.overlap = overlap
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.combine_dtype = combine_dtype
        # gloo's send/recv take host memory only: stage point-to-point chunks through the CPU
        self.host_p2p = dist.get_backend(self.group) == "gloo" and self.device.type == "cuda"
        self.p2p = overlap and not OVERLAP_COMMS.choice(overlap_comm).collective
        if planner not in ("auto", "numpy", "torch"):
            raise ZeppInputError(f"planner must be 'auto', 'numpy' or 'torch', got {planner!r}")
        self.planner = planner  # see plan()
        if granularity not in ("per-node", "auto"):
            raise ZeppInputError(f"granularity must be 'per-node' or 'auto', got {granularity!r}")
        self.granularity = granularity
        self.figures = figures  # zepp.planner.overlap.granularity.Figures for granularity="auto" (None: a100 preset figures)
        self.last_granularity = None  # the last batch's zepp.planner.overlap.granularity.Granularity (auto only)
        self.counter = LinkCounter(self.world)
        self.timing: dict[str, float] = {}
        self._buf: dict[str, torch.Tensor] = {}
        self.last_plan: FlowPlan | None = None
        self._expected: np.ndarray | None = None  # [R] token counts of the coming batches (expect_tokens)
        self.last_ids: torch.Tensor | None = None  # [R, Tmax, k] ids of the last batch, -1 padded (device)
        # stages on the groups that carry them (zepp.planner.flows.call_scopes): only over the default group
        self.use_groups = group is None or group is dist.group.WORLD
        self._node_g, self._rail_g = (stage_groups(dist.group.WORLD, self.world, self.gpus_per_node)
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
        ``None``: ``_gather_metadata`` then skips its count all-gather (and checks this rank's)."""
        self._expected = None if counts is None else np.asarray(counts, np.int64).reshape(self.world)

    def _gather_counts(self, T: int) -> np.ndarray:
        """``[R]`` tokens per rank (one small all-gather, unless ``expect_tokens`` told us)."""
        if self._expected is not None:
            if int(self._expected[self.rank]) != T:
                raise ZeppInputError(f"rank {self.rank}: expect_tokens said {int(self._expected[self.rank])} tokens, "
                                     f"the batch has {T}")
            return self._expected
        c = torch.tensor([T], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(c) for _ in range(self.world)]
        dist.all_gather(out, c, group=self.group)
        for d in range(self.world):
            if d != self.rank:
                self.counter.add("metadata", d, c.element_size())
        return torch.cat(out).cpu().numpy()

    def _gather_metadata(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """All-gather this rank's ``topk_ids [T_r, k]`` and ``topk_weights [T_r, k]``.

        Returns ``(ids [R, Tmax, k] int64, w [R, Tmax, k] fp32 tensor)``, the ids a tensor on the
        dispatcher's device when that is not the CPU (so the planner runs there), else numpy; ids of missing
        tokens are ``-1`` and their weights 0. The device copy of the ids is ``self.last_ids``
        (for a planner on the device); ``self.last_counts [R]`` holds the counts ``T_r``.
        """
        T, k = topk_ids.shape
        counts = self._gather_counts(T)
        Tmax = int(counts.max()) if counts.size else 0
        packed = torch.full((Tmax, 2 * k), -1, dtype=torch.int32, device=self.device)
        packed[:, k:] = 0
        if T:
            packed[:T, :k] = topk_ids.to(self.device, torch.int32)
            packed[:T, k:] = topk_weights.to(self.device, torch.float32).view(torch.int32)
        out = [torch.empty_like(packed) for _ in range(self.world)]
        dist.all_gather(out, packed, group=self.group)
        nbytes = packed.numel() * packed.element_size()
        for d in range(self.world):
            if d != self.rank:
                self.counter.add("metadata", d, nbytes)
        allp = torch.stack(out)
        self.last_ids = allp[:, :, :k].to(torch.int64)
        self.last_counts = counts
        # on a GPU the ids stay there for the device planner; on the CPU numpy plans them
        ids = self.last_ids if self.last_ids.device.type != "cpu" else self.last_ids.numpy()
        w = allp[:, :, k:].contiguous().view(torch.float32)
        return ids, w

    def plan(self, topk_ids_all, row_bytes: int) -> FlowPlan:
        """Plan ``topk_ids_all [R, T, k]`` (``-1`` padded; numpy or a tensor) identically on every rank.

        Which planner: ``zepp.planner.torch`` on the ids' device when they are a tensor off the CPU
        (the ids stay there; one host read of the table sizes brings the hop tables back for
        the program compiler), or when ``planner="torch"`` (constructor or attribute; a numpy
        batch then moves to ``self.device``); the numpy planner when ``self.planner == "numpy"``
        or otherwise. Both give the same plan element for element. Routings without a torch
        planner (``moonep``) always use numpy.
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
        t0 = time.perf_counter()
        ids_all, w_all = self._gather_metadata(topk_ids, topk_weights)
        t1 = time.perf_counter()
        plan = self.plan(ids_all, x.shape[1] * x.element_size())
        gran = self._choose_granularity(plan) if self.overlap and self.granularity == "auto" else None
        t2 = time.perf_counter()
        prog = compile_rank(plan, self.rank, waves=self.overlap, granularity=gran)
        wmap = None if not self.overlap else (gran.wave_map() if gran is not None else
                                              np.arange(self.world // self.gpus_per_node))
        scopes = plan_scopes(plan, prog.num_waves, wmap) if self.use_groups else None
        t3 = time.perf_counter()
        self.last_plan = plan
        self.last_granularity = gran
        weights = w_all[self._idx(prog.e_owner), self._idx(prog.e_token), self._idx(prog.e_j)]
        held = self._buffer("held", prog.held_size, x.shape[1], x.dtype)
        held[: prog.tokens].copy_(x)
        rows = self._buffer("inputs", prog.n_entries, x.shape[1], x.dtype)
        self.timing = {"metadata": t1 - t0, "plan": t2 - t1, "compile": t3 - t2,
                       "pack": time.perf_counter() - t3}
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
            self._a2a(recv, send, st, "dispatch", h=h, stage=s)
        torch.index_select(held, 0, self._idx(h.prog.e_pos), out=h.inputs.rows)

    def dispatch_begin(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DispatchHandle:
        """Plan and stage a batch for ``arrivals`` (overlapped dispatch)."""
        return self._prepare(x, topk_ids, topk_weights)

    def arrivals(self, h: DispatchHandle):
        """Run the dispatch point-to-point, yielding ``idx [m]`` (ascending positions in
        ``h.inputs.rows``, filled in) for each arrival group, always while later transfers are in
        flight: own tokens (while stage 0 is on the wire), then per stage the rows from the own
        node (while the remote ones arrive) and the rows from remote nodes (while the next stage
        is on the wire). Groups and wait order are fixed by the plan, never by arrival timing."""
        prog, held = h.prog, h._held
        groups = _ArrivalGroups(self, h)
        pending = [0]  # events whose groups are complete but not yet handed out
        for s, st in enumerate(prog.dispatch):
            send = self._gather_rows("send", held, st.send_idx)
            recv = held[st.recv_off: st.recv_off + st.n_recv]
            if not self.p2p:  # one asynchronous all-to-all per stage
                work = self._a2a(recv, send, st, "dispatch", wave=0, async_op=True, h=h, stage=s)
                yield from groups.ready(pending)
                work.wait()
                pending = [(1 + 2 * s, 2 + 2 * s)]
                continue
            yield from self._p2p_stage(prog, s, st, send, recv, groups, pending)
            pending = [2 + 2 * s]
        yield from groups.ready(pending)
        if prog.group_need is not None:  # groups whose rows need no event beyond the last (empty plans)
            yield from groups.ready([np.iinfo(np.int64).max])

    def _p2p_stage(self, prog: RankProgram, s: int, st: Stage, send, recv, groups: "_ArrivalGroups", pending):
        """Dispatch stage ``s`` point to point: post every chunk, hand out the groups ``pending``
        completed, wait for the own node's sources and hand out their rows while the remote ones
        arrive, then wait for those (in the plan's fixed order) and for the sends."""
        L, N = self.gpus_per_node, self.world // self.gpus_per_node
        works, send_works = self._p2p(recv, send, st, "dispatch", tag=s, wave=0)
        yield from groups.ready(pending)
        order = [q for stage, q in prog.events if stage == s]
        for remote in (False, True):
            for q in order:
                if q in works and ((q // L - self.rank // L) % N != 0) == remote:
                    works[q].wait()
            if not remote:  # own-node rows are in: compute them while remote rows arrive
                yield from groups.ready([1 + 2 * s])
        for w in send_works:
            w.wait()

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
            self._a2a(recv, send, st, "combine", h=h, stage=s)
            self._accumulate_received(store, recv, st)
        return self._final(store, h)

    def combine_begin(self, h: DispatchHandle) -> "CombineStream":
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

    def _a2a(self, recv: torch.Tensor, send: torch.Tensor, st: Stage, phase: str, wave: int = 0,
             async_op: bool = False, h: DispatchHandle | None = None, stage: int = 0):
        """All-to-all of one wave of a stage (``W == 1``: the whole stage). ``send``/``recv`` hold
        exactly that wave's rows, by destination / by source. With the handle's scopes the call
        runs on the group that carries it (a node's or a rail's), or not at all where that group
        moves nothing (then only this rank's rows to itself are copied)."""
        sc = st.send_counts[:, wave]
        rc = st.recv_counts[:, wave]
        row = send.shape[1] * send.element_size()
        for d in np.flatnonzero(sc).tolist():
            self.counter.add(phase, d, sc[d] * row)
        t0 = time.perf_counter()
        key = f"{phase[0]}{stage}" + (f"w{wave}" if st.send_counts.shape[1] > 1 else "")
        group, members = self.group, None
        if h is not None and h.scopes is not None:
            k = h.call(phase, stage, wave)
            kind = int(h.scopes.kind[k])
            if not h.scopes.active[k, self.rank]:
                self.calls_skipped += 1
                r = self.rank
                n = int(sc[r])
                if n:
                    recv[int(rc[:r].sum()): int(rc[:r].sum()) + n].copy_(send[int(sc[:r].sum()): int(sc[:r].sum()) + n])
                return _Done()
            if kind == NODE:
                group = self._node_g[self.rank // self.gpus_per_node]
                members = slice(self.rank // self.gpus_per_node * self.gpus_per_node,
                                (self.rank // self.gpus_per_node + 1) * self.gpus_per_node)
            elif kind == RAIL:
                group = self._rail_g[self.rank % self.gpus_per_node]
                members = slice(self.rank % self.gpus_per_node, self.world, self.gpus_per_node)
        if members is not None:
            sc, rc = sc[members], rc[members]
        self.calls_run += 1
        work = dist.all_to_all_single(recv, send, rc.tolist(), sc.tolist(), group=group, async_op=async_op)
        if not async_op:
            self.timing[key] = self.timing.get(key, 0.0) + time.perf_counter() - t0
        return work

    def _p2p(self, recv: torch.Tensor, send: torch.Tensor, st: Stage, phase: str, tag: int, wave: int,
             send_offset: int = 0):
        """Post wave ``wave`` of a stage's point-to-point chunks as one batch (every rank posts
        wave ``i`` at the same point, so the batches pair up, as NCCL needs). ``send`` holds the
        stage's send rows from position ``send_offset`` on (wave-major, then destination).
        Returns ``({src: recv work}, [send works])``; an own-rank chunk is copied locally."""
        R, W = st.send_counts.shape
        so = np.r_[0, np.cumsum(st.send_counts.T.ravel())]
        ro = np.r_[0, np.cumsum(st.recv_counts.T.ravel())]
        row = send.shape[1] * send.element_size()
        ops, kinds = [], []
        base_tag = (0 if phase == "dispatch" else 1 << 12) + tag * 64 + wave
        for q in range(R):
            nr = int(st.recv_counts[q, wave])
            a = int(ro[wave * R + q])
            if nr and q != self.rank:
                buf = recv[a: a + nr]
                if self.host_p2p:
                    buf = torch.empty(buf.shape, dtype=buf.dtype)
                ops.append(dist.P2POp(dist.irecv, buf, q, self.group, base_tag))
                kinds.append(("r", q, recv[a: a + nr] if self.host_p2p else None))
        for q in range(R):
            ns = int(st.send_counts[q, wave])
            a = int(so[wave * R + q]) - send_offset
            if not ns:
                continue
            self.counter.add(phase, q, ns * row)
            if q == self.rank:
                b = int(ro[wave * R + q])
                recv[b: b + ns].copy_(send[a: a + ns])
            else:
                chunk = send[a: a + ns].cpu() if self.host_p2p else send[a: a + ns]
                ops.append(dist.P2POp(dist.isend, chunk, q, self.group, base_tag))
                kinds.append(("s", q, None))
        works = dist.batch_isend_irecv(ops) if ops else []
        recv_w, send_w = {}, []
        if len(works) == len(ops):
            for (kind, q, dev), w, op in zip(kinds, works, ops):
                if kind == "r":
                    recv_w[q] = _HostStaged(w, op.tensor, dev) if dev is not None else w
                else:
                    send_w.append(w)
        else:  # a coalesced work (NCCL): one wait covers every op
            done = _AllOf(works)
            recv_w = {q: done for kind, q, _ in kinds if kind == "r"}
        return recv_w, send_w


class _ArrivalGroups:
    """The expert-input rows of an overlapped dispatch, handed out in groups: the rows of each
    arrival event, or (with a granularity) each coarse group once the last event it needs is in,
    in group order. A group's rows are copied from the held buffer when it is handed out."""

    def __init__(self, d: "Dispatcher", h: DispatchHandle):
        self.d, self.prog, self.held, self.rows = d, h.prog, h._held, h.inputs.rows
        self.released = np.zeros(0 if h.prog.group_need is None else h.prog.group_need.size, bool)

    def _copy(self, idx: np.ndarray) -> np.ndarray:
        if idx.size:
            self.rows[self.d._idx(idx)] = self.held[self.d._idx(self.prog.e_pos[idx])]
        return idx

    def _complete(self, ev) -> list[np.ndarray]:
        """The groups that events up to ``ev`` complete (an event number or a tuple of them)."""
        prog = self.prog
        if prog.group_need is None:
            return [self._copy(np.flatnonzero(np.isin(prog.e_event, ev)))]
        now = np.flatnonzero(~self.released & (prog.group_need <= int(np.max(ev))))
        self.released[now] = True
        return [self._copy(np.flatnonzero(prog.e_group == gi)) for gi in now.tolist()]

    def ready(self, events):
        """Yield ``idx [m]`` of every non-empty group the ``events`` complete, in order."""
        for ev in events:
            for idx in self._complete(ev):
                if idx.size:
                    yield idx


class _HostStaged:
    """A gloo receive into host memory whose ``wait`` also copies the rows to the device."""

    def __init__(self, work, host: torch.Tensor, dev: torch.Tensor):
        self.work, self.host, self.dev = work, host, dev

    def wait(self):
        self.work.wait()
        self.dev.copy_(self.host)


class _Done:
    """The work of a call this rank did not run (its group moves nothing)."""

    def wait(self):
        return True


class _AllOf:
    def __init__(self, works):
        self.works, self.done = works, False

    def wait(self):
        if not self.done:
            for w in self.works:
                w.wait()
            self.done = True


class CombineStream:
    """Overlapped combine: ``for grp in cs.waves(): cs.submit(grp, out)`` then ``cs.finish()``.

    ``waves()`` yields ``idx [m]`` (ascending positions in expert-input order) of the entries of
    one wave: tokens owned by node ``node + 1``, then ``node + 2``, ..., own node last. ``submit``
    folds the wave's outputs into its units and posts that wave's stage-0 sends at once, so the
    next wave computes while this one is on the wire.
    """

    def __init__(self, d: Dispatcher, h: DispatchHandle):
        self.d, self.h = d, h
        self.store = None
        self.pending: list = []
        self._stage0 = h.prog.combine[0] if h.prog.combine else None
        self._recv0 = None

    def waves(self):
        prog = self.h.prog
        for w in range(prog.num_waves):
            idx = np.flatnonzero(prog.e_wave == w)
            self._wave = w
            yield idx

    def submit(self, idx: np.ndarray, out: torch.Tensor) -> None:
        d, h = self.d, self.h
        if self.store is None:
            self.store = d._new_store(h, out.shape[1])
            st = self._stage0
            if st is not None:
                self._recv0 = d._buffer("crecv", st.n_recv, out.shape[1], d._wire(h))
        if idx.size:
            d._accumulate_entries(self.store, h, idx, out)
        st = self._stage0
        if st is None:
            return
        w = self._wave
        # this wave's sends: the wave-w segment of the (wave, dst)-ordered send list
        so = np.r_[0, np.cumsum(st.send_counts.sum(axis=0))]
        seg = st.send_idx[so[w]: so[w + 1]]
        part = d._take_units(self.store, seg, h)
        if d.p2p:
            recv_w, send_w = d._p2p(self._recv0, part, st, "combine", tag=0, wave=w, send_offset=int(so[w]))
            self.pending.append((list(recv_w.values()) + send_w, part))
        else:
            ro = np.r_[0, np.cumsum(st.recv_counts.sum(axis=0))]
            work = d._a2a(self._recv0[ro[w]: ro[w + 1]], part, st, "combine", wave=w, async_op=True, h=h, stage=0)
            self.pending.append(([work], part))

    def finish(self) -> torch.Tensor:
        d, h, prog = self.d, self.h, self.h.prog
        if self.store is None:  # no entries and no waves were iterated
            self.store = d._new_store(h, d.spec.hidden)
        for works, _ in self.pending:
            for w in works:
                w.wait()
        if self._stage0 is not None:
            d._accumulate_received(self.store, self._recv0, self._stage0)
        for s, st in enumerate(prog.combine[1:], start=1):
            send = d._take_units(self.store, st.send_idx, h)
            recv = d._buffer("crecv", st.n_recv, self.store.shape[1], send.dtype)
            if d.p2p:
                recv_w, send_w = d._p2p(recv, send, st, "combine", tag=s, wave=0)
                for w in [recv_w[q] for q in sorted(recv_w)] + send_w:
                    w.wait()
            else:
                d._a2a(recv, send, st, "combine", h=h, stage=s)
            d._accumulate_received(self.store, recv, st)
        return d._final(self.store, h)

