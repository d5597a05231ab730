"""Simulate a system's layer, batch by batch, from its registry row and its FlowPlans.

For every system the path is the same (``run_system``): the row's placement (once, from the
history), per batch its FlowPlan from ``zepp.planner.plan_batch`` (the row's routing, through its
routing table where the routing needs one, then its dispatch and combine flows; systems that
share a placement and a routing share the batch's routing, ``Shared``), the FlowPlan turned into
a ``LayerWork``, the row's special phases (``zepp.sim.phases``) and its adaptation (the rows that
swap: intra-node swaps planned from the previous batch's slot loads, as the runtime does; their
weight copies run this batch), the row's planning-cost model (``zepp.sim.planning_cost``) as the
prologue, the row's mechanics (``zepp.sim.mechanics``) and ``build_layer`` / ``simulate``.
Latency = max over ranks; the result holds every timed iteration.

One FlowPlan on one cluster (``zepp plan``, ``zepp place``) is ``simulate_flowplan``: the same
``simulate_plan`` on the cluster preset's network (``zepp.sim.calibrate.on_network``).

A meta-system (``zepp``: ``best_of``) is its variants' best median per configuration; one with
``switch_tokens`` (``sglang-deepep``) runs the variant the batch size picks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from zepp import registry
from zepp.cluster import Cluster
from zepp.errors import ZeppInputError
from zepp.planner.batch import plan_batch
from zepp.planner.overlap.granularity import Figures, Granularity, column_splits
from zepp.model import MoESpec
from zepp.planner.placement import make_placement
from zepp.planner.types import FlowPlan, Placement
from zepp.planner.routing import ROUTINGS, default_relaxation, demand_per_gpu, route
from zepp.sim import phases
from zepp.sim.calibrate import on_network
from zepp.sim.cell_flows import CellFlows
from zepp.sim.cell_links import counted as plan_counted
from zepp.sim.critical_path import critical_path
from zepp.sim.engine import Timeline, simulate
from zepp.sim.layer import SIM_OPTS, build_layer
from zepp.sim.layer_work import LayerWork
from zepp.sim.layer_builder import dispatch_row_bytes
from zepp.sim.mechanics import Mechanics, Net, mechanics
from zepp.sim.planning_cost import planning_seconds
from zepp.sim.task_graph import TaskGraph


@dataclass
class Config:
    """One benchmark configuration: hardware, model, network calibration, history, batches.

    ``hist [N, E]`` history histogram; ``batches [iters, R, T, k]``; the first ``warmup``
    batches are not timed (stateful systems still plan them); ``relaxation`` C (default 0.25,
    0.5 at 16 nodes and more); ``extra`` redundant slots per GPU; ``sim_opts`` the engine's
    coarsening options (``benchmarks/simulated/bench_sim_accuracy.py`` compares them with the exact engine).
    """

    cluster: Cluster
    spec: MoESpec
    net: Net
    hist: np.ndarray
    batches: np.ndarray
    warmup: int = 5
    relaxation: float | None = None
    extra: int = 2
    sim_opts: dict | None = None  # engine coarsening (default zepp.sim.layer.SIM_OPTS)
    paths: bool = False  # record every timed batch's critical path (zepp.sim.critical_path)

    @property
    def C(self) -> float:
        return default_relaxation(self.cluster.nodes) if self.relaxation is None else self.relaxation


@dataclass
class SystemResult:
    """Per timed iteration: ``latencies``, modelled ``planning`` and the system's own physical
    ``lower_bound`` (seconds); ``timeline`` of the last batch when asked; ``variant``: for a
    meta-system, the variant whose median won; ``swapped_slots`` per timed iteration."""

    name: str
    latencies: list = field(default_factory=list)
    planning: list = field(default_factory=list)
    lower_bound: list = field(default_factory=list)
    swapped_slots: list = field(default_factory=list)
    timeline: Timeline | None = None
    variant: str | None = None
    granularity: list = field(default_factory=list)  # per timed iteration: (groups, waves) or None
    paths: list = field(default_factory=list)  # per timed iteration with Config.paths: critical-path seconds

    @property
    def median(self) -> float:
        return float(np.median(self.latencies))


class Shared:
    """What systems of one configuration share: placements per kind, and routings per
    (placement, routing, iteration) for systems whose placement does not change (a routing is
    ``[R, T, k]`` slots; hop tables are rebuilt per system, as they are far larger)."""

    def __init__(self):
        self.placements: dict[str, Placement] = {}
        self.routings: dict[tuple, object] = {}
        self.tables: dict[tuple, object] = {}

    def placement(self, kind: str, cfg: Config) -> Placement:
        if kind not in self.placements:
            cl = cfg.cluster
            self.placements[kind] = make_placement(kind, cfg.hist, cfg.spec.num_experts, cl.ranks, cl.gpus_per_node,
                                                   extra=cfg.extra)
        return self.placements[kind]

    def table(self, kind: str, routing: str, cfg: Config):
        """The table of a table routing (``ROUTINGS[routing].build_table``: Zepp's routing table, or
        Zepp's table in an engine's form) of placement ``kind``, built once from the same history as
        the placement: each GPU of node ``n`` expects ``hist[n] / L`` of its node's demand."""
        if (kind, routing) not in self.tables:
            L = cfg.cluster.gpus_per_node
            demand = demand_per_gpu(cfg.hist, L)  # [R, E]
            self.tables[kind, routing] = ROUTINGS[routing].build_table(self.placement(kind, cfg), demand, cfg.C, L)
        return self.tables[kind, routing]

    def plan(self, s: registry.System, cfg: Config, it: int) -> FlowPlan:
        """System ``s``'s FlowPlan of batch ``it``: one routing serves every transport pair of the
        systems that share its placement and routing (``plan_batch``'s ``routing``)."""
        rkey = (s.placement, s.routing, it)
        placement = self.placement(s.placement, cfg)
        if rkey in self.routings:
            return plan_batch(cfg.batches[it], placement, s, cfg.spec.row_bytes, cfg.C, routing=self.routings[rkey])
        table = self.table(s.placement, s.routing, cfg) if s.routing_choice.needs_table else None
        plan = plan_batch(cfg.batches[it], placement, s, cfg.spec.row_bytes, cfg.C, table=table)
        self.routings[rkey] = plan.routing
        return plan


