"""zepp's model of SGLang's replica choice against SGLang 0.5.23's own functions, on random
placements (rank-major physical slots, any copies per node): the candidate lists
(``_compute_logical_to_all_physical_map`` through ``init_by_mapping``), the static dispatch map
(``compute_logical_to_rank_dispatch_physical_map``, ``random.Random(42)``), and the physical ids
``topk_ids_logical_to_physical`` gives for static and dynamic dispatch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_code import Context, metadata_of, sglang
from zepp.planner.routing.sglang_routing import candidate_lists, dynamic_pick, static_dispatch_map
from zepp.planner.types import Placement

CASES = [  # (nodes, gpus per node, slots per gpu, experts, layers, seed)
    (2, 2, 3, 8, 3, 0), (2, 4, 2, 6, 2, 1), (4, 2, 3, 16, 2, 2), (1, 4, 3, 8, 2, 3), (3, 2, 4, 10, 2, 4),
    (2, 8, 5, 64, 2, 5),
]


def random_map(rng, nodes, gpn, slots, experts, layers) -> np.ndarray:
    """``[layers, P]`` every expert at least once, the other slots random (copies may share a GPU)."""
    P = nodes * gpn * slots
    rows = []
    for _ in range(layers):
        row = np.concatenate([np.arange(experts), rng.integers(0, experts, P - experts)])
        rows.append(rng.permutation(row))
    return np.stack(rows)


@pytest.mark.parametrize("case", CASES)
def test_candidate_lists_and_static_map_are_sglangs(case):
    nodes, gpn, slots, E, layers, seed = case
    rng = np.random.default_rng(seed)
    p2l = random_map(rng, nodes, gpn, slots, E, layers)
    R = nodes * gpn
    ctx = Context(R, nodes, layers, E, p2l.shape[1] - E)
    ours = static_dispatch_map(p2l, E, R, gpn)  # [R, layers, E]
    with sglang(ctx) as (el, _, _):
        for q in range(R):
            md = metadata_of(el, ctx, p2l, q)
            theirs = md.logical_to_rank_dispatch_physical_map.numpy()
            assert np.array_equal(ours[q], theirs), f"static map of rank {q}"
            for layer in range(layers):
                lists, num_valid = candidate_lists(Placement(p2l[layer].reshape(R, slots), E, gpn))
                got = md.logical_to_all_physical_map[layer].numpy()
                assert np.array_equal(num_valid[q], md.logical_to_all_physical_map_num_valid[layer].numpy())
                width = lists.shape[2]
                assert np.array_equal(lists[q], got[:, :width]) and (got[:, width:] == -1).all()


@pytest.mark.parametrize("case", CASES[:4])
def test_static_and_dynamic_dispatch_give_sglangs_physical_ids(case):
    nodes, gpn, slots, E, layers, seed = case
    rng = np.random.default_rng(seed + 100)
    p2l = random_map(rng, nodes, gpn, slots, E, layers)
    R = nodes * gpn
    static = static_dispatch_map(p2l, E, R, gpn)
    for algorithm in ("static", "dynamic"):
        ctx = Context(R, nodes, layers, E, p2l.shape[1] - E, algorithm)
        with sglang(ctx) as (el, dispatch, _):
            for q in range(R):
                el.set_global_expert_location_metadata(metadata_of(el, ctx, p2l, q), allow_overwrite=True)
                layer = int(rng.integers(layers))
                info = dispatch.ExpertLocationDispatchInfo.init_new(layer)
                ids = torch.as_tensor(rng.integers(0, E, (33, 4)), dtype=torch.int32)
                torch.manual_seed(q)
                theirs = dispatch.topk_ids_logical_to_physical(ids, info).numpy()
                if algorithm == "static":
                    ours = static[q, layer][ids.numpy()]
                else:
                    torch.manual_seed(q)  # SGLang's draws, taken again from the same generator state
                    draws = torch.randint(0, 65536, (ids.numel(),), dtype=torch.int32).numpy().reshape(ids.shape)
                    lists, num_valid = candidate_lists(Placement(p2l[layer].reshape(R, slots), E, gpn))
                    ours = dynamic_pick(lists[q], num_valid[q], ids.numpy(), draws)
                assert np.array_equal(ours, theirs), f"{algorithm}, rank {q}"
