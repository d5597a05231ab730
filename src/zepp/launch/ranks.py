"""Starting a command's ranks and waiting for them: the one path of ``zepp run`` and ``zepp generate``.

A launcher names the module its ranks run and the JSON config they read; every rank runs
``python -m MODULE CONFIG.json [ARGS]`` (the module's ``main``), rank 0 writes the report to
``cfg["out"]``. Where the ranks run (anything with ``spawn(argv, env, logdir) -> RankGroup``):

- ``LocalRanks``: local processes; they meet through a file store in the run's temp folder and
  gloo/NCCL bind the loopback device, so nothing listens on the machine's other interfaces;
- ``zepp.emulate.topology.EmulatedCluster``: one network namespace per rank (``--emulate``; the
  emulated launchers of ``zepp.emulate.launcher`` build it and pass it here);
- under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set) nothing is spawned: this process is one
  rank (``run_this_rank``, which calls the module's ``run_in_process(cfg)``).

``RankRun`` owns one run's temp folder (config, rendezvous store, rank logs, report), removed on
every exit path, and waits with the one wait-and-kill loop (``RankGroup.wait``); ``launch`` is the
whole of a command's launch, turning a failure into one message and an exit code.
Nothing here imports an executor: the module is a name.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from typing import Callable, Mapping, Sequence

from zepp.errors import EmulationError, EmulationUnavailable, RankFailure, ZeppInputError
from zepp.launch.processes import RankGroup, temp_folder
from zepp.launch.signals import launcher_signals

# variables a spawned rank must not inherit from a launcher that torchrun started
DROPPED_ENV = ("MASTER_PORT", "TORCHELASTIC_RUN_ID")


def thread_env(threads: int) -> dict[str, str]:
    """The environment that gives each rank ``threads`` intra-op threads."""
    return {"ZEPP_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


class LocalRanks:
    """``nodes * gpus_per_node`` ranks as processes of this machine (consecutive ranks form a node)."""

    def __init__(self, nodes: int, gpus_per_node: int):
        self.nodes, self.gpus_per_node = nodes, gpus_per_node
        self.ranks = nodes * gpus_per_node

    def rank_env(self, rank: int, store_file: str) -> dict[str, str]:
        """The variables rank ``rank`` gets on top of the launcher's environment."""
        return {"RANK": str(rank), "WORLD_SIZE": str(self.ranks), "LOCAL_RANK": str(rank % self.gpus_per_node),
                "LOCAL_WORLD_SIZE": str(self.gpus_per_node), "MASTER_ADDR": "127.0.0.1",
                "ZEPP_STORE_FILE": store_file, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None = None, *, logdir: str) -> RankGroup:
        """Start every rank: ``argv`` each, the launcher's environment plus ``env`` plus
        ``rank_env``; the rendezvous store and the rank logs live in ``logdir``."""
        base = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        base.update(env or {})
        store = os.path.join(logdir, "store")
        envs = [dict(base, **self.rank_env(r, store)) for r in range(self.ranks)]
        return RankGroup([list(argv)] * self.ranks, envs, logdir)


class RankRun:
    """One run of ``python -m module CONFIG.json``: a temp folder (``{prefix}*``) holding the
    config (``cfg`` with ``out`` pointing into the folder), the ranks' store and logs and rank 0's
    report; a context manager, the folder goes on every exit path."""

    def __init__(self, module: str, cfg: dict, prefix: str = "zepp-run-"):
        self.module, self.cfg, self.prefix = module, cfg, prefix
        self._stack = contextlib.ExitStack()
        self.folder = self.config_path = self.report_path = ""

    def __enter__(self) -> "RankRun":
        self.folder = self._stack.enter_context(temp_folder(self.prefix))
        self.report_path = os.path.join(self.folder, "report.json")
        self.config_path = os.path.join(self.folder, "config.json")
        with open(self.config_path, "w") as f:
            json.dump(dict(self.cfg, out=self.report_path), f)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def wait(self, where, *, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
             timeout: float | None = None, grace: float | None = None, on_poll: Callable | None = None,
             poll_s: float = 0.02, context: Callable[[], str] | str = "") -> dict:
        """Start the ranks ``where`` (``LocalRanks`` or an up ``EmulatedCluster``), wait, return
        rank 0's report. Once a rank has failed the others get ``grace`` seconds (default
        ``cfg["timeout"] + 15``) to end; ``timeout``: an overall limit (None: none). A failure
        raises ``RankFailure`` (``context``, or its value when callable, heads the message)."""
        grace = float(self.cfg["timeout"]) + 15 if grace is None else grace
        argv = [sys.executable, "-m", self.module, self.config_path, *args]
        with where.spawn(argv, env=env, logdir=os.path.join(self.folder, "logs")) as group:
            res = group.wait(timeout=timeout, grace=grace, on_poll=on_poll, poll_s=poll_s)
        if not res.ok:
            raise res.failure(context() if callable(context) else context)
        with open(self.report_path) as f:
            return json.load(f)


