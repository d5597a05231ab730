"""Rank processes: start them, wait for them, end them, and leave nothing behind.

Used by every launcher in zepp: ``zepp run`` and ``zepp generate`` (``zepp.launch.ranks``: local
ranks, or ranks in the emulated cluster through ``zepp.emulate.launcher``) and
``EmulatedCluster.spawn/run/call`` (ranks inside network namespaces). There is one wait-and-kill
loop, ``RankGroup.wait``, and one way a failure is reported, ``RunResult.failure`` ->
``zepp.errors.RankFailure``.

What is guaranteed, by exit path of the launcher (the process that calls ``RankGroup``):

- normal return, an exception, Ctrl-C (``KeyboardInterrupt``), SIGTERM (turned into
  ``Terminated(143)``, a ``SystemExit``, by ``zepp.launch.signals.launcher_signals``): ``with RankGroup(...)`` kills every rank that
  is still running, and ``temp_folder`` removes its folder, before the launcher exits;
- ``kill -9`` of the launcher, or a crash of the interpreter: every rank gets SIGKILL from the
  kernel at once (``PR_SET_PDEATHSIG``, set in the child before it executes the command; a rank
  whose launcher died before that point exits by itself), and the launcher's watchdog
  (``zepp.launch.watchdog``, a separate process reading a pipe from the launcher) sees the
  pipe close and kills what is still listed (process groups of ranks), deletes the emulated
  namespaces it was told about (only if they still carry the cluster's mark) and removes the
  temp folders and record files. Not covered: ``kill -9`` of the launcher *and* its watchdog
  together (then the next ``zepp cluster down --prefix P`` removes the namespaces and their
  processes; stale temp folders stay in ``$TMPDIR``).

The parent-death signal is tied to the thread that started the rank: start ranks from a thread
that lives as long as they do (the main thread, in every zepp launcher).

Reporting: a rank that exits non-zero is reported with its exit code and what the code means
for zepp's workers (3: saw a communication failure, 4: rejected its input, 5: internal error,
17: fault injection); a rank killed by a signal that the launcher did not send is reported as
"killed by signal N (NAME)"; a rank the launcher had to kill because it did not end in time
is reported as a hang, with the limit it ran past.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from zepp.errors import RankFailure
from zepp.launch.children import dies_with_parent
from zepp.launch.watchdog import proc_start  # stdlib only: the watchdog script's own

# what the exit codes of zepp's rank programs (zepp.runtime.rank_process, zepp.emulate.a2a_jobs) mean
EXIT_MEANING = {3: "saw a communication failure", 4: "rejected its input", 5: "hit an internal error",
                17: "died (fault injection)"}
# codes of ranks that only noticed another rank failing (not culprits themselves)
PEER_FAILURE_CODES = (3,)

_WATCHDOG_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog.py")


# ---------------------------------------------------------------------------------------------
# the watchdog: cleans up after a launcher that was killed


class _Watchdog:
    """Client of ``zepp.launch.watchdog``: one watchdog process per launcher process, started
    on first use; ``add``/``remove`` keep its list equal to what this process would leave behind."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._pid = -1
        self._items: dict[tuple[str, str], dict] = {}
        self._lock = threading.Lock()

    def _send(self, msg: dict) -> None:
        if self._proc is None or self._pid != os.getpid() or self._proc.poll() is not None:
            self._start()
        try:
            self._proc.stdin.write(json.dumps(msg) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):  # the watchdog died: start another with the full list
            self._start()

    def _start(self) -> None:
        if self._pid != os.getpid():  # a forked child: its parent's watchdog is not its own
            self._items = {}
        self._proc = subprocess.Popen([sys.executable, "-I", "-S", _WATCHDOG_SCRIPT], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                      start_new_session=True)
        self._pid = os.getpid()
        for rec in self._items.values():
            self._proc.stdin.write(json.dumps(rec) + "\n")
        self._proc.stdin.flush()

    def add(self, kind: str, key: str, **fields) -> None:
        rec = {"op": "add", "kind": kind, "key": key, **fields}
        with self._lock:
            self._items[(kind, key)] = rec
            self._send(rec)

    def remove(self, kind: str, key: str) -> None:
        with self._lock:
            if self._items.pop((kind, key), None) is not None and self._pid == os.getpid():
                self._send({"op": "remove", "kind": kind, "key": key})

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


