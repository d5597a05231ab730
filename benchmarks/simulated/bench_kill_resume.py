"""A ``zepp bench --json`` killed at a random moment loses nothing (issue 29).

Each trial starts a tiny ``zepp bench --json F`` (4 configurations over 2 worker processes, a
few seconds), sends it SIGINT, SIGTERM or SIGKILL after a random delay within the run's length,
and records: the exit code and how long the process and every holder of its stderr pipe (its
workers) took to end after the signal; its peak memory; the processes of the run left alive;
whether F parses and how many rows it holds; the files left beside F; then ``--resume`` on F and
whether the completed file holds the same figures as an uninterrupted run, to the last digit,
with nothing left beside it. ``check(trial)`` states what must hold (the test
``tests/cli/test_cli_bench_kill.py`` runs three trials with it).

Writes ``benchmarks/results/bench_kill_resume.{json,md}``. Usage:
``python benchmarks/simulated/bench_kill_resume.py [--trials 20] [--seed 0] [--out benchmarks/results]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = ["bench", "--nodes", "1,2", "--models", "k2,qwen", "--budgets", "1", "--iters", "1", "--warmup", "0",
         "--systems", "a2av,zepp", "--jobs", "2"]
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")
LAST_LINE = {"SIGINT": "zepp: interrupted", "SIGTERM": "zepp: terminated"}
CODE = {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}
MARK = "ZEPP_KILL_TRIAL"  # in the environment of every process of a trial (the workers inherit it)


def _run(json_path: Path, token: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zepp.cli", *BENCH, "--json", str(json_path), *extra],
                            env=dict(os.environ, **{MARK: token}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _marked(token: str) -> list[int]:
    """The live processes carrying the trial's mark."""
    want, found = f"{MARK}={token}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] in "ZX"
        except OSError:
            continue
        if want in env and not zombie:
            found.append(int(pid))
    return found


def _rows(path: Path):
    """``(rows, the geomean fields)`` of a bench --json file; ``None`` when absent, ``"torn"`` when it
    does not parse."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return "torn"
    return data["rows"], {k: v for k, v in data.items() if k != "rows"}


class _Reader(threading.Thread):
    """Reads a pipe to its end (so the writer never blocks on a full pipe); ``at``: when it ended."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.text, self.at = pipe, "", 0.0
        self.start()

    def run(self) -> None:
        self.text = self.pipe.read().decode(errors="replace")
        self.at = time.monotonic()


def reference(folder: Path) -> dict:
    """An uninterrupted run: its rows and its wall time."""
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    p = _run(folder / "ref.json", secrets.token_hex(4))
    err = p.communicate()[1].decode()
    assert p.returncode == 0, err
    return {"result": _rows(folder / "ref.json"), "seconds": time.monotonic() - t0}


def _beside(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n not in ("t.json", "t.detail.json"))


def trial(folder: Path, sig: str, delay: float, ref: dict) -> dict:
    """One kill and its ``--resume`` (module docstring); what was seen, as a dict."""
    folder.mkdir(parents=True, exist_ok=True)
    token, out = secrets.token_hex(4), folder / "t.json"
    p = _run(out, token)
    reader = _Reader(p.stderr)
    time.sleep(delay)
    pid, status, usage = os.wait4(p.pid, os.WNOHANG)  # (not Popen.poll: it would reap the process)
    finished = pid != 0
    t0 = time.monotonic()
    if not finished:
        os.kill(p.pid, getattr(signal, sig))  # (not Popen.send_signal: it polls, and may reap)
        _, status, usage = os.wait4(p.pid, 0)
    exited_s = time.monotonic() - t0
    reader.join()  # end of file: every holder of the pipe has ended
    err, pipe_s = reader.text, reader.at - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    left = _marked(token)
    after = _rows(out)
    res = dict(signal=sig, delay_s=round(delay, 3), finished_first=finished, code=p.returncode,
               exited_s=round(exited_s, 3), pipe_closed_s=round(pipe_s, 3), peak_rss_mb=round(usage.ru_maxrss / 1024),
               last_line=[s for s in err.replace("\r", "\n").splitlines() if s.strip()][-1:], traceback="Traceback" in err,
               processes_left=left, json="absent" if after is None else after if after == "torn" else len(after[0]),
               files_beside=_beside(folder))
    token = secrets.token_hex(4)
    r = _run(out, token, "--resume")
    err = r.communicate()[1].decode(errors="replace")
    res.update(resume_code=r.returncode, resume_identical=_rows(out) == ref["result"],
               resume_said=[s for s in err.splitlines() if s.startswith("--resume")][:1],
               resume_processes_left=_marked(token), resume_files_beside=_beside(folder))
    return res


