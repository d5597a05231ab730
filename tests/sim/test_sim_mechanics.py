"""Each baseline mechanism of PAPER.md section 7 moves the simulated timeline the way its source
says, on tiny clusters: the ``Mechanics`` records (``zepp.sim.mechanics``) and the baselines'
special phases (``zepp.sim.phases``: COMET's all-gather and ring combine, FAST's rounds,
MoonEP's pulls)."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.model import model_preset
from zepp.planner.routing import moonep_plan
from zepp.sim.calibrate import calibrated
from zepp.sim.mechanics import EPIC_RELAY_PUT, mechanics
from zepp.sim.phases.fast import bvn_rounds
from zepp.sim.phases.moonep import moonep_pulls
from zepp.sim.run import Config, Shared, run_system, simulate_plan
from simcases import skewed_batch, skewed_config


@pytest.fixture(scope="module")
def cfg():
    return skewed_config(1, 3, 1, 32, warmup=0, hidden=1024, ffn=512, num_experts=96)


def sim(cfg, name, mech=None):
    """``(Timeline, planning s)`` of system ``name`` on the fixture's batch, optionally with
    another ``Mechanics`` record."""
    s = registry.system(name)
    tl, planning, _ = simulate_plan(cfg, s, Shared().plan(s, cfg, 0), keep=True, mech=mech)
    return tl, planning


def labelled(tl, label):
    return np.flatnonzero(np.array(tl.label) == label)


def test_epic_serial_relay_stages_cost_the_measured_put_per_remote_node(cfg):
    """EPIC's NIC stage of the dispatch and its one-round combine are serial proxy puts at
    0.34-0.45 ms each: the layer takes at least the prologue plus 2 (N-1) of them, and the
    measured per-put cost makes it slower than the calibrated one (by at least one stage's
    worth; waits elsewhere may absorb part of the other)."""
    N = cfg.cluster.nodes
    tl, _ = sim(cfg, "epic")
    pro_end = tl.end[labelled(tl, "plan")].max()
    assert tl.latency >= pro_end + 2 * (N - 1) * EPIC_RELAY_PUT
    calibrated_put = replace(mechanics("epic-relay"), serial_put=None)
    tl_fitted, _ = sim(cfg, "epic", calibrated_put)
    put = cfg.net.put(cfg.cluster.ranks)
    assert tl.latency - tl_fitted.latency >= (N - 1) * (EPIC_RELAY_PUT - put)  # at least one stage's worth


def test_eplb_two_team_barriers_per_call(cfg):
    """EPLB's staged all-to-all: two calls per phase (rows, then fp32 route weights), two team
    barriers each, all on the critical path: at least 2 phases x 2 calls x 2 barriers more than
    one barrier-free call."""
    tl, _ = sim(cfg, "eplb")
    one_call, _ = sim(cfg, "eplb", replace(mechanics("eplb-staged"), calls=1))
    assert tl.latency - one_call.latency >= 8 * cfg.net.barrier(cfg.cluster.ranks) * (1 - 1e-9)


def test_comet_ring_combine_runs_l_minus_1_steps_after_the_column_barrier(cfg):
    """COMET's combine: per (node, column chunk) a barrier after the node's GEMM 2 split, L-1
    NVLink ring steps in sequence, then puts with signal that each owner polls (2 us per flag);
    an owner's reduce comes after all of it."""
    L, N, R = cfg.cluster.gpus_per_node, cfg.cluster.nodes, cfg.cluster.ranks
    tl, _ = sim(cfg, "comet")
    bars, steps = labelled(tl, "column-split barrier"), labelled(tl, "ring step")
    assert bars.size == N * L and steps.size == N * L * (L - 1)
    # each chunk's L-1 steps run one after another: the last step ends (L-1) message costs after its barrier
    assert tl.end[steps].max() >= tl.end[bars].min() + (L - 1) * cfg.cluster.nvlink_msg_cost
    polls, red = labelled(tl, "flag polls"), labelled(tl, "reduce")
    puts = labelled(tl, "put-with-signal")
    flags = np.bincount(np.asarray(tl.rank)[puts], minlength=R)
    assert np.allclose(tl.end[polls] - tl.start[polls], flags * cfg.net.signal)
    assert tl.start[red].min() >= tl.end[steps].min()
    assert (tl.start[red] >= tl.end[polls] - 1e-12).all()


