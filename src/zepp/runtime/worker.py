"""One rank of ``zepp run``: ``python -m zepp.runtime.worker CONFIG.json``.

Driven by the usual torch.distributed environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` (and, for gloo over a chosen interface, ``GLOO_SOCKET_IFNAME``, which gloo reads
itself). ``LOCAL_RANK`` picks the CUDA device when the config asks for ``cuda``. The emulated
cluster starts the same ranks through ``zepp.emulate.worker_rank`` (this module's
``run_in_process`` with hooks that read the NIC counters).

The JSON config (all keys written by ``zepp.cli.run``; see ``default_config``):
``nodes``, ``gpus_per_node``, ``model`` + ``experts``/``topk``/``hidden``/``ffn`` overrides,
``tokens`` per rank (or ``budget_mb``), ``systems`` (names from ``zepp.runtime.systems``),
``history``/``trace`` (paths, or null for the built-in traces), ``iters``, ``warmup``, ``seed``,
``relaxation``, ``extra`` slots, ``check``, ``dtype`` (``float32``/``bfloat16``), ``device``
(``cpu``, ``cuda`` = GPU ``LOCAL_RANK``, ``cuda:N``), ``backend`` (``gloo``/``nccl``),
``timeout`` seconds, ``out`` (result JSON written by rank 0), ``interleave`` (run the systems
iteration by iteration, so they share the machine's load alike; default: when every system's
weights fit in 2 GiB per rank), ``fault`` (tests: ``{"rank", "system", "iter", "mode":
"die"|"hang"}``), ``cases`` (tests: a list of overrides; each case runs in turn in the same
process group and the report holds ``cases``), ``cost_cluster`` (the cost figures of an overlap
chosen per batch), ``swap_copies`` / ``swap_measure`` (a swapping system's copies:
``zepp.runtime.swap_steps``),
``schedule`` (a drift schedule of ``zepp.traces.schedules``; null: batches sampled from the trace).

Example, one rank of four (run the same with RANK=0..3)::

    RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=veth0 \\
        python -m zepp.runtime.worker config.json

Exit codes, rendezvous and the JSON exchange of results: ``zepp.runtime.rank_process``. What a
case runs and measures: ``zepp.runtime.case``; its inputs: ``zepp.runtime.inputs``; the report:
``zepp.runtime.report``. ``run_in_process(cfg, hooks)`` takes a ``zepp.runtime.case.RunHooks``
whose methods are called at fixed points (layer created, right before each layer call, right
before the closing exchange of results); the default hooks do nothing.
"""

from __future__ import annotations

import sys

from zepp.runtime.case import RunHooks, run_case
from zepp.runtime.rank_process import read_config, run_rank_process

MODULE = "zepp.runtime.worker"


def default_config() -> dict:
    return dict(nodes=2, gpus_per_node=2, model="k2", experts=None, topk=None, hidden=None, ffn=None, tokens=None,
                budget_mb=1.0, systems=["a2av", "zepp"], history=None, trace=None, iters=3, warmup=1, seed=0,
                relaxation=0.25, extra=2, check=True, dtype="float32", device="cpu", backend="gloo", timeout=60.0,
                out=None, fault=None, interleave=None, cost_cluster=None, swap_copies="hidden", swap_measure=False,
                schedule=None)


def run_worker(cfg: dict, hooks: RunHooks | None = None) -> dict | None:
    """Run ``cfg`` (or each of ``cfg["cases"]``) on this rank; rank 0 returns the report."""
    if not cfg.get("cases"):
        return run_case(cfg, hooks)
    reports = [run_case({**cfg, **case, "cases": None}, hooks) for case in cfg["cases"]]
    return {"cases": reports} if reports[0] is not None else None


def run_in_process(cfg: dict, hooks: RunHooks | None = None) -> int:
    """Join the process group named by the environment, run (with ``hooks``), write
    ``cfg["out"]`` on rank 0; returns 0 or ends the process with its exit code."""
    return run_rank_process(cfg, lambda: run_worker(cfg, hooks), "zepp worker", indent=1)


def main(argv: list[str] | None = None, hooks: RunHooks | None = None) -> int:
    cfg = read_config(sys.argv[1:] if argv is None else argv, default_config(), MODULE)
    return 2 if cfg is None else run_in_process(cfg, hooks)


if __name__ == "__main__":
    sys.exit(main())