def spawn_local(module: str, cfg: dict, threads: int = 1, grace: float | None = None,
                timeout: float | None = None, env: Mapping[str, str] | None = None,
                prefix: str = "zepp-run-") -> dict:
    """Run ``cfg`` on ``cfg["nodes"] * cfg["gpus_per_node"]`` local processes of ``module`` and
    return rank 0's report. Raises ``RankFailure``; no process outlives this call."""
    with launcher_signals(), RankRun(module, cfg, prefix) as run:
        return run.wait(LocalRanks(cfg["nodes"], cfg["gpus_per_node"]), env={**thread_env(threads), **(env or {})},
                        timeout=timeout, grace=grace)


def under_torchrun() -> bool:
    """Whether torchrun (or another launcher) made this process one rank of a process group."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_this_rank(module: str, cfg: dict, prefix: str = "zepp-run-") -> dict:
    """Under torchrun: run ``module.run_in_process(cfg)`` as this rank. Rank 0 returns the report;
    the other ranks, and a rank that failed, end the process with the rank's exit code."""
    entry = importlib.import_module(module)
    with temp_folder(prefix) as tmp:
        cfg = dict(cfg, out=os.path.join(tmp, "report.json"))
        code = entry.run_in_process(cfg)
        if int(os.environ["RANK"]) != 0 or code:
            raise SystemExit(code)
        with open(cfg["out"]) as f:
            return json.load(f)


BAD_INPUT_CODE = 4  # a rank's exit code for bad input (``zepp.runtime.rank_process``)


def bad_input_found_by_ranks(exc: RankFailure) -> str | None:
    """The bad-input line of the first rank to fail, when every rank that failed on its own
    account exited with ``BAD_INPUT_CODE`` (a rank prints ``LABEL rank R: error: WHAT``)."""
    if not exc.culprits or any(exc.codes[r] != BAD_INPUT_CODE for r in exc.culprits):
        return None
    r = exc.first if exc.first in exc.culprits else exc.culprits[0]
    lines = [ln for ln in (exc.errs[r] if r < len(exc.errs) else "").splitlines() if ": error: " in ln]
    if not lines:
        return None
    return f"{lines[-1].split(': error: ', 1)[1].strip()} (found by rank {r})"


def launch(module: str, cfg: dict, *, label: str, threads: int = 1, env: Mapping[str, str] | None = None,
           emulated: Callable[[], dict] | None = None, prefix: str = "zepp-run-") -> dict:
    """Run a command's ranks the way this process was started and return rank 0's report:
    ``emulated`` (with ``--emulate``: a call of ``zepp.emulate.launcher`` that brings the cluster
    up, runs the ranks in it and tears it down), else under torchrun as this rank, else local
    processes. A rank that fails: ``{label}: <which rank, why>`` on stderr and exit code 3; an
    emulated cluster that cannot be built: exit code 2; ranks that refused bad input only they
    could see (exit code 4): ``ZeppInputError`` with the first one's line."""
    try:
        with launcher_signals():
            if emulated is not None:
                return emulated()
            if under_torchrun():
                return run_this_rank(module, cfg, prefix)
            return spawn_local(module, cfg, threads=threads, env=env, prefix=prefix)
    except RankFailure as exc:
        found = bad_input_found_by_ranks(exc)
        if found:  # bad input only a rank could see (NaN weights): one line, exit code 2
            raise ZeppInputError(found) from None
        torn = "\n(the emulated cluster was torn down)" if emulated is not None else ""
        print(f"{label}: {exc}{torn}", file=sys.stderr, flush=True)
        raise SystemExit(3) from None
    except (EmulationUnavailable, EmulationError) as exc:
        print(f"{label}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
