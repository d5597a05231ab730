"""``ExpertParallel``: the one communication object of a serving process, shared by every layer.

It owns one ``zepp.runtime.Dispatcher`` (one set of staging buffers, allocated once and grown
when a step needs more) and one ``Placement`` per MoE layer; before each layer it switches the
dispatcher to that layer's placement. Per layer it keeps the recent per-slot loads (for swaps),
optionally the recorded top-k ids of every rank (``record=True``: rank 0 writes them as traces),
and byte counters per phase.

Per step (one model forward over this rank's live rows) the engine calls ``begin_step(rows)``:
one all-gather of every rank's live-row count, handed to the dispatcher (``expect_tokens``), so
the layers of the step skip their own count exchange; ``counts`` tells every rank whether any
rank still has work.

Expert compute is the model's own: ``act(x W_g^T) * (x W_u^T)`` then ``W_d``, per local slot
(``zepp.runtime.experts.grouped_gated_up`` / ``grouped_linear_down``); with an overlapping system
(``overlap = "zepp"``) the first GEMM runs on each arrival group and the second in combine waves.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from zepp.model import MoESpec
from zepp.planner.types import Placement
from zepp.runtime.dispatcher import Dispatcher
from zepp.runtime.experts import grouped_gated_up, grouped_linear_down


class ExpertParallel:
    """Process-wide expert-parallel communication (see module docstring).

    ``system``: a ``zepp.registry.System`` the runtime supports; ``placements``: one per MoE
    layer (same ranks, GPUs per node and slot count); ``spec``: the layers' shape (experts, top-k,
    hidden, ffn); ``window``: how many recent steps of loads the swaps look at.
    """

    def __init__(self, system, placements: list[Placement], spec: MoESpec, relaxation: float = 0.25,
                 device=None, record: bool = False, window: int = 4, group=None, demands: list | None = None,
                 path_figures=None):
        self.system = system
        self.placements = list(placements)
        self.spec = spec
        self.relaxation = relaxation
        self.dispatcher = Dispatcher.for_system(spec, self.placements[0], system, relaxation=relaxation,
                                                gpus_per_node=self.placements[0].gpus_per_node, device=device,
                                                group=group)
        self.rank, self.world = self.dispatcher.rank, self.dispatcher.world
        self.device = self.dispatcher.device
        self.rows: torch.Tensor | None = None
        self.counts: np.ndarray | None = None
        self.record = record
        self.recorded: list[list[np.ndarray]] = [[] for _ in self.placements]
        self.window = window
        self.recent: list[list[np.ndarray]] = [[] for _ in self.placements]
        self.expert_load = np.zeros((len(self.placements), spec.num_experts), np.int64)
        self.on_layer = None  # test hook: called with (layer) before each layer's dispatch (fault injection)
        self.moe_seconds = 0.0
        # swaps: {layer: PendingCopies} posted between steps (zepp.serve.engine.Swapper); the
        # layer's GEMMs wait slot by slot, the layer finishes them; seconds this thread waited
        self.pending: dict = {}
        self.swap_wait_s = 0.0
        # the table path (zepp.planner.routing.decode_path): Zepp's routing without swaps or recording
        self.demands = demands
        self.table_ok = system.routing_choice.table_path and not system.swaps and not record
        self.path_figures = path_figures
        self._tables: dict = {}  # layer -> (placement, RoutingTable): cached per placement
        self.path = "planned"  # this step's path, the same on every rank
        self.step_paths: list[str] = []
        self.step_breakdown: list[dict] = []  # per step: {part: seconds summed over the step's layers}
        if self.table_ok:  # what depends only on the placement is built once, before the first step
            for layer in range(self.layers):
                self.table(layer)

    def _gemm(self, pending, fn, x: torch.Tensor, slot: np.ndarray, w: torch.Tensor) -> torch.Tensor:
        """``fn(x, slot, w)``, with the slots of a swap in flight last (``PendingCopies.grouped``)."""
        return fn(x, slot, w) if pending is None else pending.grouped(fn, x, slot, w)

    @property
    def layers(self) -> int:
        return len(self.placements)

    def begin_step(self, rows: torch.Tensor | None, tokens: int) -> np.ndarray:
        """Start a step: ``rows [T_r]`` live rows of the flattened hidden states (``None``: all),
        ``tokens = T_r``. Returns every rank's ``counts [R]`` (one all-gather)."""
        self.rows = rows
        c = torch.tensor([int(tokens)], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(c) for _ in range(self.world)]
        dist.all_gather(out, c, group=self.dispatcher.group)
        self.counts = torch.cat(out).cpu().numpy()
        self.dispatcher.expect_tokens(self.counts)
        self.path = self._choose_path(self.counts)
        self.step_paths.append(self.path)
        self.step_breakdown.append({})
        return self.counts

    def _choose_path(self, counts: np.ndarray) -> str:
        """``zepp.planner.routing.decode_path.choose_path`` on the step's counts (known to every rank)."""
        if not self.table_ok or int(counts.sum()) == 0:
            return "planned"
        from zepp.planner.routing.decode_path import choose_path, default_figures

        last = self.dispatcher.last_plan
        stages = 6 if last is None else last.dispatch.num_stages + last.combine.num_stages
        fig = self.path_figures or default_figures()
        row = self.spec.hidden * 4
        return choose_path(counts, self.world, self.dispatcher.gpus_per_node, self.spec.num_experts,
                           self.spec.top_k, row, stages, fig)

    def table(self, layer: int):
        """The routing table of ``layer``'s placement (built once per placement)."""
        from zepp.planner.routing.table_routing import build_routing_table

        p = self.placements[layer]
        got = self._tables.get(layer)
        if got is None or got[0] is not p:
            R, E = self.world, self.spec.num_experts
            dem = self.demands[layer] if self.demands is not None and self.demands[layer] is not None \
                else np.ones((R, E))
            got = (p, build_routing_table(p, dem, self.relaxation, p.gpus_per_node))
            self._tables[layer] = got
        return got[1]

    def _add_breakdown(self, timing: dict) -> None:
        if self.step_breakdown:
            b = self.step_breakdown[-1]
            for k, v in timing.items():
                b[k] = b.get(k, 0.0) + v

    def moe(self, layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, block) -> torch.Tensor:
        """One layer: ``x [T_r, H]``, the router's ``ids``/``w [T_r, k]`` -> ``y [T_r, H]`` (fp32 sum)."""
        if self.on_layer is not None:
            self.on_layer(layer)
        t0 = time.perf_counter()
        d = self.dispatcher
        d.set_placement(self.placements[layer])
        pend = self.pending.pop(layer, None)
        act = block.act_fn
        up = lambda rows, slot, wt: grouped_gated_up(rows, slot, wt, act)  # noqa: E731
        if self.path == "table":  # (never with swaps: table_ok excludes them)
            return self._table_moe(layer, x, ids, w, block, t0)
        if not d.overlap:
            inputs, h = d.dispatch(x, ids, w)
            inter = self._gemm(pend, up, inputs.rows, inputs.slot, block.gate_up)
            y = d.combine(self._gemm(pend, grouped_linear_down, inter, inputs.slot, block.down), h)
        elif (h := d.dispatch_begin(x, ids, w)).prog.single_gemm:  # the batch's granularity: blocking
            d.dispatch_blocking(h)
            inter = self._gemm(pend, up, h.inputs.rows, h.inputs.slot, block.gate_up)
            y = d.combine_blocking(self._gemm(pend, grouped_linear_down, inter, h.inputs.slot, block.down), h)
        else:
            rows, slot = h.inputs.rows, h.prog.e_slot
            inter = rows.new_empty(rows.shape[0], block.ffn)
            for grp in d.arrivals(h):
                ti = d._idx(grp)
                inter[ti] = self._gemm(pend, up, rows[ti], slot[grp], block.gate_up)
            cs = d.combine_begin(h)
            for grp in cs.waves():
                cs.submit(grp, self._gemm(pend, grouped_linear_down, inter[d._idx(grp)], slot[grp], block.down))
            y = cs.finish()
        if pend is not None:
            self.swap_wait_s += pend.finish().wait_s
        self._note(layer, h)
        self._add_breakdown({**d.timing, "moe": time.perf_counter() - t0})
        self.moe_seconds += time.perf_counter() - t0
        return y

    def _table_moe(self, layer: int, x, ids, w, block, t0: float) -> torch.Tensor:
        """One layer on the table path (``zepp.runtime.table_exchange``)."""
        from zepp.planner.routing.table_routing import rank_slots
        from zepp.runtime.table_exchange import table_layer

        d, act = self.dispatcher, block.act_fn
        tm = time.perf_counter()
        ids_np = ids.cpu().numpy().astype(np.int32)
        slot = torch.as_tensor(rank_slots(ids_np, self.rank, self.table(layer)), dtype=torch.int64, device=x.device)
        timing = {"plan": time.perf_counter() - tm}

        def experts(rows, s):
            return grouped_linear_down(grouped_gated_up(rows, s, block.gate_up, act), s, block.down)

        y = table_layer(d, x, slot, w, self.counts, experts, timing)  # (no global ids: expert_load skips it)
        self._add_breakdown({**timing, "moe": time.perf_counter() - t0})
        self.moe_seconds += time.perf_counter() - t0
        return y

    def _note(self, layer: int, h) -> None:
        """Per-slot loads of this batch (for swaps), expert loads, recorded ids."""
        slot = h.plan.routing.slot
        s = slot[slot >= 0]
        loads = np.bincount(s, minlength=self.placements[layer].slot_expert.size).astype(np.int64)
        rec = self.recent[layer]
        rec.append(loads)
        del rec[:-self.window]
        ids = h.plan.routing.topk_ids
        live = ids[ids[..., 0] >= 0]  # [n, k] rows of present tokens, rank-major
        self.expert_load[layer] += np.bincount(live.ravel(), minlength=self.spec.num_experts)
        if self.record:
            self.recorded[layer].append(live.astype(np.int32))

    def recent_loads(self, layer: int) -> np.ndarray:
        """``[R * S]`` entries per global slot over the last ``window`` steps of ``layer``."""
        rec = self.recent[layer]
        return np.sum(rec, axis=0) if rec else np.zeros(self.placements[layer].slot_expert.size, np.int64)
