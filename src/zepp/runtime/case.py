"""One case of ``zepp run`` on this rank: every system's MoE layer on the same batches, measured.

``RankCase`` holds what the systems share (the model shape, the batches ``[I, R, T, k]`` drawn
from the eval trace, the node demand of the history trace, each iteration's inputs and the
single-process reference outputs). ``SystemRun`` is one system's layer on this rank; per
iteration it times the layer call between a barrier and its end (for swapping systems the swap
planning and weight copies are inside that window; ``zepp.runtime.swap_steps``), compares the
bytes this rank put on each link class with the planner's, hashes the output, and with
``check`` measures the error against the reference. ``run_case`` runs them iteration-major
(``interleave``: every system sees the same machine load) or system-major (one system's weights
in memory at a time), exchanges the records as JSON and rank 0 returns the report
(``zepp.runtime.report.summarize``). With ``schedule`` the history and batches come from
``zepp.traces.schedules.drift_workload`` and the report holds each timed batch's topic mix.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError
from zepp.runtime.dispatcher import HOST_PARTS
from zepp.runtime.inputs import DTYPES, activations, cost_figures, gate_weights, load_traces


class RunHooks:
    """Callbacks of ``run_case`` (subclass and override; the defaults do nothing).

    ``on_layer_created(index, system)``: layer ``index`` (creation order, one per system) exists.
    ``on_layer_call(index, system, it)``: right before layer ``index`` runs iteration ``it``
    (after the barrier that starts the iteration and after any swap of weights).
    ``before_final_gather()``: every layer call is done; the results exchange comes next.
    """

    def on_layer_created(self, index: int, system: str) -> None:
        pass

    def on_layer_call(self, index: int, system: str, it: int) -> None:
        pass

    def before_final_gather(self) -> None:
        pass


class RankCase:
    """What every system of one case shares on this rank (see the module docstring).

    ``cfg``: the worker config (``interleave`` decided when it was None); ``T`` tokens per rank;
    ``batches [iters + warmup, R, T, k]``; ``same [R]``: ranks of this rank's node.
    """

    def __init__(self, cfg: dict):
        from zepp.model import model_preset
        from zepp.traces import node_demand, sample_batches

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.L, self.N = cfg["gpus_per_node"], cfg["nodes"]
        if self.world != self.L * self.N:
            raise ZeppInputError(f"WORLD_SIZE={self.world} but the config asks for {self.N} nodes x {self.L} GPUs")
        self.spec = model_preset(cfg["model"], experts=cfg.get("experts"), topk=cfg.get("topk"),
                                 hidden=cfg.get("hidden"), ffn=cfg.get("ffn"))
        self.dtype = DTYPES[cfg["dtype"]]
        self.device = torch.device(cfg["device"])
        self.T = cfg.get("tokens") or self.spec.tokens_for_budget(cfg["budget_mb"])
        self.cfg = cfg if cfg.get("interleave") is not None else {**cfg, "interleave": self._fits_together(cfg)}
        self.hist_trace, self.eval_trace = load_traces(self.cfg, self.spec)
        self.hist = node_demand(self.hist_trace, self.N, self.L)
        self.iters, self.warmup = cfg["iters"], cfg["warmup"]
        self.workload = None
        if cfg.get("schedule"):  # a drift schedule: history and batches from zepp.traces.schedules
            from zepp.traces.schedules import drift_workload

            self.workload = drift_workload((self.hist_trace, self.eval_trace), cfg["schedule"], self.world, self.T,
                                           self.iters + self.warmup, cfg["seed"])
            self.hist, self.batches = self.workload.hist(self.N, self.L), self.workload.batches
        else:
            self.batches = sample_batches(self.eval_trace, self.world, self.T, self.iters + self.warmup, cfg["seed"])
        self.same = (np.arange(self.world) // self.L) == self.rank // self.L
        self._refs: dict[int, torch.Tensor] = {}

    def _fits_together(self, cfg: dict) -> bool:
        """Whether every system's expert weights fit in 2 GiB per rank at once (then interleave)."""
        slots = self.spec.num_experts // self.world + cfg["extra"]
        per_system = slots * 2 * self.spec.hidden * self.spec.ffn * self.element_size(self.dtype)
        return per_system * len(cfg["systems"]) <= 2 * 2**30

    @staticmethod
    def element_size(dtype: torch.dtype) -> int:
        return torch.empty(0, dtype=dtype).element_size()

    def inputs(self, it: int):
        """``(ids [T, k] numpy, x [T, H], w [T, k])`` of this rank at iteration ``it``."""
        cfg, spec = self.cfg, self.spec
        x = activations(cfg["seed"], it, self.rank, self.T, spec.hidden).to(self.device, self.dtype)
        w = gate_weights(cfg["seed"], it, self.rank, self.T, spec.top_k).to(self.device)
        return self.batches[it, self.rank], x, w

    def reference(self, it: int, x: torch.Tensor, ids: np.ndarray, w: torch.Tensor) -> torch.Tensor:
        """The single-process reference output ``[T, H]`` (fp32) of iteration ``it``, once per iteration."""
        from zepp.runtime.reference import reference_moe

        if it not in self._refs:
            self._refs[it] = reference_moe(x, ids, w, self.cfg["seed"], self.spec.ffn).float()
        return self._refs[it]

    def trace_sources(self) -> dict:
        out = {"history": self.hist_trace.source, "eval": self.eval_trace.source}
        if self.workload is not None:  # the schedule and each timed batch's topic mix
            out["schedule"] = dict(self.workload.report(first=self.warmup),
                                   describe=self.workload.describe(first=self.warmup))
        return out


