"""A swapping system (``System.swaps``) in ``zepp run``: per step, plan swaps from the previous batch's slot loads, post
their weight copies (``zepp.runtime.swap_copies``), run the layer, finish; record what it cost.

Modes (worker config ``swap_copies``, a name of ``SWAP_COPY_MODES``): ``hidden`` (default: the
copies run beside the step, a slot's GEMM waits for its own weights) or ``blocking`` (the same
copies, finished before the layer starts, as swaps ran before).

With ``swap_measure = K`` (worker config; the benchmark's switch, ``benchmarks/emulated/swap_bench.py``),
every timed step that swapped is followed, outside its timed window, by ``K`` rounds of three
replays on the same batch, each between barriers:

- ``again``: the weights and placement from before the swap restored (untimed), then the step
  again with the same copies hidden behind it (planning not included);
- ``control``: the same layer call with the weights in place and nothing in flight;
- ``alone``: the same copies (same pairs, same bytes, into scratch tensors), alone and blocking.

Each replay's output must equal the step's bit for bit (``replay_same``). Per round, ``again -
control`` is the time the copies added to the step, against ``alone``, what they take when
nothing hides them; the rounds interleave, so slow and fast moments of a loaded machine fall on
both sides. The replays put their own bytes on the links after the step's window: ``zepp run
--emulate``'s NIC figures of a measured swapping system include them.

Per rank and timed iteration the record holds ``swaps`` (copies of the plan, the same on every
rank), ``swap_sent`` / ``swap_cross_node`` (weight bytes this rank sent; to other nodes),
``swap_plan_s``, ``swap_post_s`` / ``swap_wait_s`` (this thread's time posting and waiting for
copies), ``swap_in_flight`` (copies of this rank still running after the step: must be 0) and,
measured, ``swap_control_s`` / ``swap_alone_s``; ``fold_swaps`` folds every rank's record.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

SWAP_COPY_MODES = {
    "hidden": "weight copies run beside the next step; a swapped slot's GEMM waits for its own weights",
    "blocking": "weight copies finish before the next step starts",
}
_KEYS = ("swaps", "swap_sent", "swap_cross_node", "swap_plan_s", "swap_post_s", "swap_wait_s", "swap_in_flight",
         "swap_again_s", "swap_control_s", "swap_alone_s")


class SwapSteps:
    """The swaps of one swapping system's layer on this rank (module docstring).

    ``layer``: the ``MoELayer``; ``cfg``: the worker config; ``rank`` / ``gpus_per_node``: where
    this rank is; ``record``: the system's record (``_KEYS`` lists are appended per timed step).
    """

    def __init__(self, layer, cfg: dict, rank: int, gpus_per_node: int, record: dict):
        self.layer, self.rank, self.L = layer, rank, gpus_per_node
        self.relaxation = cfg["relaxation"]
        self.mode = cfg.get("swap_copies") or "hidden"
        if self.mode not in SWAP_COPY_MODES:
            raise ValueError(f"swap_copies must be one of {', '.join(SWAP_COPY_MODES)}, got {self.mode!r}")
        self.measure = int(cfg.get("swap_measure") or 0)  # rounds of replays per swapped step
        self.record = record
        for k in _KEYS:
            record.setdefault(k, [])
        self.plan, self.old, self.stats = None, None, None
        self.saved, self.scratch = None, None  # with measure: the weights before the step, scratch copies
        self.plan_s = 0.0

    def before(self) -> None:
        """Inside the step's timed window, before the layer: plan from the last batch's slot
        loads and post the copies (``blocking``: and finish them)."""
        from zepp.planner.adaptation.swaps import plan_swaps

        d = self.layer.dispatcher
        self.plan, self.stats, self.plan_s = None, None, 0.0
        if d.last_plan is None:
            return
        t0 = time.perf_counter()
        sp = plan_swaps(d.placement, d.last_plan.routing.slot_loads(), self.relaxation)
        self.plan_s = time.perf_counter() - t0
        if not sp.num_swapped_slots:
            return
        self.plan, self.old = sp, d.placement
        self.layer.begin_swaps(sp)
        if self.mode == "blocking":
            self.stats = self.layer.finish_swaps()

    def after(self, timed: bool) -> None:
        """Inside the timed window, after the layer: finish the copies; record the step."""
        if self.plan is not None and self.mode == "hidden":
            pending = self.layer.pending
            self.stats = self.layer.finish_swaps()
            in_flight = pending.in_flight()
        else:
            in_flight = 0
        if not timed:
            return
        st = self.stats if self.plan is not None else None
        rec = self.record
        rec["swaps"].append(0 if st is None else st.copies)
        rec["swap_sent"].append(0 if st is None else st.sent)
        rec["swap_cross_node"].append(0 if st is None else st.cross_node(self.rank, self.L))
        rec["swap_plan_s"].append(self.plan_s)
        rec["swapped_slots"] += rec["swaps"][-1]
        rec["swap_bytes"] += rec["swap_sent"][-1]
        rec["swap_post_s"].append(0.0 if st is None else st.post_s)
        rec["swap_wait_s"].append(0.0 if st is None else st.wait_s)
        rec["swap_in_flight"].append(in_flight)

    def replay(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, y: torch.Tensor, timed: bool) -> None:
        """With ``swap_measure = K``, after a step (outside its timed window): for a timed step
        that swapped, ``K`` rounds of the three replays (module docstring), each between
        barriers; then the weights are saved for the next step's replays (untimed)."""
        rec = self.record
        if not self.measure:
            return
        if timed and self.plan is None:
            for k in ("swap_again_s", "swap_control_s", "swap_alone_s"):
                rec[k].append(None)
        elif timed:
            again, control, alone = [], [], []
            for _ in range(self.measure):
                self._restore()
                again.append(self._timed(lambda: self._again(x, ids, w, y)))
                control.append(self._timed(lambda: self._same(self.layer(x, ids, w), y)))
                alone.append(self._timed(self._alone))
            rec["swap_again_s"].append(again)
            rec["swap_control_s"].append(control)
            rec["swap_alone_s"].append(alone)
        self.saved = (self.layer.w1.clone(), self.layer.w2.clone())  # the weights the next swap starts from
        self.scratch = [self.layer.w1.clone(), self.layer.w2.clone()]

    @staticmethod
    def _timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def _restore(self) -> None:
        """The weights and placement from before the step's swap (saved after the step before)."""
        self.layer.w1.copy_(self.saved[0])
        self.layer.w2.copy_(self.saved[1])
        self.layer.dispatcher.set_placement(self.old)

    def _again(self, x, ids, w, y) -> None:
        """The swapped step again: the same copies posted, the layer, the rest of the copies."""
        self.layer.begin_swaps(self.plan)
        y2 = self.layer(x, ids, w)
        self.layer.finish_swaps()
        self._same(y2, y)

    def _same(self, y2: torch.Tensor, y: torch.Tensor) -> None:
        _sync(y2)
        self.record["replay_same"] = self.record.get("replay_same", True) and bool(torch.equal(y, y2))

    def _alone(self) -> None:
        """The same copies (pairs, bytes) alone and blocking, into scratch tensors."""
        from zepp.runtime.swap_copies import post_copies

        post_copies(self.scratch, self.plan.copies, self.old.slot_expert, self.plan.placement.slot_expert,
                    self.layer._channel, self.L).finish()


