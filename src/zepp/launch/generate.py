"""Start the ranks of ``zepp generate`` on this machine (one ``python -m zepp.serve.rank`` per
rank, gloo on loopback) with zepp's launcher machinery (``zepp.launch.processes``: one
wait-and-kill loop, nothing left running on any exit path): a rank that fails ends the run, the
others get ``timeout + 15`` s to notice, then anything left is killed, and
``zepp.errors.RankFailure`` names the rank that failed first and why."""

from __future__ import annotations

import json
import os
import sys

MODULE = "zepp.serve.rank"


def rank_envs(cfg: dict, tmp: str, threads: int) -> list[dict]:
    """The environment of each local rank (rendezvous through a FileStore in ``tmp``)."""
    world = cfg["nodes"] * cfg["gpus_per_node"]
    base = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(cfg["gpus_per_node"]), MASTER_ADDR="127.0.0.1",
                ZEPP_STORE_FILE=os.path.join(tmp, "store"), ZEPP_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo", TOKENIZERS_PARALLELISM="false")
    return [dict(base, RANK=str(r), LOCAL_RANK=str(r % cfg["gpus_per_node"])) for r in range(world)]


def spawn_generate(cfg: dict, threads: int = 1, grace: float | None = None, timeout: float | None = None) -> dict:
    """Run ``cfg`` (a ``zepp.serve.rank`` config) on ``nodes * gpus_per_node`` local processes;
    returns rank 0's report. Raises ``RankFailure``; no process outlives this call."""
    from zepp.launch.processes import RankGroup, launcher_signals, temp_folder

    world = cfg["nodes"] * cfg["gpus_per_node"]
    grace = float(cfg["timeout"]) + 15 if grace is None else grace
    with launcher_signals(), temp_folder("zepp-generate-") as tmp:
        cfg = dict(cfg, out=os.path.join(tmp, "report.json"))
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        cmd = [sys.executable, "-m", MODULE, path]
        with RankGroup([cmd] * world, rank_envs(cfg, tmp, threads), os.path.join(tmp, "logs")) as group:
            res = group.wait(timeout=timeout, grace=grace)
        if not res.ok:
            raise res.failure()
        with open(cfg["out"]) as f:
            return json.load(f)
