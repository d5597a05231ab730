"""The metadata exchange (``zepp.runtime.metadata.all_gather_rows``) through the node and rail
groups equals the one all-to-all over every rank: the same rows, the same bytes per link class."""

from __future__ import annotations

import numpy as np
import torch


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from zepp.model import MoESpec
    from zepp.planner.types import Placement
    from zepp.runtime.dispatcher import Dispatcher
    from zepp.runtime.metadata import all_gather_rows, gather_metadata
    from zepp.runtime.rank_process import leave_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        E, L = 8, 2
        se = np.arange(E, dtype=np.int32).reshape(world, E // world)
        d = Dispatcher(MoESpec("tiny", E, 3, 8, 4, 4), Placement(se, E, L))
        assert d.node_groups and d.rail_groups  # the two-step path runs
        t = torch.arange(6, dtype=torch.int32).reshape(2, 3) + 100 * rank
        got = all_gather_rows(d, t)
        split = {"nvlink": 0, "nic": 0}
        split.update(d.counter.split("metadata", rank, L))
        d.counter.reset()
        node_groups, rail_groups = d.node_groups, d.rail_groups
        d.node_groups, d.rail_groups = [], []  # the one all-to-all over every rank
        want = all_gather_rows(d, t)
        assert torch.equal(got, want)
        assert torch.equal(want, torch.stack([torch.arange(6, dtype=torch.int32).reshape(2, 3) + 100 * q
                                              for q in range(world)]))
        assert d.counter.split("metadata", rank, L) == split  # same NIC and NVLink bytes
        d.node_groups, d.rail_groups = node_groups, rail_groups
        # a ragged batch through the Dispatcher's own exchange: counts first, then ids and weights
        T = 2 + rank
        ids = torch.arange(T * 3).reshape(T, 3) % E
        w = torch.rand(T, 3)
        b = gather_metadata(d, ids, w)
        np.testing.assert_array_equal(b.counts, 2 + np.arange(world))
        assert b.ids.shape == (world, 2 + world - 1, 3)
        np.testing.assert_array_equal(b.ids[rank, :T], ids.numpy())
        assert (b.ids[rank, T:] == -1).all()
        assert torch.equal(b.weights[rank, :T], w)
        del d
        open(f"{out}/ok{rank}", "w").close()
    finally:
        leave_group()


def test_node_then_rail_exchange_equals_one_all_to_all(tmp_path):
    """Four gloo ranks on two nodes: every rank's rows in rank order, and the bytes each rank
    counts per link class (NIC, NVLink) the same as the one all-to-all's."""
    import torch.multiprocessing as mp

    world = 4
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(_worker, args=(world, init, str(tmp_path)), nprocs=world, join=True, start_method="spawn")
    assert sorted(p.name for p in tmp_path.glob("ok*")) == [f"ok{r}" for r in range(world)]
