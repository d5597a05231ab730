"""``zepp-swap`` in ``zepp run``: per step, plan swaps from the previous batch's slot loads, post
their weight copies (``zepp.runtime.swap_copies``), run the layer, finish; record what it cost.

Modes (worker config ``swap_copies``, a name of ``SWAP_COPY_MODES``): ``hidden`` (default: the
copies run beside the step, a slot's GEMM waits for its own weights) or ``blocking`` (the same
copies, finished before the layer starts, as swaps ran before).

With ``swap_measure`` (worker config; the benchmark's switch, ``benchmarks/swap_bench.py``),
every timed step that swapped is followed, outside its timed window, by two replays on the same
rank group, each between barriers:

- ``control``: the same layer call again (same batch, same new placement, weights already in
  place, nothing in flight); its output must equal the step's bit for bit (``replay_same``);
- ``alone``: the same copies again (same pairs, same bytes, into scratch tensors), alone and
  blocking.

So ``step - control`` is the time the swap added to the step, against ``alone``, what its copies
take when nothing hides them. The replays put their own bytes on the links after the step's
window: ``zepp run --emulate``'s NIC figures of a measured swapping system include them.

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
         "swap_control_s", "swap_alone_s")


class SwapSteps:
    """The swaps of one ``zepp-swap`` layer on this rank (module docstring).

    ``layer``: the ``MoELayer``; ``cfg``: the worker config; ``rank`` / ``gpus_per_node``: where
    this rank is; ``record``: the system's record (``_KEYS`` lists are appended per timed step).
    """

    def __init__(self, layer, cfg: dict, rank: int, gpus_per_node: int, record: dict):
        self.layer, self.rank, self.L = layer, rank, gpus_per_node
        self.relaxation = cfg["relaxation"]
        self.mode = cfg.get("swap_copies") or "hidden"
        if self.mode not in SWAP_COPY_MODES:
            raise ValueError(f"swap_copies must be one of {', '.join(SWAP_COPY_MODES)}, got {self.mode!r}")
        self.measure = bool(cfg.get("swap_measure"))
        self.record = record
        for k in _KEYS:
            record.setdefault(k, [])
        self.plan, self.old, self.stats = None, None, None
        self.plan_s = 0.0

    def before(self) -> None:
        """Inside the step's timed window, before the layer: plan from the last batch's slot
        loads and post the copies (``blocking``: and finish them)."""
        from zepp.planner.swaps import plan_swaps

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

    def replay(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
        """With ``swap_measure``, after a timed step: the ``control`` and ``alone`` replays."""
        if not self.measure:
            return
        if self.plan is None:
            self.record["swap_control_s"].append(None)
            self.record["swap_alone_s"].append(None)
            return
        from zepp.runtime.swap_copies import post_copies

        dist.barrier()
        t0 = time.perf_counter()
        y2 = self.layer(x, ids, w)
        _sync(y2)
        self.record["swap_control_s"].append(time.perf_counter() - t0)
        self.record["replay_same"] = self.record.get("replay_same", True) and bool(torch.equal(y, y2))
        scratch = [self.layer.w1.clone(), self.layer.w2.clone()]
        dist.barrier()
        t0 = time.perf_counter()
        post_copies(scratch, self.plan.copies, self.old.slot_expert, self.plan.placement.slot_expert,
                    self.layer._channel, self.L).finish()
        self.record["swap_alone_s"].append(time.perf_counter() - t0)


def _sync(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)


def _median(v) -> float | None:
    v = [x for x in v if x is not None]
    return float(np.median(v)) if v else None


def fold_swaps(recs: list[dict]) -> dict:
    """The report's ``swaps`` section of a swapping system from every rank's record ``recs``.

    Per timed step: ``per_step`` copies (rank 0's: the plan is the same everywhere),
    ``bytes_per_step`` / ``cross_node_bytes_per_step`` summed over ranks, ``exposed_ms`` the
    slowest rank's posting + waiting, ``plan_ms`` the slowest rank's planning; measured also
    ``control_ms`` / ``alone_ms`` (slowest rank) and the medians ``added_ms`` (step - control,
    over steps with swaps) and ``added_over_alone``.
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
        steps = np.max(np.array([r["times"] for r in recs]), axis=0)
        ctrl = [None if r0["swap_control_s"][i] is None else max(r["swap_control_s"][i] for r in recs)
                for i in range(n)]
        alone = [None if r0["swap_alone_s"][i] is None else max(r["swap_alone_s"][i] for r in recs)
                 for i in range(n)]
        added = [None if c is None else float(steps[i] - c) for i, c in enumerate(ctrl)]
        ms = lambda v: [None if x is None else x * 1e3 for x in v]  # noqa: E731
        med_added, med_alone = _median(added), _median(alone)
        out.update(control_ms=ms(ctrl), alone_ms=ms(alone), added_ms_per_step=ms(added),
                   added_ms=None if med_added is None else med_added * 1e3,
                   alone_median_ms=None if med_alone is None else med_alone * 1e3,
                   added_over_alone=None if not med_alone else med_added / med_alone,
                   replay_same=all(r.get("replay_same", True) for r in recs))
    return out
