"""Each baseline mechanism of PAPER.md section 7 moves the simulated timeline the way its source
says, on tiny clusters (``zepp.sim.mechanics``, ``zepp.sim.plugins``)."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.sim.calibrate import calibrated
from zepp.model import model_preset
from zepp.sim.phases.moonep import moonep_pulls
from zepp.sim.engine import TaskGraph
from zepp.sim.layer import LayerBuilder
from zepp.sim.mechanics import EPIC_RELAY_PUT, Mechanics, mechanics
from zepp.sim.run import Shared, simulate_plan
from simcases import skewed_config


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


def test_comet_column_splits_read_the_weights_once():
    """GEMM 2 split by columns: the splits sum to one GEMM's time plus a launch each (no
    re-read of the weights per split, unlike one GEMM per destination wave)."""
    cl, net = calibrated("a100", 1)
    spec = model_preset("k2")
    b = LayerBuilder(TaskGraph(cl), cl, spec, net, Mechanics())
    b.S, b.T = 4, 1
    cls, slot = np.zeros(40, np.int64), np.arange(40) % 4
    single = b.gemm_tasks(cls, slot, 1, lambda k: k, "g")[0, 0]
    first = b.gemm_tasks(cls, slot, 1, lambda k: k, "g", splits=4)[0, 0]
    dur = b.g.columns()["dur"]
    parts = dur[b.column_splits[:, 0, 0]]
    assert first == b.column_splits[0, 0, 0]
    assert parts.sum() == pytest.approx(dur[single] + 3 * cl.kernel_launch)


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


def test_new_mechanics_are_bit_identical_across_runs(cfg):
    """The ring combine, column splits and EPIC's serial puts are deterministic."""
    for name in ("comet", "comet+eplb", "epic"):
        a, _ = sim(cfg, name)
        b, _ = sim(cfg, name)
        assert a.latency == b.latency and np.array_equal(a.end, b.end)
