"""Every registry system the simulator runs: a valid latency above its own physical floor, the
same to the last bit with or without shared plans, ``zepp`` its best variant, the network moving
latencies the right way, and every name a row gives the simulator found in its tables."""

from dataclasses import replace

import numpy as np
import pytest

from zepp import registry
from zepp.sim.mechanics import MECHANICS
from zepp.sim.phases import PHASES
from zepp.sim.planning_cost import MODELS
from zepp.sim.run import Config, Shared, run_system
from simcases import skewed_config

SIM_SYSTEMS = registry.names_for("sim")


@pytest.fixture(scope="module")
def cfg():
    return skewed_config(0, 2, 3, 48, hidden=1024, ffn=512)


@pytest.fixture(scope="module")
def shared():
    return Shared()


@pytest.mark.parametrize("name", SIM_SYSTEMS)
def test_system_latency_is_valid_deterministic_and_above_its_floor(cfg, shared, name):
    res = run_system(name, cfg)
    assert len(res.latencies) == 2
    for lat, floor in zip(res.latencies, res.lower_bound):
        assert np.isfinite(lat) and lat > 0
        assert lat >= floor * (1 - 1e-9), f"{name} beat its own physical floor"
    again = run_system(name, cfg, shared=shared)  # plans shared with the systems run before it
    assert again.latencies == res.latencies and again.planning == res.planning  # bit-identical


def test_zepp_is_its_best_variant(cfg):
    best = run_system("zepp", cfg)
    medians = {v: run_system(v, cfg).median for v in registry.SYSTEMS["zepp"].best_of}
    assert best.variant == min(medians, key=medians.get)
    assert best.median == medians[best.variant]


def test_more_bandwidth_never_hurts_and_slower_puts_cost_time(cfg):
    """The simulated latency responds to the network in the right direction: a faster NIC
    never makes a2av slower, a costlier put makes it slower."""
    base = run_system("a2av", cfg).median
    fast = Config(cfg.cluster.with_(nic_bw=cfg.cluster.nic_bw * 4), cfg.spec, cfg.net, cfg.hist, cfg.batches,
                  warmup=cfg.warmup)
    slow = Config(cfg.cluster, cfg.spec, replace(cfg.net, put_c0=cfg.net.put_c0 * 3), cfg.hist, cfg.batches,
                  warmup=cfg.warmup)
    assert run_system("a2av", fast).median <= base < run_system("a2av", slow).median


@pytest.mark.parametrize("name", SIM_SYSTEMS)
def test_every_name_a_row_gives_the_simulator_is_in_its_tables(name):
    s = registry.SYSTEMS[name]
    if s.best_of:
        assert all(v in SIM_SYSTEMS for v in s.best_of)
        return
    assert s.mechanics in MECHANICS
    assert s.planning in MODELS
    assert set(s.plugins) <= set(PHASES)
