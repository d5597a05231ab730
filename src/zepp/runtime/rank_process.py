"""The life of one rank process, the same for ``zepp run``'s ranks (``zepp.runtime.worker``) and
``zepp generate``'s (``zepp.serve.rank``): read the JSON config, join the process group the
environment names, run, write rank 0's report to ``cfg["out"]``, leave.

Exit codes: 0 fine; 3 a collective failed or timed out (a peer died or hung); 4 bad input;
5 internal error (a bug: traceback printed).

Rendezvous: with ``ZEPP_STORE_FILE`` set (every zepp launcher sets it), the ranks meet through
a ``torch.distributed.FileStore`` at that path and nothing listens for the rendezvous; each rank
first waits there (up to ``RENDEZVOUS_S``) until every rank has arrived, so ranks that start
slowly on a loaded machine do not eat into the collective ``timeout``. Otherwise the usual
``env://`` (``MASTER_ADDR``/``MASTER_PORT``, e.g. under torchrun). Results travel between ranks
as JSON bytes in tensors (``gather_json``), never as pickles.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import sys
import traceback
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError

RENDEZVOUS_S = 900.0  # how long a rank waits for the others to start (python + torch imports)
_TIMEOUT: list[datetime.timedelta] = []  # the collective timeout the process group was formed with


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON-serialisable: {type(v).__name__}")


def gather_json(obj, device=None) -> list:
    """Every rank's ``obj`` (JSON-serialisable), in rank order, on every rank: the JSON text is
    exchanged as uint8 tensors (sizes first, then padded bytes), so nothing is unpickled."""
    device = torch.device("cpu") if device is None else torch.device(device)
    data = json.dumps(obj, default=_jsonable, separators=(",", ":")).encode()
    world = dist.get_world_size()
    n = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(x.item()) for x in sizes]
    buf = torch.zeros(max(sizes), dtype=torch.uint8)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(outs, buf.to(device))
    return [json.loads(bytes(o[:k].cpu().numpy())) for o, k in zip(outs, sizes)]


def init_group(backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Join the process group the environment names: through the file store at
    ``ZEPP_STORE_FILE`` when set (every rank arrives first, then the group forms), else
    ``env://``. ``timeout_s``: how long a collective may wait."""
    timeout = datetime.timedelta(seconds=float(timeout_s))
    _TIMEOUT[:] = [timeout]
    path = os.environ.get("ZEPP_STORE_FILE")
    if not path:
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(path, world)
    store.set_timeout(datetime.timedelta(seconds=max(RENDEZVOUS_S, float(timeout_s))))
    store.set(f"zepp/arrived/{rank}", "1")
    store.wait([f"zepp/arrived/{r}" for r in range(world)])
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def subgroup(ranks: list[int], backend: str | None = None):
    """``dist.new_group`` with the collective timeout the process group was formed with
    (``init_group``): ``new_group``'s own default is torch's (30 minutes for gloo), so a
    collective on a node, rail or swap group would wait that long for a hung peer."""
    return dist.new_group(ranks=ranks, backend=backend, timeout=_TIMEOUT[0] if _TIMEOUT else None)


def leave_group() -> None:
    """Leave the process group in order: a barrier (every rank has finished every collective, on
    every group), then this process lets go of the node and rail groups its Dispatchers cached
    (``zepp.runtime.collectives.release_groups``; ``gc`` frees groups that objects in reference
    cycles still hold, such as a finished ``SwapChannel``'s),
    then ``destroy_process_group``, which shuts every group down while nothing else holds one.
    Otherwise a subgroup lived on to interpreter exit and gloo's threads were torn down in a
    destructor there: a rare ``terminate called without an active exception`` (SIGABRT) on a
    loaded machine, after the rank's work was done."""
    from zepp.runtime.collectives import release_groups

    dist.barrier()
    release_groups()
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def init_distributed(cfg: dict) -> None:
    """Pick the GPU (``cfg["device"]``: ``cuda`` = ``LOCAL_RANK``'s, ``cuda:N``; rewritten to the
    chosen one) and join the process group with ``cfg["backend"]`` and ``cfg["timeout"]``."""
    backend = cfg.get("backend") or "gloo"
    dev = cfg.get("device", "cpu")
    if dev.startswith("cuda"):
        # "cuda": one GPU per rank (LOCAL_RANK); "cuda:N": that GPU (several gloo ranks may share one)
        idx = int(dev.split(":")[1]) if ":" in dev else int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(idx)
        cfg["device"] = f"cuda:{idx}"
    init_group(backend, float(cfg["timeout"]))


def read_config(argv: list[str], defaults: dict, module: str) -> dict | None:
    """``defaults`` updated from the one argument, a JSON config file; ``None`` (usage printed)
    for any other command line."""
    if len(argv) != 1:
        print(f"usage: python -m {module} CONFIG.json  (env RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
              file=sys.stderr)
        return None
    cfg = dict(defaults)
    with open(argv[0]) as f:
        cfg.update(json.load(f))
    return cfg


def run_rank_process(cfg: dict, body: Callable[[], dict | None], label: str, indent: int | None = None) -> int:
    """Join the process group, run ``body()`` (rank 0 returns the report, written to
    ``cfg["out"]``), leave the group; returns 0 or ends the process with the exit code of what
    went wrong (module docstring). ``label`` starts every message."""
    torch.set_num_threads(int(os.environ.get("ZEPP_THREADS", "1")))
    rank = int(os.environ.get("RANK", "0"))
    try:
        init_distributed(cfg)
        report = body()
        if report is not None and cfg.get("out"):
            tmp = cfg["out"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(report, f, indent=indent)
            os.replace(tmp, cfg["out"])
        leave_group()
        return 0
    except ZeppInputError as exc:
        print(f"{label} rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        os._exit(4)
    except Exception as exc:
        _end_on_error(exc, rank, label, cfg.get("timeout"))


def _end_on_error(exc: Exception, rank: int, label: str, timeout) -> None:
    """End this rank for ``exc``: 3 for a failed collective (a peer died, hung or timed out), else 5."""
    msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if not is_comm_error(exc):
        print(f"{label} rank {rank}: internal error ({type(exc).__name__}: {msg})", file=sys.stderr, flush=True)
        traceback.print_exc()
        os._exit(5)
    # a peer died or hung: gloo/NCCL raise; end this rank now, clearly
    print(f"{label} rank {rank}: communication failed ({type(exc).__name__}: {msg}); a peer rank died, "
          f"hung or timed out (timeout {timeout} s). Ending this rank.", file=sys.stderr, flush=True)
    if os.environ.get("ZEPP_DEBUG"):
        traceback.print_exc()
    os._exit(3)


def is_comm_error(exc: Exception) -> bool:
    """Whether ``exc`` is a failed or timed-out collective (rather than a bug)."""
    if isinstance(exc, (dist.DistError, ConnectionError, TimeoutError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        w in text for w in ("gloo", "nccl", "timed out", "timeout", "connection", "closed", "peer", "socket"))