def _sync(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)


def _median(v) -> float | None:
    v = [x for x in v if x is not None]
    return float(np.median(v)) if v else None


def _fold_replays(recs: list[dict], n: int) -> dict:
    """Per step and round the slowest rank's ``again`` / ``control`` / ``alone``; per step the
    median over rounds of ``again - control`` (``added_ms_per_step``) and of ``alone``; overall
    medians over the steps that swapped, and their ratio."""
    def slowest(key: str, i: int):
        if recs[0][key][i] is None:
            return None
        return np.max(np.array([r[key][i] for r in recs]), axis=0)

    added, alone, ctrl = [], [], []
    for i in range(n):
        a, c, b = slowest("swap_again_s", i), slowest("swap_control_s", i), slowest("swap_alone_s", i)
        added.append(None if a is None else float(np.median(a - c)) * 1e3)
        alone.append(None if b is None else float(np.median(b)) * 1e3)
        ctrl.append(None if c is None else float(np.median(c)) * 1e3)
    med_added, med_alone = _median(added), _median(alone)
    return dict(added_ms_per_step=added, alone_ms=alone, control_ms=ctrl, added_ms=med_added,
                alone_median_ms=med_alone, added_over_alone=None if not med_alone else med_added / med_alone,
                replay_same=all(r.get("replay_same", True) for r in recs))


def fold_swaps(recs: list[dict]) -> dict:
    """The report's ``swaps`` section of a swapping system from every rank's record ``recs``.

    Per timed step: ``per_step`` copies (rank 0's: the plan is the same everywhere),
    ``bytes_per_step`` / ``cross_node_bytes_per_step`` summed over ranks, ``exposed_ms`` the
    slowest rank's posting + waiting, ``plan_ms`` the slowest rank's planning; measured also
    ``_fold_replays``'s figures.
    """
    r0 = recs[0]
    n = len(r0.get("swaps", []))
    col = lambda k: np.array([[r[k][i] for i in range(n)] for r in recs], dtype=float)  # noqa: E731
    out = {"mode": None, "per_step": r0.get("swaps", []),
           "bytes_per_step": col("swap_sent").sum(axis=0).astype(np.int64).tolist() if n else [],
           "cross_node_bytes_per_step": col("swap_cross_node").sum(axis=0).astype(np.int64).tolist() if n else [],
           "exposed_ms": ((col("swap_post_s") + col("swap_wait_s")).max(axis=0) * 1e3).tolist() if n else [],
           "plan_ms": (col("swap_plan_s").max(axis=0) * 1e3).tolist() if n else [],
           "in_flight_after_step": int(sum(sum(r.get("swap_in_flight", [])) for r in recs))}
    if n and r0.get("swap_control_s"):
        out.update(_fold_replays(recs, n))
    return out