def own_floor(cfg: Config, lp: LayerWork, extra_nic=None, dispatch_row_bytes: float | None = None) -> float:
    """A system's own physical floor: busiest NIC direction's bytes at the nominal NIC rate,
    busiest GPU's FLOPs at peak, busiest GPU's expert-weight reads at HBM rate.
    ``dispatch_row_bytes``: a dispatch row's bytes on the wire (default: the model's row)."""
    cl, spec = cfg.cluster, cfg.spec
    R, L = cl.ranks, cl.gpus_per_node
    send = np.zeros(R)
    recv = np.zeros(R)
    for h, rb in ((lp.dispatch, dispatch_row_bytes or spec.row_bytes), (lp.combine, spec.row_bytes)):
        cross = (h.src // L) != (h.dst // L)
        w = h.rows[cross] if isinstance(h, CellFlows) else None  # cells: rows each
        send += np.bincount(h.src[cross], weights=w, minlength=R) * rb
        recv += np.bincount(h.dst[cross], weights=w, minlength=R) * rb
    if extra_nic is not None:
        send += extra_nic[0]
        recv += extra_nic[1]
    S = lp.slots_per_rank
    if lp.slot_entries is None:
        rows = np.bincount(lp.comp, minlength=R)
        used = np.zeros(R * S, bool)
        used[lp.slot] = True
    else:
        per_slot = lp.slot_entries.sum(0)
        rows, used = per_slot.reshape(R, S).sum(1), per_slot > 0
    active = used.reshape(R, S).sum(1)  # slots with work per rank
    return float(max(max(send.max(), recv.max()) / cl.nic_bw, rows.max() * spec.flops_per_row / cl.peak_flops,
                     active.max() * spec.expert_weight_bytes / cl.hbm_bw))


def plan_granularity(cfg: Config, s: registry.System, plan: FlowPlan) -> Granularity | None:
    """The granularity system ``s`` runs ``plan`` with: chosen per batch by
    ``zepp.planner.overlap.granularity.choose`` for the ``zepp-auto`` overlap (with the simulated network's
    calibrated NIC rate and put cost, and the GPU share a GEMM of a split phase keeps beside the
    mechanics' communication kernels), else ``None`` (the mechanics' fixed groups / waves)."""
    choose = s.overlap_choice.function
    if choose is None:
        return None
    cl = cfg.cluster
    share = 1.0 - mechanics(s.mechanics).comm_sms / cl.sms
    return choose(plan, cfg.spec, Figures.of(cl, nic_bw=cl.nic_bw * cfg.net.nic_eff, nic_msg=cfg.net.put(cl.ranks),
                                             split_share=share))


def simulate_plan(cfg: Config, s: registry.System, plan: FlowPlan, keep: bool = False,
                  swap_copies: np.ndarray | None = None, swapped: np.ndarray | None = None,
                  mech: Mechanics | None = None, granularity: Granularity | None = None):
    """Simulate one batch of system ``s`` from its FlowPlan. Returns ``(Timeline, planning s,
    floor s)``. ``swap_copies [M, 2]`` (src rank, dst rank) weight copies of this batch's swaps and
    ``swapped [R*S]`` the slots whose weights arrive with them. ``mech``: a ``Mechanics`` record
    instead of the row's (tests that switch one mechanism off); ``granularity``: the batch's
    groups / waves (default: ``plan_granularity``)."""
    ctx = phases.BatchInputs(cfg, plan)
    for name in s.plugins:
        phases.apply(name, ctx)
    kw = {}
    if swap_copies is not None:
        kw = dict(weight_copies=swap_copies, swapped=swapped)
    elif ctx.weight_copies is not None:
        kw = dict(weight_copies=ctx.weight_copies, copies_block_gemm=ctx.copies_block_gemm)
    mech = mech or mechanics(s.mechanics)
    # a phase may replace its hop table; without one the layer is built from the plan's counts
    counted = (not s.plugins and not mech.stage_collectives and mech.gemm1 != "stage"
               and plan_counted(ctx.plan, mech.predispatch))
    lp = LayerWork.of(ctx.plan, counted, mech.predispatch, granularity=granularity or plan_granularity(cfg, s, plan),
                      **kw)
    if mech.gemm2 == "column-sends" and mech.gemm2_splits == 0:  # the planner's per-batch choice
        cl = cfg.cluster
        fig = Figures.of(cl, nic_bw=cl.nic_bw * cfg.net.nic_eff, nic_msg=cfg.net.put(cl.ranks))
        fig = replace(fig, nvlink_bw=cl.nvlink_bw * cfg.net.nvlink_eff)
        mech = replace(mech, gemm2_splits=column_splits(plan.tokens_per_rank, cfg.spec.top_k, cfg.spec.row_bytes,
                                                        cl.nodes, cl.gpus_per_node, fig))
    floor = own_floor(cfg, lp, ctx.extra_nic, dispatch_row_bytes(cfg.spec, mech))
    T = plan.routing.topk_ids.shape[1]
    prologue, planning = planning_seconds(s.planning, s, cfg.cluster, cfg.spec, T, cfg.net)
    g = TaskGraph(cfg.cluster)
    build_layer(g, cfg.cluster, cfg.spec, lp, mech, cfg.net, np.full(cfg.cluster.ranks, prologue),
                ctx.custom_dispatch, ctx.custom_combine, planning=np.full(cfg.cluster.ranks, planning))
    tl = simulate(g, nic_bw=cfg.cluster.nic_bw * cfg.net.nic_eff, nvlink_bw=cfg.cluster.nvlink_bw * cfg.net.nvlink_eff,
                  labels=keep, **(cfg.sim_opts or SIM_OPTS))
    if keep or cfg.paths:
        tl.path = critical_path(g, tl.start, tl.end)
    return tl, planning, floor




def simulate_flowplan(plan: FlowPlan, cluster: Cluster, spec: MoESpec, system: str | registry.System,
                      keep: bool = False) -> tuple[Timeline, float, float]:
    """Simulate one FlowPlan of ``system`` (a registry name or row) on ``cluster``: the one way
    every command simulates a single plan. The network is the cluster preset's
    (``zepp.sim.calibrate.on_network``: fitted for ``a100`` / ``h100``, DeepEP's published
    figures for today's presets; a cluster with neither is a ``ZeppInputError``). Returns
    ``simulate_plan``'s ``(Timeline, planning s, floor s)``."""
    s = registry.system(system) if isinstance(system, str) else system
    cl, net = on_network(cluster)
    cfg = Config(cl, spec, net, None, plan.routing.topk_ids[None], warmup=0)
    return simulate_plan(cfg, s, plan, keep)


def run_system(name: str | registry.System, cfg: Config, keep_timeline: bool = False,
               shared: Shared | None = None) -> SystemResult:
    """Plan and simulate ``cfg.batches`` with system ``name`` (a registry name the simulator
    supports, or a row built from rows, as ``zepp.sim.ablation``'s arms); the first
    ``cfg.warmup`` batches are warm-up. Stateless systems skip them (a deterministic simulator
    has nothing to warm up); ``zepp-swap`` plans them, since its placement carries over.
    ``shared``: placements and plans shared with the configuration's other systems."""
    s = registry.system(name) if isinstance(name, str) else name
    name = s.name
    if not s.supports("sim"):
        raise ZeppInputError(f"system {name!r} does not run in the simulator (runs in: {', '.join(s.executors)})")
    shared = Shared() if shared is None else shared
    if s.best_of:
        T = cfg.batches.shape[2]
        names = [registry.pick_variant(name, T, {})] if s.switch_tokens is not None else registry.variants(name, "sim")
        results = {v: run_system(v, cfg, keep_timeline, shared) for v in names}
        best = results[registry.pick_variant(name, T, {v: r.median for v, r in results.items()})]
        return SystemResult(name, best.latencies, best.planning, best.lower_bound, best.swapped_slots, best.timeline,
                            variant=best.name, granularity=best.granularity, paths=best.paths)
    res = SystemResult(name)
    iters = cfg.batches.shape[0]
    if s.swaps:
        return _run_swapping(s, cfg, keep_timeline, shared, res)
    for it in range(cfg.warmup, iters):
        keep = keep_timeline and it == iters - 1
        plan = shared.plan(s, cfg, it)
        gran = plan_granularity(cfg, s, plan)
        tl, planning, floor = simulate_plan(cfg, s, plan, keep, granularity=gran)
        _record(res, tl, planning, floor, keep, 0, gran)
    return res


def _record(res: SystemResult, tl: Timeline, planning: float, floor: float, keep: bool, swapped: int,
            gran: Granularity | None = None) -> None:
    res.granularity.append(None if gran is None else (gran.groups, gran.waves))
    res.latencies.append(tl.latency)
    res.planning.append(planning)
    res.lower_bound.append(floor)
    res.swapped_slots.append(swapped)
    if tl.path is not None:
        res.paths.append(tl.path)
    if keep:
        res.timeline = tl


def _run_swapping(s: registry.System, cfg: Config, keep_timeline: bool, shared: Shared, res: SystemResult):
    """``zepp-swap``: before batch ``i``, swaps planned from batch ``i-1``'s slot loads under
    Zepp's routing (the runtime's order); their copies run during batch ``i`` and its routing
    uses the new placement. ``zepp-swap-once``: only before batch 1 (from batch 0's loads); the
    placement then stays.

    The trigger is a cost gate, not the routing's band: Zepp's routing already keeps replica
    loads within ``(1 + C)``, so the paper's out-of-band test at ``C`` on routed loads almost never
    fires. Swaps are planned towards an even node (``plan_swaps`` with ``C = 0``, its rounds and
    per-GPU limits as in the paper) and a node keeps them only where the drop of its busiest
    GPU's GEMM time exceeds the copies' exposed time (``gate_swaps``, this cluster's roofline
    GEMM rate and calibrated NVLink rate)."""
    from zepp.planner.adaptation.swaps import gate_swaps

    placement = shared.placement(s.placement, cfg)
    cl = cfg.cluster
    row_s = cfg.spec.flops_per_row / cl.peak_flops
    copy_s = cfg.spec.expert_weight_bytes / (cl.nvlink_bw * cfg.net.nvlink_eff) + cl.nvlink_msg_cost
    S = placement.slots_per_rank
    prev_loads = None
    iters = cfg.batches.shape[0]
    for it in range(iters):
        copies = swapped = None
        n_swapped = 0
        if prev_loads is not None and (not s.adaptation_choice.once or it == 1):
            sp = gate_swaps(placement, s.adaptation_choice.function(placement, prev_loads, 0.0), prev_loads, row_s,
                            copy_s)
            if sp.num_swapped_slots:
                n_swapped = sp.num_swapped_slots
                c = np.stack([sp.copies[:, 0] // S, sp.copies[:, 1] // S], 1)
                swapped = np.zeros(placement.slot_expert.size, bool)
                swapped[sp.copies[:, 1]] = True
                copies = c[c[:, 0] != c[:, 1]]  # a copy between two slots of one GPU needs no link
            placement = sp.placement
        # routed apart from its flows: warm-up batches need only the routing's slot loads
        r = route(s.routing, cfg.batches[it], placement, cfg.C)
        prev_loads = r.slot_loads()
        if it < cfg.warmup:
            continue
        keep = keep_timeline and it == iters - 1
        plan = plan_batch(cfg.batches[it], placement, s, cfg.spec.row_bytes, cfg.C, routing=r)
        gran = plan_granularity(cfg, s, plan)
        tl, planning, floor = simulate_plan(cfg, s, plan, keep, copies, swapped, granularity=gran)
        _record(res, tl, planning, floor, keep, n_swapped, gran)
    return res