def check(t: dict) -> None:
    """What every trial must show (assertions)."""
    assert t["json"] != "torn", t
    assert t["resume_code"] == 0 and t["resume_identical"], t
    assert not t["processes_left"] and not t["resume_processes_left"], t
    assert not t["resume_files_beside"], t
    assert t["pipe_closed_s"] < 10 and t["peak_rss_mb"] < 1024, t
    if t["finished_first"]:
        return
    if t["signal"] == "SIGTERM" and t["code"] == -signal.SIGTERM:
        # SIGTERM's own default: it came while Python started or ended, outside zepp's handler
        assert not t["files_beside"] and not t["traceback"], t
        return
    assert t["code"] == CODE[t["signal"]], t
    if t["signal"] != "SIGKILL":  # cleaned up: one line, nothing beside the file
        assert not t["traceback"] and t["last_line"] and t["last_line"][0].startswith(LAST_LINE[t["signal"]]), t
        assert not t["files_beside"], t


def _markdown(res: dict) -> str:
    lines = ["# A killed `zepp bench --json` and its `--resume`", "",
             f"Measured by `benchmarks/simulated/bench_kill_resume.py` ({len(res['trials'])} trials, seed "
             f"{res['seed']}; {res['machine']['cpus']} CPUs, load average {res['machine']['load_avg_start'][0]:.1f} at "
             f"the start, shared machine). Each trial: `zepp {' '.join(BENCH)} --json F`, a signal after a random "
             f"delay within the uninterrupted run's {res['reference_s']:.1f} s, then `--resume` on F.", "",
             f"All trials hold (`check`): {res['all_hold']}.", "",
             "| # | signal | after s | exit | exited s | pipe closed s | peak MB | F after the kill | left beside F | "
             "processes left | resume identical |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, t in enumerate(res["trials"]):
        rows = "absent" if t["json"] == "absent" else f"parses, {t['json']} rows"
        lines.append(f"| {i} | {t['signal']} | {t['delay_s']:.2f} | {'finished first' if t['finished_first'] else t['code']}"
                     f" | {t['exited_s']:.2f} | {t['pipe_closed_s']:.2f} | {t['peak_rss_mb']} | {rows} | "
                     f"{', '.join(t['files_beside']) or '-'} | {len(t['processes_left'])} | {t['resume_identical']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="zepp-killtrials-"))
    res = {"machine": {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}, "seed": args.seed,
           "bench": BENCH, "trials": []}
    try:
        ref = reference(work / "ref")
        res["reference_s"] = ref["seconds"]
        for i in range(args.trials):
            sig = rng.choice(SIGNALS)
            t = trial(work / f"t{i}", sig, rng.uniform(0.0, ref["seconds"]), ref)
            res["trials"].append(t)
            print(f"{i}: {sig} after {t['delay_s']:.2f} s: exit {t['code']}, F {t['json']}, resume identical "
                  f"{t['resume_identical']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    held = []
    for t in res["trials"]:
        try:
            check(t)
            held.append(True)
        except AssertionError:
            held.append(False)
    res["all_hold"] = all(held)
    res["machine"]["load_avg_end"] = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "bench_kill_resume.json").write_text(json.dumps(res, indent=1) + "\n")
    Path(args.out, "bench_kill_resume.md").write_text(_markdown(res))


if __name__ == "__main__":
    main()