def test_comet_puts_with_signal_are_fenced_one_after_another(cfg):
    """COMET's puts-with-signal through NVSHMEM's proxy are put + fence + signal, the fence a quiet:
    a GPU's cross-node ones run one after another, each a blocking put; switched off they overlap."""
    put = cfg.net.put(cfg.cluster.ranks)

    def per_sender(tl):
        """Per sending GPU, its cross-node puts-with-signal in start order."""
        puts = labelled(tl, "put-with-signal")
        puts = puts[[tl.resource[i].startswith("nic") for i in puts]]  # "nic<src>.send"
        src = np.array([int(tl.resource[i][3:].split(".")[0]) for i in puts])
        return [np.sort(puts[src == r]) for r in np.unique(src)]

    def overlapping(tl, mine):
        mine = mine[np.argsort(tl.start[mine], kind="stable")]
        return bool((tl.start[mine[1:]] < tl.end[mine[:-1]] - 1e-12).any())

    tl, _ = sim(cfg, "comet")
    senders = per_sender(tl)
    assert len(senders) == cfg.cluster.ranks
    for mine in senders:
        assert not overlapping(tl, mine)
        assert tl.end[mine].max() - tl.start[mine].min() >= mine.size * put * (1 - 1e-9)
    off, _ = sim(cfg, "comet", replace(mechanics("comet"), fenced_signals=False))
    assert any(overlapping(off, mine) for mine in per_sender(off))
    assert tl.latency > off.latency


def test_comet_flag_polls_before_gemm_tiles(cfg):
    """GEMM tiles wait on per-source flags: one 2 us wait per source rank before the rows."""
    L, R = cfg.cluster.gpus_per_node, cfg.cluster.ranks
    tl, _ = sim(cfg, "comet")
    remote = labelled(tl, "remote rows")
    assert np.allclose(tl.end[remote] - tl.start[remote], (R - L) * cfg.net.signal)


def test_fast_rounds_end_in_world_barriers(cfg):
    """FAST's synchronous host-driven rounds: one world barrier per Birkhoff-von Neumann round."""
    tl, _ = sim(cfg, "fast")
    syncs = labelled(tl, "round sync")
    assert syncs.size >= 2  # at least one round per phase on 3 nodes
    assert tl.latency >= syncs.size * cfg.net.barrier(cfg.cluster.ranks)


def test_moonep_gemms_wait_for_the_pulled_weights(cfg):
    """MoonEP pulls the prefetched experts' weights (w1 + w2) from their home ranks before any
    of the puller's GEMMs."""
    s = registry.system("moonep")
    plan = Shared().plan(s, cfg, 0)
    pulls = moonep_pulls(plan)
    tl, _ = sim(cfg, "moonep")
    copies = labelled(tl, "weights")
    assert copies.size == len(pulls) > 0
    gemms = np.flatnonzero(np.array(tl.kind) == "gemm")
    rank = np.asarray(tl.rank)
    for r in np.unique(pulls[:, 1]):
        mine = gemms[rank[gemms] == r]
        assert tl.start[mine].min() >= tl.end[copies[rank[copies] == r]].max() - 1e-12


def test_moonep_balance_gives_every_rank_its_share():
    """MoonEP's per-batch balance (the routing behind its pulls): every rank computes exactly
    ``T * k`` rows when the prefetch slots suffice, and each pull crosses ranks."""
    rng = np.random.default_rng(1)
    topk = skewed_batch(rng, 1, 8, 64, 128, 8)[0]
    routing, pulls = moonep_plan(topk, 128, 4)
    routing.validate()
    rows = routing.rows_per_rank()
    assert rows.sum() == 8 * 64 * 8
    assert rows.max() == 64 * 8
    assert len(pulls) > 0 and (pulls[:, 0] != pulls[:, 1]).all()


