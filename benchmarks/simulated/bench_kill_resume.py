"""A ``zepp bench --json`` killed at a random moment loses nothing (issue 29).

Each trial starts a small ``zepp bench --json F`` (12 configurations over 2 worker processes, a
few seconds), sends it SIGINT, SIGTERM or SIGKILL after a random delay within the run's length
(every other trial: counted from the moment the first configuration is written, so that F holds
part of the rows more often), and records: the exit code and how long the process and every
holder of its stderr pipe (its workers) took to end after the signal; its peak memory; the
processes of the run left alive; whether F parses and how many rows it holds; the files left
beside F; then ``--resume`` on F and whether the completed file holds the same figures as an
uninterrupted run, to the last digit, with nothing left beside it. ``check(trial)`` states what must hold (the test
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

# 12 configurations over 2 workers (a run of seconds whose rows land across its second half);
# SMALL, 4 of them, for the test
BENCH = ["bench", "--nodes", "1,2", "--models", "k2,qwen", "--budgets", "0.5,1,2", "--iters", "1", "--warmup", "0",
         "--systems", "a2av,zepp", "--jobs", "2"]
SMALL = BENCH[:BENCH.index("--budgets") + 1] + ["1"] + BENCH[BENCH.index("--budgets") + 2:]
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")
LAST_LINE = {"SIGINT": "zepp: interrupted", "SIGTERM": "zepp: terminated"}
# exit status by signal; after a Ctrl-C Python may end by raising SIGINT on itself (when the
# interrupt passed through an import's nested evaluation), which a shell reports as 130 too
CODE = {"SIGINT": (130, -2), "SIGTERM": (143,), "SIGKILL": (-9,)}
MARK = "ZEPP_KILL_TRIAL"  # in the environment of every process of a trial (the workers inherit it)


def _run(bench: list[str], json_path: Path, token: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zepp.cli", *bench, "--json", str(json_path), *extra],
                            env=dict(os.environ, **{MARK: token}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """In the child before exec: SIGINT at its default, as for a command typed at a terminal (a
    background job, a CI runner or nohup start children with SIGINT ignored, and Python then turns
    no Ctrl-C into KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def reference(folder: Path, bench: list[str] = BENCH) -> dict:
    """An uninterrupted run of ``bench``: its rows and its wall time (what the trials compare with)."""
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    p = _run(bench, folder / "ref.json", secrets.token_hex(4))
    reader = _Reader(p.stderr)
    first = _first_row(p, folder / "ref.json") - t0
    p.wait()
    reader.join()
    assert p.returncode == 0, reader.text
    return {"bench": bench, "result": _rows(folder / "ref.json"), "seconds": time.monotonic() - t0,
            "first_row_s": first}


def _first_row(p: subprocess.Popen, out: Path) -> float:
    """When ``out`` first appears (the first configuration written), or ``p`` ends."""
    while not out.exists() and p.poll() is None:
        time.sleep(0.02)
    return time.monotonic()


def _beside(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n not in ("t.json", "t.detail.json"))


def trial(folder: Path, sig: str, delay: float, ref: dict, after_first_row: bool = False) -> dict:
    """One kill and its ``--resume`` (module docstring); what was seen, as a dict. The signal goes
    ``delay`` seconds after the start, or after the first configuration is written
    (``after_first_row``: the moments when F holds part of the rows)."""
    folder.mkdir(parents=True, exist_ok=True)
    token, out = secrets.token_hex(4), folder / "t.json"
    p = _run(ref["bench"], out, token)
    reader = _Reader(p.stderr)
    if after_first_row:
        _first_row(p, out)
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
    res = dict(signal=sig, after="first row" if after_first_row else "start", delay_s=round(delay, 3),
               finished_first=finished, code=p.returncode,
               exited_s=round(exited_s, 3), pipe_closed_s=round(pipe_s, 3), peak_rss_mb=round(usage.ru_maxrss / 1024),
               last_line=[s for s in err.replace("\r", "\n").splitlines() if s.strip()][-1:],
               traceback="Traceback" in err,
               processes_left=left, json="absent" if after is None else after if after == "torn" else len(after[0]),
               files_beside=_beside(folder))
    token = secrets.token_hex(4)
    r = _run(ref["bench"], out, token, "--resume")
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
    if t["signal"] == "SIGINT" and t["code"] == -signal.SIGINT:
        # Python's own KeyboardInterrupt: it came while the interpreter started, before ``zepp.cli``
        # (whose first lines turn a Ctrl-C into one line); nothing was written yet
        assert not t["files_beside"] and t["json"] == "absent", t
        return
    assert t["code"] in CODE[t["signal"]], t
    if t["signal"] != "SIGKILL":  # cleaned up: one line, nothing beside the file
        assert not t["traceback"] and t["last_line"] and t["last_line"][0].startswith(LAST_LINE[t["signal"]]), t
        assert not t["files_beside"], t


def _markdown(res: dict) -> str:
    lines = ["# A killed `zepp bench --json` and its `--resume`", "",
             f"Measured by `benchmarks/simulated/bench_kill_resume.py` ({len(res['trials'])} trials, seed "
             f"{res['seed']}; {res['machine']['cpus']} CPUs, load average {res['machine']['load_avg_start'][0]:.1f} at "
             f"the start, shared machine). Each trial: `zepp {' '.join(BENCH)} --json F`, a signal after a random "
             f"delay, then `--resume` on F. Even trials: a delay from the start within the uninterrupted run's "
             f"{res['reference_s']:.1f} s; odd ones: from the moment F first appears (a configuration written), "
             f"within the {res['reference_s'] - res['reference_first_row_s']:.1f} s the uninterrupted run went on "
             f"after that.", "",
             f"All trials hold (`check`): {res['all_hold']}. {_summary(res['trials'], res['rows'])}", "",
             "| # | signal | after | s | exit | exited s | pipe closed s | peak MB | F after the kill | left beside F "
             "| processes left | resume identical |", "|" + " --- |" * 12]
    for i, t in enumerate(res["trials"]):
        rows = "absent" if t["json"] == "absent" else f"parses, {t['json']} rows"
        code = "finished first" if t["finished_first"] else t["code"]
        lines.append(f"| {i} | {t['signal']} | {t['after']} | {t['delay_s']:.2f} | {code}"
                     f" | {t['exited_s']:.2f} | {t['pipe_closed_s']:.2f} | {t['peak_rss_mb']} | {rows} | "
                     f"{', '.join(t['files_beside']) or '-'} | {len(t['processes_left'])} | {t['resume_identical']} |")
    return "\n".join(lines) + "\n"


def _summary(trials: list[dict], rows: int) -> str:
    """Signals sent, the states F was left in (``rows``: a whole run's), the slowest ends and the
    largest process."""
    sent = {s: sum(t["signal"] == s and not t["finished_first"] for t in trials) for s in SIGNALS}
    states = {"absent": 0, "part": 0, "whole": 0}
    for t in trials:
        states["absent" if t["json"] == "absent" else "whole" if t["json"] == rows else "part"] += 1
    slowest = max(t["exited_s"] for t in trials)
    return (f"Signals that reached a running bench: {', '.join(f'{n} {s}' for s, n in sent.items())} "
            f"({sum(t['finished_first'] for t in trials)} runs had finished first). F after the kill: absent "
            f"{states['absent']}, part of the rows {states['part']}, every row {states['whole']}; torn: "
            f"{sum(t['json'] == 'torn' for t in trials)}. Slowest end after the signal: {slowest:.2f} s "
            f"(process), {max(t['pipe_closed_s'] for t in trials):.2f} s (every holder of its stderr pipe); largest "
            f"process {max(t['peak_rss_mb'] for t in trials)} MB.")


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
        res["reference_s"], res["rows"] = ref["seconds"], len(ref["result"][0])
        res["reference_first_row_s"] = ref["first_row_s"]
        for i in range(args.trials):  # every other trial: a moment after the first row is written
            sig, late = rng.choice(SIGNALS), i % 2 == 1
            span = ref["seconds"] - ref["first_row_s"] if late else ref["seconds"]
            t = trial(work / f"t{i}", sig, rng.uniform(0.0, span), ref, after_first_row=late)
            res["trials"].append(t)
            print(f"{i}: {sig} {t['delay_s']:.2f} s after the {t['after']}: exit {t['code']}, F {t['json']}, "
                  f"resume identical {t['resume_identical']}", flush=True)
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
