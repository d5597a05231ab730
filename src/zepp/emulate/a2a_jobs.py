"""Small gloo jobs for checking an emulated cluster (run in every rank by ``EmulatedCluster.call``).

``a2a_check``: one ``all_to_all_single`` with uneven splits (``same_node_bytes`` to each peer of
the own node, ``remote_bytes`` to each peer on other nodes), every element checked.
``a2a_loop``: ``all_to_all_single`` in a loop for ``seconds`` (the victim of the fault tests);
prints ``started`` after the first round so a test knows when to strike. A collective that
fails ends the process with exit code 3 and one line ``zepp-emulate: rank R: <error>`` on stderr.
"""

from __future__ import annotations

import os
import sys
import time


def _init(timeout_s: float):
    import torch.distributed as dist

    from zepp.runtime.rank_process import init_group

    init_group("gloo", timeout_s)
    return dist, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])


def _splits(rank: int, world: int, L: int, same_node: int, remote: int) -> list[int]:
    return [0 if p == rank else (same_node if p // L == rank // L else remote) for p in range(world)]


def a2a_check(same_node_bytes: int = 1 << 20, remote_bytes: int = 1 << 16, timeout_s: float = 30.0) -> dict:
    """Returns {"ok": True, "sent_bytes": [bytes per peer]}; raises on a wrong value (float64 elements)."""
    import torch

    dist, rank, world, L = _init(timeout_s)
    send_counts = _splits(rank, world, L, same_node_bytes // 8, remote_bytes // 8)
    recv_counts = [_splits(p, world, L, same_node_bytes // 8, remote_bytes // 8)[rank] for p in range(world)]
    # element e of the block rank sends to peer p holds rank * 1e6 + p * 1e3 + (e % 997): checks
    # source, destination and position of every element
    blocks = [rank * 1e6 + p * 1e3 + torch.arange(n, dtype=torch.float64).remainder(997) for p, n in
              enumerate(send_counts)]
    x = torch.cat(blocks)
    y = torch.empty(sum(recv_counts), dtype=torch.float64)
    dist.all_to_all_single(y, x, recv_counts, send_counts)
    expect = torch.cat([p * 1e6 + rank * 1e3 + torch.arange(n, dtype=torch.float64).remainder(997)
                        for p, n in enumerate(recv_counts)])
    if not torch.equal(y, expect):
        bad = int((y != expect).nonzero()[0])
        raise AssertionError(f"rank {rank}: element {bad} is {float(y[bad])}, expected {float(expect[bad])}")
    dist.barrier()
    dist.destroy_process_group()
    return {"ok": True, "sent_bytes": [8 * n for n in send_counts]}


def a2a_loop(seconds: float = 30.0, nbytes: int = 1 << 16, timeout_s: float = 5.0) -> dict:
    import torch

    dist, rank, world, _ = _init(timeout_s)
    x = torch.full((world * (nbytes // 4),), float(rank))
    y = torch.empty_like(x)
    rounds = 0
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            dist.all_to_all_single(y, x)
            rounds += 1
            if rounds == 1:
                print("started", flush=True)
    except Exception as exc:  # noqa: BLE001 - the point is to report it in one line
        msg = " ".join(str(exc).split())[:400]
        print(f"zepp-emulate: rank {rank}: collective failed after {rounds} rounds: {type(exc).__name__}: {msg}",
              file=sys.stderr, flush=True)
        os._exit(3)  # skip ProcessGroupGloo teardown, which can block on dead peers
    dist.destroy_process_group()
    return {"rounds": rounds}


def a2a_time(bytes_per_peer: int = 1 << 18, iters: int = 10, warmup: int = 3, timeout_s: float = 60.0) -> dict:
    """Median over iterations of the slowest rank's time for one ``all_to_all_single`` with
    ``bytes_per_peer`` to every other rank (float32). Rank 0 returns {"median_s", "times_s"}."""
    import torch

    dist, rank, world, _ = _init(timeout_s)
    x = torch.zeros(world * (bytes_per_peer // 4))
    y = torch.empty_like(x)
    times = []
    for it in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(y, x)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if it >= warmup:
            times.append(float(dt))
    dist.destroy_process_group()
    times_sorted = sorted(times)
    return {"median_s": times_sorted[len(times) // 2], "times_s": times} if rank == 0 else {}