def test_fast_rounds_rebuild_the_node_matrix():
    """Birkhoff-von Neumann rounds: permutations whose real bytes add up to the matrix, each
    round lasting ``amount``, the rounds together the busiest line."""
    rng = np.random.default_rng(2)
    m = rng.integers(0, 100, size=(5, 5)).astype(float)
    np.fill_diagonal(m, 0)
    rounds = bvn_rounds(m)
    rebuilt = np.zeros_like(m)
    for perm, amount, real in rounds:
        assert sorted(perm.tolist()) == list(range(5))
        assert (real <= amount + 1e-9).all()
        rebuilt[np.arange(5), perm] += real
    assert rebuilt == pytest.approx(m)
    assert sum(a for _, a, _ in rounds) == pytest.approx(max(m.sum(0).max(), m.sum(1).max()))


def test_special_phases_survive_ranks_without_gemm_work():
    """Top-1 routing at 16 nodes: whole home ranks are cold (no entry at all); FAST's combine
    used to crash there (one GEMM-2 task per rank assumed)."""
    cl, net = calibrated("a100", 16)
    spec = model_preset("llama4-maverick").with_(hidden=512, ffn=256)  # 128 experts, top-1
    rng = np.random.default_rng(3)
    batches = rng.integers(0, 64, size=(2, cl.ranks, 8, 1)).astype(np.int32)  # experts 64.. (ranks 32..) cold
    hist = np.ones((cl.nodes, spec.num_experts), np.int64)
    c = Config(cl, spec, net, hist, batches, warmup=1)
    routing_rows = np.bincount(batches[1].ravel() // 2, minlength=cl.ranks)  # home: 2 experts per rank
    assert (routing_rows == 0).any()  # the case: some home ranks compute nothing
    for name in ("fast", "a2av", "comet", "zepp-overlap", "eplb", "epic", "moonep"):
        res = run_system(name, c)
        assert np.isfinite(res.latencies).all() and min(res.latencies) > 0


def test_column_sends_split_the_combine_and_overlap_gemm2(cfg):
    # zepp-deepep-table-cols: GEMM 2 in column splits, each split's slice of the partials leaves at once
    plain = replace(mechanics("deepep-ll-cols"), gemm2="single", gemm2_splits=1)
    split = replace(mechanics("deepep-ll-cols"), gemm2_splits=3)
    a, _ = sim(cfg, "zepp-deepep-table-cols", plain)
    b, _ = sim(cfg, "zepp-deepep-table-cols", split)
    comb_a = np.array([k == "combine" for k in a.kind]) & (a.bytes > 0)
    comb_b = np.array([k == "combine" for k in b.kind]) & (b.bytes > 0)
    assert np.isclose(a.bytes[comb_a].sum(), b.bytes[comb_b].sum())  # the same bytes, in three slices
    assert comb_b.sum() == 3 * comb_a.sum()
    gemm2_b = np.flatnonzero(np.array([lab.startswith("gemm2") for lab in b.label]))
    assert len(gemm2_b) == 3 * len(np.flatnonzero(np.array([lab.startswith("gemm2") for lab in a.label])))
    last_gemm2 = b.end[gemm2_b].max()
    assert (b.start[comb_b] < last_gemm2).any()  # a slice leaves while GEMM 2 still runs
    assert not (a.start[comb_a] < a.end[np.array([lab.startswith("gemm2") for lab in a.label])].min()).any()


def test_table_routing_planning_is_one_lookup_kernel_and_no_gather(cfg):
    tl, planning = sim(cfg, "zepp-deepep-table")
    assert 0 < planning < 2 * cfg.cluster.kernel_launch
    gather = np.array([k == "allgather" for k in tl.kind])
    assert np.allclose(tl.end[gather] - tl.start[gather], 0.0)
    _, zepp_planning = sim(cfg, "zepp-deepep-ll")
    assert zepp_planning > 3 * planning
