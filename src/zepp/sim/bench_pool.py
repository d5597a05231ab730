"""The worker processes of ``zepp bench``: units of work (``zepp.sim.bench_units``) over a few
processes, each result handed back as it finishes.

Each worker is ``python -m zepp.sim.bench_pool`` started with ``subprocess`` in a session of its
own (a Ctrl-C at the terminal reaches only ``zepp bench``, which ends the workers itself) and
dying with its parent whatever kills the parent (``zepp.launch.children.dies_with_parent``:
SIGKILL and the out-of-memory killer included), so no worker outlives ``zepp bench`` holding the
caller's pipes. Units and results travel as pickles over the worker's stdin and stdout (a private
pipe between two processes of the same run; the worker's own prints go to stderr). A worker that
ends without a result (killed, out of memory) ends the run with one line (``WorkerDied``); one
that raised hands its exception back, raised here.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys

from zepp.errors import ZeppInputError

_HEAD = struct.Struct("<Q")


class WorkerDied(ZeppInputError):
    """A worker process ended without handing back its unit's result (one line, exit code 2:
    ``zepp bench`` reports it like bad input, since nothing more can be said on the command line)."""


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEAD.pack(len(data)) + data)
    f.flush()


def _recv(f):
    """The next object on ``f``, or ``None`` at end of file (the other side ended)."""
    head = _read(f, _HEAD.size)
    if head is None:
        return None
    body = _read(f, _HEAD.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read(f, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _start() -> subprocess.Popen:
    """One worker, importing the same ``zepp`` as this process."""
    from zepp.launch.children import dies_with_parent

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-m", "zepp.sim.bench_pool"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0, env=env, start_new_session=True,
                            preexec_fn=dies_with_parent())


def _died(proc: subprocess.Popen, unit: dict) -> WorkerDied:
    code = proc.wait()
    if code < 0:
        oom = ", out of memory?" if code == -signal.SIGKILL else ""
        how = f"was killed by signal {-code} ({signal.Signals(-code).name}{oom})"
    else:
        how = f"exited with code {code}"
    return WorkerDied(f"a zepp bench worker process {how} while simulating {unit['key']} ({', '.join(unit['systems'])})"
                      f"; the configurations finished before are in --json (if given): rerun with --resume, with "
                      f"fewer --jobs or smaller --iters/--warmup")


def run_pool(units: list[dict], workers: int, on_result) -> None:
    """``on_result(run_unit(u))`` for every unit of ``units``, in the order they finish, over
    ``workers`` processes; every worker is ended (SIGKILL) on any way out of this call."""
    procs: list[subprocess.Popen] = []
    todo, busy = list(units), {}
    sel = selectors.DefaultSelector()
    try:
        for _ in range(min(workers, len(units))):
            procs.append(_start())
        for p in procs:
            sel.register(p.stdout, selectors.EVENT_READ, p)
            busy[p.pid] = _give(p, todo, sel)
        while sel.get_map():
            for key, _ in sel.select():
                p = key.data
                res = _recv(p.stdout)
                if res is None:
                    raise _died(p, busy[p.pid])
                if isinstance(res, BaseException):
                    raise res
                on_result(res)
                busy[p.pid] = _give(p, todo, sel)
    finally:
        sel.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdin.close()
            p.stdout.close()


def _give(p: subprocess.Popen, todo: list[dict], sel) -> dict | None:
    """Send ``p`` the next unit (returned), or, when none is left, close its input and stop
    watching it (``None``)."""
    if not todo:
        sel.unregister(p.stdout)
        p.stdin.close()
        return None
    unit = todo.pop(0)
    try:
        _send(p.stdin, unit)
    except BrokenPipeError:  # it ended between two units
        raise _died(p, unit) from None
    return unit


def worker_main() -> int:
    """A worker: units from stdin, results (or the exception raised) to stdout, until stdin ends."""
    from zepp.sim.bench_units import run_unit

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # zepp bench handles Ctrl-C and ends the workers
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything printed goes to stderr, not into the results
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    while (unit := _recv(inp)) is not None:
        try:
            res = run_unit(unit)
        except Exception as exc:  # handed back and raised by zepp bench
            res = exc if _picklable(exc) else RuntimeError(f"{type(exc).__name__}: {exc}")
        _send(out, res)
    return 0


def _picklable(obj) -> bool:
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception:
        return False
    return True


if __name__ == "__main__":
    sys.exit(worker_main())