WATCHDOG = _Watchdog()


@contextlib.contextmanager
def temp_folder(prefix: str):
    """A temp folder (``$TMPDIR/{prefix}*``) removed on every exit path of this process,
    ``kill -9`` included (by the watchdog)."""
    path = tempfile.mkdtemp(prefix=prefix)
    WATCHDOG.add("dir", path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        WATCHDOG.remove("dir", path)


# ---------------------------------------------------------------------------------------------
# outcomes


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass
class RankResult:
    """Outcome of one rank process. ``returncode`` < 0: killed by that signal. ``hung``: the
    launcher killed it because it did not end in time (``hung_why`` says which limit)."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    hung: bool = False
    hung_why: str = ""

    @property
    def killed(self) -> bool:  # killed by the launcher (kept for callers of the old name)
        return self.hung

    def why(self) -> str:
        """What happened to this rank, in words."""
        c = self.returncode
        if self.hung:
            return f"hung ({self.hung_why}) and was killed by the launcher"
        if c is None:
            return "was still running"
        if c < 0:
            return f"was killed by signal {-c} ({signal_name(-c)}), not by the launcher"
        if c == 0:
            return "exited normally"
        return EXIT_MEANING.get(c, f"exited with code {c}")


@dataclass
class RunResult:
    """Outcome of every rank of one ``RankGroup``; ``ok`` when every rank exited 0.

    ``first``: the first rank seen failing (None when all exited 0). ``timed_out``: the overall
    time limit ended the run while no rank had failed."""

    ranks: list[RankResult]
    elapsed: float
    timed_out: bool = False
    first: int | None = None

    @property
    def ok(self) -> bool:
        return all(r.returncode == 0 and not r.hung for r in self.ranks)

    @property
    def returncodes(self) -> list[int | None]:
        return [r.returncode for r in self.ranks]

    def culprits(self) -> list[int]:
        """Ranks that failed on their own account (a code other than 0 and "a peer failed")."""
        bad = [r.rank for r in self.ranks if r.hung or r.returncode not in (0, *PEER_FAILURE_CODES)]
        return bad or ([self.first] if self.first is not None else [])

    def describe(self, tail: int = 1500) -> str:
        """Every failed rank with its reason and stderr tail (for logs and test messages)."""
        lines = [f"ranks exited with {self.returncodes} after {self.elapsed:.1f}s"
                 + (" (time limit reached, killed)" if self.timed_out else "")]
        for r in self.ranks:
            if r.returncode != 0:
                lines.append(f"--- rank {r.rank} {r.why()}; stderr tail:")
                lines.append(r.stderr[-tail:].rstrip())
        return "\n".join(lines)

    def failure(self, context: str = "") -> RankFailure:
        """The ``RankFailure`` for this outcome: the culprits and why, the first to fail, the
        exit codes by rank, and the last three stderr lines of every rank that wrote any."""
        culprits = self.culprits()
        head = "; ".join(f"rank {r} {self.ranks[r].why()}" for r in culprits)
        first = f"first to fail: rank {self.first}" if self.first is not None else "no rank failed by itself"
        lines = [(context + "\n" if context else "") + f"{head} ({first}; exit codes by rank: {self.returncodes})"]
        for r in self.ranks:
            t = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-3:]
            if t:
                lines.append(f"  rank {r.rank}: " + " | ".join(t))
        return RankFailure("\n".join(lines), first=self.first, codes=self.returncodes,
                           errs=[r.stderr for r in self.ranks], culprits=culprits,
                           hung=[r.rank for r in self.ranks if r.hung])

    def check(self, context: str = "") -> "RunResult":
        if not self.ok:
            raise self.failure(context)
        return self


# ---------------------------------------------------------------------------------------------
# the rank processes


class RankGroup:
    """One process per rank, each in its own session (so it can be killed with its children),
    each dying with the launcher. Output goes to ``logdir/rank{r}.out|err`` (a temp folder when
    ``logdir`` is None, removed after ``wait``).

    ``commands[r]``/``envs[r]``: the command and the complete environment of rank ``r``.
    ``owns_logdir``: remove ``logdir`` after ``wait`` (default: only the folder it made).
    Use as a context manager: leaving the block kills what is still running."""

    def __init__(self, commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]],
                 logdir: str | None = None, owns_logdir: bool | None = None):
        self._owns_logdir = logdir is None if owns_logdir is None else owns_logdir
        if logdir is None:
            logdir = tempfile.mkdtemp(prefix="zepp-emulate-")
            WATCHDOG.add("dir", logdir)
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []
        self._hung: dict[int, str] = {}
        self._first: int | None = None
        self._result: RunResult | None = None
        self._t0 = time.monotonic()
        try:
            for r, (cmd, env) in enumerate(zip(commands, envs)):
                with open(os.path.join(logdir, f"rank{r}.out"), "w") as out, \
                        open(os.path.join(logdir, f"rank{r}.err"), "w") as err:
                    p = subprocess.Popen(list(cmd), env=dict(env), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=dies_with_parent())
                self.procs.append(p)
                WATCHDOG.add("proc", str(p.pid), pid=p.pid, start=proc_start(p.pid))
        except BaseException:
            self.kill_all()
            self._reap()
            self._finish(timed_out=False)
            raise

    def __enter__(self) -> "RankGroup":
        return self

    def __exit__(self, *exc) -> None:
        if self._result is None:
            self.kill_all()
            self._reap()
            self._finish(timed_out=False)

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to rank ``rank``'s process group (a fault: a rank dies from outside)."""
        p = self.procs[rank]
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_all(self) -> None:
        for r in range(len(self.procs)):
            self.kill(r)

    def poll(self) -> list[int | None]:
        codes = [p.poll() for p in self.procs]
        if self._first is None:
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                self._first = bad[0]
        return codes

    def wait(self, timeout: float | None = None, grace: float = 5.0,
             on_poll: Callable[[list], None] | None = None, poll_s: float = 0.02) -> RunResult:
        """Wait for every rank (the one wait-and-kill loop of zepp).

        Once a rank has failed, the others get ``grace`` seconds to end by themselves (a peer's
        collective fails at once on a dead rank, after its own timeout on a hung one); at
        ``timeout`` seconds after the start (None: no limit) or at the end of the grace, the
        launcher kills what is left and reports those ranks as hung. ``on_poll(codes)`` runs
        every ``poll_s`` seconds (fault injection)."""
        if self._result is not None:
            return self._result
        deadline = self._t0 + timeout if timeout is not None else float("inf")
        why_now = f"still running at the run's time limit of {timeout:g} s" if timeout is not None else ""
        grace_set, timed_out = False, False
        while True:
            codes = self.poll()
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if self._first is not None and not grace_set:
                grace_set = True
                if now + grace < deadline:
                    deadline = now + grace
                    why_now = f"still running {grace:g} s after rank {self._first} failed"
            if now >= deadline:
                timed_out = self._first is None
                for r, c in enumerate(codes):
                    if c is None:
                        self._hung[r] = why_now
                        self.kill(r)
                break
            if on_poll is not None:
                on_poll(codes)
            time.sleep(poll_s)
        self._reap()
        return self._finish(timed_out)

    def _reap(self) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def _finish(self, timed_out: bool) -> RunResult:
        ranks = []
        for r, p in enumerate(self.procs):
            WATCHDOG.remove("proc", str(p.pid))
            ranks.append(RankResult(r, p.poll(), _read(os.path.join(self.logdir, f"rank{r}.out")),
                                    _read(os.path.join(self.logdir, f"rank{r}.err")),
                                    hung=r in self._hung, hung_why=self._hung.get(r, "")))
        self.poll()
        self._result = RunResult(ranks, time.monotonic() - self._t0, timed_out, self._first)
        if self._owns_logdir:
            shutil.rmtree(self.logdir, ignore_errors=True)
            WATCHDOG.remove("dir", self.logdir)
        return self._result


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