class SystemRun:
    """One system's layer on this rank (layer ``index`` in creation order) and what its
    iterations measured: ``record`` (JSON-ready, one per rank, folded by ``summarize``)."""

    def __init__(self, case: RankCase, name: str, index: int, hooks: RunHooks):
        from zepp.planner.placement import make_placement
        from zepp.runtime.dispatcher import Dispatcher
        from zepp.runtime.moe import MoELayer
        from zepp.runtime.systems import SYSTEMS

        cfg, spec = case.cfg, case.spec
        self.case, self.name, self.index, self.hooks = case, name, index, hooks
        self.system = SYSTEMS[name]
        placement = make_placement(self.system.placement, case.hist, spec.num_experts, case.world, case.L,
                                   extra=cfg["extra"])
        d = Dispatcher.for_system(spec, placement, self.system, relaxation=cfg["relaxation"], gpus_per_node=case.L,
                                  device=case.device, figures=cost_figures(cfg))
        # every rank holds T tokens in every batch (``batches [I, R, T, k]``): the layer's metadata
        # exchange needs no count exchange before it (one collective fewer per layer, every system)
        d.expect_tokens(np.full(case.world, case.T, np.int64))
        self.record = {"times": [], "plan_times": [], "max_rel_err": 0.0, "bytes_ok": True, "bytes": [],
                       "swapped_slots": 0, "swap_bytes": 0, "metadata_bytes": {}, "weights_ok": True,
                       "granularity": [], "breakdown": []}
        self.digest = hashlib.sha1()  # of every output of this rank, all iterations
        self.layer = MoELayer(d, seed=cfg["seed"], dtype=case.dtype)
        self.swaps = None
        if self.system.swaps:
            from zepp.runtime.swap_steps import SwapSteps

            self.swaps = SwapSteps(self.layer, cfg, case.rank, case.L, self.record)
        hooks.on_layer_created(index, name)

    def step(self, it: int) -> None:
        """Iteration ``it``: the timed layer call, then its bytes, digest and (with check) error."""
        case, d = self.case, self.layer.dispatcher
        ids_np, x, w = case.inputs(it)
        ids = torch.as_tensor(ids_np, dtype=torch.int64, device=case.device)
        self._arm_fault(it)
        d.counter.reset()
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        if self.swaps is not None:
            self.swaps.before()
        self.hooks.on_layer_call(self.index, self.name, it)
        y = self.layer(x, ids, w)
        if self.swaps is not None:
            self.swaps.after(it >= case.warmup)
        if case.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0  # this rank's CPU in the layer call: every thread (gloo's too), user + system
        self.digest.update(y.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        measured, planned = self._link_bytes()
        self.record["metadata_bytes"] = d.counter.split("metadata", case.rank, case.L)
        if it >= case.warmup:
            g = d.last_granularity
            self.record["granularity"].append(None if g is None else [g.groups, g.waves])
            self.record["times"].append(elapsed)
            self.record["plan_times"].append(sum(d.timing.get(k, 0.0) for k in HOST_PARTS))
            self.record["breakdown"].append({**d.timing, **{k: v for k, v in self.layer.timing.items()
                                                            if k == "compute"}, "cpu": cpu})
            self.record["bytes"].append({"measured": measured, "planned": planned})
        if case.cfg["check"]:
            self._check(it, x, ids_np, w, y)
        if self.swaps is not None:
            self.swaps.replay(x, ids, w, y, it >= case.warmup)

    def _arm_fault(self, it: int) -> None:
        """The ``fault`` test hook: this rank dies (exit 17) or hangs between dispatch and combine."""
        fault = self.case.cfg.get("fault") or {}
        if fault.get("rank") == self.case.rank and fault.get("system", self.name) == self.name \
                and fault.get("iter") == it:
            self.layer.on_dispatched = (lambda: os._exit(17)) if fault.get("mode", "die") == "die" else (
                lambda: time.sleep(3600))

    def _link_bytes(self) -> tuple[dict, dict]:
        """This rank's measured bytes against the planner's, per phase, NIC and NVLink; a
        mismatch (NIC total, or NVLink per destination) clears ``record["bytes_ok"]``."""
        from zepp.planner.volumes import link_stats

        case, d = self.case, self.layer.dispatcher
        plan, rank, same = d.last_plan, case.rank, case.same
        row_d = case.spec.hidden * case.element_size(case.dtype)
        row_c = case.spec.hidden * case.element_size(d.combine_dtype or case.dtype)
        measured, planned = {}, {}
        for phase, hops, row in (("dispatch", plan.dispatch, row_d), ("combine", plan.combine, row_c)):
            st = link_stats(hops, case.world, case.L, row, plan.routing.rows_per_rank())
            b = d.counter.by_dst[phase]
            measured[phase] = {"nic": int(b[~same].sum()), "nvlink": int(b[same].sum())}
            planned[phase] = {"nic": int(st.nic_send[rank]), "nvlink": int(st.nvlink[rank].sum())}
            if not (measured[phase]["nic"] == planned[phase]["nic"]
                    and np.array_equal(b[same], st.nvlink[rank][same])):
                self.record["bytes_ok"] = False
        return measured, planned

    def _check(self, it: int, x: torch.Tensor, ids_np: np.ndarray, w: torch.Tensor, y: torch.Tensor) -> None:
        """Expert inputs equal to the owners' rows; relative error of ``y`` against the reference."""
        rec, case = self.record, self.case
        rec["inputs_ok"] = rec.get("inputs_ok", True) and _check_inputs(self.layer.last_handle, case.cfg, it,
                                                                        case.spec)
        ref = case.reference(it, x, ids_np, w)
        err = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        rec["max_rel_err"] = max(rec["max_rel_err"], err)

    def finish(self) -> dict:
        """The record, with the output digest and (swapping systems, with check) the weights' check."""
        self.record["digest"] = self.digest.hexdigest()
        if self.system.swaps and self.case.cfg["check"]:
            self.record["weights_ok"] = self.layer.check_weights()
        return self.record


def _check_inputs(h, cfg: dict, it: int, spec) -> bool:
    """The expert inputs are exactly the owners' token rows, grouped by slot with ``counts``."""
    p = h.prog
    if int(p.counts.sum()) != p.n_entries or np.any(np.diff(p.e_slot) < 0):
        return False
    if not np.array_equal(np.bincount(p.e_slot, minlength=p.slots), p.counts):
        return False
    rows = h.inputs.rows.cpu()
    for owner in np.unique(p.e_owner).tolist():
        m = np.flatnonzero(p.e_owner == owner)
        xo = activations(cfg["seed"], it, owner, p.tokens, spec.hidden).to(rows.dtype)
        if not torch.equal(rows[torch.as_tensor(m)], xo[torch.as_tensor(p.e_token[m])]):
            return False
    return True


def run_systems(case: RankCase, hooks: RunHooks) -> dict:
    """Every system of the case on this rank: ``{system: record}``."""
    names, steps = case.cfg["systems"], case.iters + case.warmup
    if case.cfg.get("interleave"):  # iteration-major: every system sees the same machine load
        runs = [SystemRun(case, name, i, hooks) for i, name in enumerate(names)]
        for it in range(steps):
            for run in runs:
                run.step(it)
        return {run.name: run.finish() for run in runs}
    records = {}
    for i, name in enumerate(names):  # system-major: one system's weights in memory at a time
        run = SystemRun(case, name, i, hooks)
        for it in range(steps):
            run.step(it)
        records[name] = run.finish()
        del run
    return records


def run_case(cfg: dict, hooks: RunHooks | None = None) -> dict | None:
    """Run every system of ``cfg`` on this rank; rank 0 returns the report. ``hooks``: see ``RunHooks``."""
    from zepp.runtime.rank_process import gather_json
    from zepp.runtime.report import summarize

    hooks = hooks or RunHooks()
    case = RankCase(cfg)
    records = run_systems(case, hooks)
    hooks.before_final_gather()
    per_rank = gather_json({"systems": records, "traces": case.trace_sources()},
                           case.device if cfg.get("backend") == "nccl" else None)
    if case.rank != 0:
        return None
    return summarize(case.cfg, case.spec, case.T, per_rank)
