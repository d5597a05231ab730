"""zepp's model of vLLM's replica choice against vLLM 0.33.0's own code: its Triton kernel
``_eplb_map_and_record_i32_kernel`` run on the CPU through vLLM's launcher
(``vllm_code.vllm_physical_ids``), over EPLB's maps (``compute_logical_maps``) and over the per-rank
rows zepp writes (``hash_rows``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_code import vllm, vllm_physical_ids
from zepp.planner.routing import route
from zepp.planner.routing.engine_tables import build_hash_table, hash_rows, route_vllm_table
from zepp.planner.routing.vllm_routing import KNUTH
from zepp.planner.types import Placement

CASES = [(2, 2, 3, 8, 0), (2, 4, 2, 6, 1), (4, 2, 3, 16, 2), (2, 8, 3, 40, 3)]  # nodes, gpn, slots, experts, seed


def _case(nodes, gpn, slots, E, seed):
    rng = np.random.default_rng(seed)
    R = nodes * gpn
    row = rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, R * slots - E)]))
    return rng, Placement(row.reshape(R, slots), E, gpn)


def batch_demand(batch: np.ndarray, E: int) -> np.ndarray:
    """``[R, E]`` entries per (source rank, expert) of ``batch [R, T, k]``."""
    return np.stack([np.bincount(b[b >= 0], minlength=E) for b in batch.reshape(batch.shape[0], -1)]).astype(float)


def test_the_kernel_reads_the_multiplier_zepp_uses():
    with vllm() as v:
        import inspect
        assert str(KNUTH) in inspect.getsource(v.base_router._eplb_map_and_record_i32_kernel.fn)


@pytest.mark.parametrize("case", CASES)
def test_vllm_hash_gives_the_kernels_physical_ids(case):
    rng, pl = _case(*case)
    E = pl.num_experts
    ids = rng.integers(0, E, (pl.ranks, 300, 4)).astype(np.int32)
    ids[0, 5, :] = -1  # an absent token: no row of its own in the engine's batch
    ids[1, 7, 2] = -1  # a missing entry
    ours = route("vllm-hash", ids, pl).slot
    with vllm() as v:
        l2p, count = v.eplb_state.compute_logical_maps(torch.as_tensor(pl.slot_expert.ravel()), E)
        for r in range(pl.ranks):
            present = (ids[r] >= 0).any(1)
            theirs = vllm_physical_ids(v, ids[r][present], l2p.numpy(), count.numpy())
            assert np.array_equal(ours[r][present], theirs), f"rank {r}"


@pytest.mark.parametrize("case", CASES)
def test_zepps_rows_through_the_kernel_give_the_planned_ids(case):
    rng, pl = _case(*case)
    E = pl.num_experts
    ids = rng.integers(0, E, (pl.ranks, 200, 4)).astype(np.int32)
    for width in (1024, 64):
        table = build_hash_table(pl, batch_demand(ids, E) + rng.random((pl.ranks, E)), 0.25, pl.gpus_per_node, width)
        ours = route_vllm_table(ids, table).slot
        with vllm() as v:
            for r in range(pl.ranks):
                l2p, count = hash_rows(table, r)
                assert np.array_equal(vllm_physical_ids(v, ids[r], l2p, count), ours[r]), f"rank {r}, width {width}"
