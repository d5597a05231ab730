"""The integer key joins (``zepp.sim.joins``) against brute force, and the simulator's
large-configuration path is exact: the block-by-block key join that lets 16-32-node prefill
layers be built (``join_blocked``) finds the same message dependencies, in the same order, as
one sort of both sides (``join_sorted``), for the hop tables of today's systems (DeepEP normal
kernels under sglang / vllm, Zepp's variants) and the paper's relays, on several cluster
shapes. The graph ``build_layer`` makes is therefore the same task for task, and so is every
simulated figure; no configuration switches to an approximate path."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from zepp import registry
from zepp.planner.overlap.grouping import messages
from zepp.model import model_preset
from zepp.sim.calibrate import calibrated
from zepp.sim.joins import join_blocked, join_keys, join_sorted, stage_message_pairs
from zepp.sim.run import Config, Shared

# systems whose dispatch or combine has more than one stage (the only phases stage_message_pairs joins)
SYSTEMS = ("sglang-deepep-normal", "vllm-eplb-normal", "zepp-deepep-normal", "zepp-deepep-overlap", "epic")
SHAPES = (("h200-8", 2, 8, "qwen", 64), ("h200-8", 4, 8, "k2", 32), ("gb200-nvl72", 2, 64, "deepseek-v3", 16))


def uniform_config(preset: str, nodes: int, gpn: int, model: str, tokens: int) -> Config:
    """``tokens`` per GPU, each with top-k experts drawn uniformly (DeepEP's benchmark setting)."""
    cl, net = calibrated(preset, nodes, gpus_per_node=gpn)
    spec = model_preset(model)
    rng = np.random.default_rng(nodes)
    ids = np.argsort(rng.random((1, cl.ranks, tokens, spec.num_experts)), axis=-1)[..., :spec.top_k]
    return Config(cl, spec, net, np.ones((nodes, spec.num_experts)), ids.astype(np.int32), warmup=0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-{s[1]}x{s[2]}-{s[3]}")
def test_blocked_join_gives_the_same_stage_dependencies(shape):
    """Blocks of 16 keys (hundreds of blocks on these shapes; a 32x8 prefill layer has 64-256 of
    4M keys) against one sort of both sides: the same message pairs, element for element."""
    cfg = uniform_config(*shape)
    R, T = cfg.cluster.ranks, shape[4]
    shared = Shared()
    joined = 0
    for name in SYSTEMS:
        plan = shared.plan(registry.system(name), cfg, 0)
        for h in (plan.dispatch, plan.combine):
            if not (h.stage > 0).any():
                continue
            hop_msg = messages(h, R).hop_msg
            exact = stage_message_pairs(h, hop_msg, R, T, join=join_sorted)
            for join in (partial(join_blocked, bits=4), partial(join_blocked, bits=9), join_keys):
                got = stage_message_pairs(h, hop_msg, R, T, join=join)
                assert np.array_equal(got[0], exact[0]) and np.array_equal(got[1], exact[1]), name
            joined += exact[0].size
    assert joined > 0  # the shapes do have multi-stage phases


@pytest.mark.parametrize("seed", range(4))
def test_blocked_join_with_repeated_keys_on_both_sides(seed):
    """Keys repeated on either side (duplicate deliveries, a2av) and blocks empty on one side."""
    rng = np.random.default_rng(seed)
    hi = [1 << 12, 1 << 20, 1 << 33, 5000][seed]
    left = rng.integers(0, hi, 3000)
    right = np.concatenate([left[rng.integers(0, left.size, 2000)], rng.integers(0, hi, 500)])
    left = np.concatenate([left, left[:300]])
    want = sorted(zip(*(a.tolist() for a in join_sorted(left, right))))
    for bits in [b for b in (3, 8, 22) if hi >> b <= 1 << 14]:
        i, j = join_blocked(left, right, bits=bits)
        assert sorted(zip(i.tolist(), j.tolist())) == want
    assert len(want) >= 2000


@pytest.mark.parametrize("seed", range(6))
def test_join_finds_every_pair_of_equal_keys(seed):
    """The key join (dense table with a sorted fallback for repeated keys, or one sort of both
    sides for wide keys) against every pair by brute force."""
    rng = np.random.default_rng(seed)
    hi = [50, 50, 1 << 30, 7, 200, 1 << 26][seed]
    left = rng.integers(0, hi, int(rng.integers(0, 60)))
    right = rng.integers(0, hi, int(rng.integers(1, 80)))
    if seed == 4:
        left = np.unique(left)  # distinct on the table side: the one-pass path
    i, j = join_keys(left, right)
    got = sorted(zip(i.tolist(), j.tolist()))
    want = sorted((a, c) for a in range(left.size) for c in range(right.size) if left[a] == right[c])
    assert got == want
