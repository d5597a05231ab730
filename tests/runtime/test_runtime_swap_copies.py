"""Swap copies that hide behind the step (``zepp.runtime.swap_copies``, ``zepp.runtime.swap_steps``).

In process, with stand-in transfers: a swapped slot's GEMM runs only after its own copy has
landed (and waits for nothing else), the other slots' rows run first, the result is the
blocking one bit for bit, ``finish`` leaves nothing running, cross-node copies are refused
before anything is posted. Over real gloo ranks (2 nodes x 2): hidden and blocking swaps give
bit-identical outputs, correct against the reference, with swaps happening, no byte across
nodes and nothing in flight after a step. No timing is asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zepp.runtime.experts import grouped_down, grouped_up
from zepp.runtime.swap_copies import CopyStats, PendingCopies, SwapError, _Incoming, post_copies


class FakeWork:
    """A transfer that completes when waited on; logs the wait."""

    def __init__(self, log: list, name: str):
        self.log, self.name, self.done = log, name, False

    def wait(self):
        self.log.append(("wait", self.name))
        self.done = True
        return True

    def is_completed(self):
        return self.done


def _setup(S=4, H=6, F=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    final_w1 = torch.randn(S, H, F, generator=g)  # the weights after the swap
    stale = final_w1.clone()
    stale[1] = torch.randn(H, F, generator=g)  # slots 1 and 3 still hold the old experts
    stale[3] = torch.randn(H, F, generator=g)
    log: list = []
    incoming = {s: _Incoming([final_w1[s].clone()], [FakeWork(log, f"recv{s}")]) for s in (1, 3)}
    send = FakeWork(log, "send")
    pc = PendingCopies([stale], incoming, [(send, None)], np.array([], np.int64), CopyStats(2, np.zeros(4, np.int64)))
    return final_w1, stale, pc, log, send


def test_a_swapped_slots_gemm_waits_for_its_own_weights_and_runs_last():
    final_w1, stale, pc, log, _ = _setup()
    slot = np.array([0, 0, 1, 1, 1, 2])  # slot 3 has no rows here: its copy must not be waited for
    x = torch.randn(6, 6)
    seen = []

    def gemm(xs, sl, w):
        seen.append(sorted(set(sl.tolist())))
        for s in set(sl.tolist()):  # the weights this GEMM reads are the final ones
            assert torch.equal(w[s], final_w1[s]), f"slot {s} computed before its weights landed"
        log.append(("gemm", tuple(sorted(set(sl.tolist())))))
        return grouped_up(xs, sl, w)

    y = pc.grouped(gemm, x, slot, stale)
    assert seen == [[0, 2], [1]]  # other slots first, then the swapped slot alone
    assert log.index(("wait", "recv1")) < log.index(("gemm", (1,)))
    assert ("wait", "recv3") not in log
    assert list(pc.waiting()) == [3]
    assert torch.equal(y, grouped_up(x, slot, final_w1))  # bit-identical to weights already in place


def test_finish_leaves_nothing_running_and_zeroes_emptied_slots():
    final_w1, stale, pc, log, send = _setup()
    pc.emptied = np.array([0])
    assert pc.in_flight() == 3
    st = pc.finish()
    assert pc.in_flight() == 0 and send.done and st.waited_slots == 2
    assert torch.equal(stale[1], final_w1[1]) and torch.equal(stale[3], final_w1[3])
    assert not stale[0].any()


def test_down_projection_with_pending_slots_is_bit_identical():
    g = torch.Generator().manual_seed(3)
    w2 = torch.randn(4, 5, 6, generator=g)
    stale = w2.clone()
    stale[2] = 0
    pc = PendingCopies([stale], {2: _Incoming([w2[2].clone()], [])}, [], np.array([], np.int64),
                       CopyStats(1, np.zeros(2, np.int64)))
    slot = np.array([0, 2, 2, 3, 3])
    inter = torch.randn(5, 5, generator=g)
    assert torch.equal(pc.grouped(grouped_down, inter, slot, stale), grouped_down(inter, slot, w2))


class _NoChannel:
    rank, world, host_p2p, nccl, stream = 0, 4, False, False, None


def test_cross_node_copy_is_refused_before_anything_is_posted():
    old = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])
    w = [torch.zeros(2, 3)]
    with pytest.raises(SwapError, match="another node"):
        post_copies(w, [[0, 4, 0]], old, old, _NoChannel(), gpus_per_node=2)  # rank 0 -> rank 2
    with pytest.raises(SwapError, match="does not hold"):
        post_copies(w, [[1, 2, 0]], old, old, _NoChannel(), gpus_per_node=2)


def test_hidden_swaps_over_gloo_match_blocking_swaps_bit_for_bit():
    from zepp.launch.ranks import spawn_local
    from zepp.runtime.worker import MODULE, default_config

    cfg = default_config()
    # random skewed batches, tight relaxation so swaps fire; both modes in one process group
    cfg.update(nodes=2, gpus_per_node=2, iters=4, warmup=1, timeout=60, check=True, systems=["zepp-swap"],
               model="olmoe", experts=16, topk=4, hidden=32, ffn=16, tokens=24, relaxation=0.1, swap_measure=True,
               cases=[dict(swap_copies="hidden"), dict(swap_copies="blocking")])
    hidden, blocking = (c["systems"]["zepp-swap"] for c in spawn_local(MODULE, cfg)["cases"])
    for s in (hidden, blocking):
        sw = s["swaps"]
        assert s["correct"] and s["bytes_match"], s["max_rel_err"]
        assert sum(sw["per_step"]) > 0 and sum(sw["bytes_per_step"]) > 0, "no swap happened"
        assert sum(sw["cross_node_bytes_per_step"]) == 0
        assert sw["in_flight_after_step"] == 0
        assert sw["replay_same"]  # the step's output equals a replay with the weights in place
    assert hidden["swaps"]["mode"] == "hidden" and blocking["swaps"]["mode"] == "blocking"
    assert hidden["output_digest"] == blocking["output_digest"]
    assert hidden["swaps"]["per_step"] == blocking["swaps"]["per_step"]


def test_rows_of_slots_in_flight_wait_in_the_queue_until_drain():
    final_w1, stale, pc, log, _ = _setup()
    pc.incoming[3].works[0].done = True  # slot 3's copy has landed already: no wait, computed at once
    slot = np.array([0, 1, 1, 3])
    x = torch.randn(4, 6)
    got = torch.full((4, 5), float("nan"))
    put = lambda sel, y: got.index_copy_(0, torch.as_tensor(sel), y)  # noqa: E731
    pc.run(grouped_up, x, slot, stale, put)
    assert torch.isnan(got[1:3]).all() and not torch.isnan(got[[0, 3]]).any()  # slot 1 queued
    assert ("wait", "recv1") not in log and list(pc.waiting()) == [1]
    pc.drain()
    assert ("wait", "recv1") in log and pc.waiting().size == 0
    assert torch.equal(got, grouped_up(x, slot, final_w1))


def test_run_schedule_is_checked_before_any_rank_starts(capsys):
    from clirun import run_cli
    from zepp.traces.schedules import SCHEDULES

    code, out, err = run_cli(["run", "--schedule", "drifting", "--systems", "zepp-overlap,zepp-swap"], capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"zepp: error: --schedule 'drifting': unknown schedule; choose from {', '.join(SCHEDULES)}"]
