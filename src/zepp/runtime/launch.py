"""``zepp run``: execute systems for real on torch.distributed and check them.

On one machine it starts the ranks itself (gloo on CPU), one process per rank running
``python -m zepp.runtime.worker CONFIG.json``::

    zepp run --nodes 2 --gpus-per-node 2 --model k2 --hidden 256 --budget-mb 1 --systems all --check

Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set) it spawns nothing and runs as
that rank; rank 0 prints the report. On real GPU nodes (NCCL), run on every node::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank $NODE --rdzv-backend c10d \\
        --rdzv-endpoint $HEAD:29500 -m zepp.cli run --nodes 2 --gpus-per-node 4 \\
        --model qwen --budget-mb 16 --systems all --device cuda --check --json out.json

(``python -m zepp.cli`` is the ``zepp`` command; ``--nproc-per-node`` must equal
``--gpus-per-node``, since consecutive ranks form a node.) The emulated cluster starts
``python -m zepp.runtime.worker CONFIG.json`` itself with ``GLOO_SOCKET_IFNAME`` per rank.

``--emulate`` runs the same ranks inside an emulated multi-node cluster (``zepp.emulate``: one
network namespace per rank, NICs shaped to ``--rate-mbit``, torn down afterwards) and adds the
bytes each NIC carried, from its interface counters, next to the planner's::

    zepp run --emulate --nodes 2 --gpus-per-node 2 --model k2 --hidden 256 --tokens 512 --systems all --check

A rank that dies or hangs ends the run: peers fail their next collective (at once for a dead
peer, after ``--timeout`` seconds for a hung one) and exit with code 3; the launcher then stops
what is left and exits 3 naming the first rank that failed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import click

from zepp.errors import ZeppInputError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_local(cfg: dict, threads: int = 1, quiet: bool = False, grace: float | None = None) -> dict:
    """Start ``nodes * gpus_per_node`` local worker processes for ``cfg`` and wait for them.

    Returns the report rank 0 wrote. Raises ``RankFailure`` when a rank fails; once one has
    failed the others get ``grace`` seconds (default ``timeout + 15``) to end before they are
    killed, so every process is gone before this returns.
    """
    world = cfg["nodes"] * cfg["gpus_per_node"]
    with tempfile.TemporaryDirectory(prefix="zepp-run-") as tmp:
        cfg = dict(cfg, out=os.path.join(tmp, "report.json"))
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        port = _free_port()
        procs = []
        old_term = _raise_on_sigterm()
        try:
            for r in range(world):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r % cfg["gpus_per_node"]),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ZEPP_THREADS=str(threads))
                procs.append(subprocess.Popen([sys.executable, "-m", "zepp.runtime.worker", path], env=env,
                                              stdout=subprocess.DEVNULL if quiet else None,
                                              stderr=subprocess.PIPE, text=True))
            codes, first, errs = _wait_all(procs, float(cfg["timeout"]) + 15 if grace is None else grace)
        finally:  # Ctrl-C or SIGTERM of the launcher: no orphaned ranks
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        if first is not None:
            raise RankFailure(first, codes, errs)
        with open(cfg["out"]) as f:
            return json.load(f)


def _raise_on_sigterm():
    """Turn SIGTERM into SystemExit (so ``finally`` blocks run); returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(143)

    return signal.signal(signal.SIGTERM, handler)


class RankFailure(RuntimeError):
    """A rank exited with an error (or had to be killed)."""

    def __init__(self, first: int, codes: list, errs: list[str]):
        why = {17: "died (fault injection)", 3: "saw a communication failure", 4: "rejected its input",
               5: "hit an internal error", -9: "hung and was killed by the launcher"}
        # ranks that failed on their own account (not just noticed a peer failing)
        culprits = [r for r, c in enumerate(codes) if c not in (0, 3)] or [first]
        self.first, self.codes, self.errs, self.culprits = first, codes, errs, culprits
        lines = [f"rank {r} {why.get(codes[r], f'exited with code {codes[r]}')}" for r in culprits]
        lines = ["; ".join(lines) + f" (first to fail: rank {first}; exit codes by rank: {codes})"]
        for r, e in enumerate(errs):
            tail = [ln for ln in e.strip().splitlines() if ln.strip()][-3:]
            if tail:
                lines.append(f"  rank {r}: " + " | ".join(tail))
        super().__init__("\n".join(lines))


def _wait_all(procs, grace: float):
    """Wait for every process; once one fails, give the others ``grace`` seconds to notice,
    then kill them. Returns ``(exit codes, first failing rank or None, stderr texts)``."""
    errs = [""] * len(procs)

    def drain(i, p):
        errs[i] = p.stderr.read()

    threads = [threading.Thread(target=drain, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    first, deadline = None, None
    while True:
        codes = [p.poll() for p in procs]
        if first is None:
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                first = bad[0]
                deadline = time.monotonic() + grace
        if all(c is not None for c in codes):
            break
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=5)
    codes = [p.returncode for p in procs]
    if first is None and any(codes):
        first = next(r for r, c in enumerate(codes) if c)
    return codes, first, errs


def format_report(report: dict) -> str:
    mb = 2**20
    head = (f"{report['model']['name']} (E={report['model']['experts']}, k={report['model']['topk']}, "
            f"H={report['model']['hidden']}, FFN={report['model']['ffn']}), {report['config']['nodes']} nodes x "
            f"{report['config']['gpus_per_node']} ranks, {report['tokens_per_rank']} tokens/rank, "
            f"{report['config']['dtype']}; batches from {(report.get('traces') or {}).get('eval')}")
    cols = f"{'system':<11} {'correct':>8} {'max rel err':>12} {'bytes==plan':>11} {'NIC MB/it':>10} " \
           f"{'NVLink MB/it':>12} {'meta KB/it':>10} {'layer ms':>9} {'plan ms':>8}"
    lines = [head, cols, "-" * len(cols)]
    for name, s in report["systems"].items():
        b = s["bytes_per_iter"]
        n = max(len(b["measured_dispatch_nic"]), 1)
        nic = (sum(b["measured_dispatch_nic"]) + sum(b["measured_combine_nic"])) / n
        nvl = (sum(b["measured_dispatch_nvlink"]) + sum(b["measured_combine_nvlink"])) / n
        meta = sum(s["metadata_bytes_per_iter"].values()) / 1024
        err = "-" if s["max_rel_err"] is None else f"{s['max_rel_err']:.2e}"
        ok = "-" if s["correct"] is None else ("yes" if s["correct"] else "NO")
        lines.append(f"{name:<11} {ok:>8} {err:>12} {'yes' if s['bytes_match'] else 'NO':>11} {nic / mb:>10.3f} "
                     f"{nvl / mb:>12.3f} {meta:>10.1f} {s['median_layer_ms']:>9.2f} {s['median_plan_ms']:>8.2f}")
    return "\n".join(lines)


@click.command("run")
@click.option("--nodes", default=2, show_default=True, type=int, help="Nodes (consecutive ranks form a node).")
@click.option("--gpus-per-node", default=2, show_default=True, type=int, help="Ranks per node.")
@click.option("--model", default="k2", show_default=True, help="Model preset.")
@click.option("--experts", type=int, default=None, help="Override the expert count.")
@click.option("--topk", type=int, default=None, help="Override top-k.")
@click.option("--hidden", type=int, default=None, help="Override the hidden size (shrink for CPUs).")
@click.option("--ffn", type=int, default=None, help="Override the expert FFN size.")
@click.option("--budget-mb", default=1.0, show_default=True, type=float, help="Message budget per GPU (MB).")
@click.option("--tokens", type=int, default=None, help="Tokens per rank (overrides --budget-mb).")
@click.option("--systems", default="all", show_default=True,
              help="Comma list of a2av, eplb, relay, zepp, zepp-a2av, zepp-sync, zepp-swap, zepp-p2p; 'all' = "
                   "the first five.")
@click.option("--check/--no-check", default=False, help="Compare with a single-process reference; exit 1 on mismatch.")
@click.option("--history", type=click.Path(dir_okay=False), default=None, help="History trace (placement).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None, help="Trace to sample batches from.")
@click.option("--iters", default=5, show_default=True, type=int, help="Timed iterations per system.")
@click.option("--warmup", default=1, show_default=True, type=int, help="Untimed iterations first.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--relaxation", default=0.25, show_default=True, type=float, help="Balance relaxation C.")
@click.option("--extra", default=2, show_default=True, type=int, help="Redundant slots per GPU.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda (cuda uses NCCL).")
@click.option("--timeout", default=60.0, show_default=True, type=float,
              help="Seconds a collective may wait before the run ends with an error.")
@click.option("--threads", default=1, show_default=True, type=int, help="torch threads per spawned rank.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the report here.")
@click.option("--fault", default=None, hidden=True, help="Test hook: JSON {rank, system, iter, mode}.")
@click.option("--emulate", is_flag=True, default=False,
              help="Run the ranks in an emulated cluster (network namespaces, shaped NICs; needs root) and "
                   "report the bytes each NIC carried from its interface counters.")
@click.option("--rate-mbit", type=float, default=None,
              help="With --emulate: NIC rate per direction in Mbit/s (default: zepp.emulate's, 1000).")
@click.option("--delay-ms", type=float, default=0.0, show_default=True,
              help="With --emulate: added one-way NIC latency (needs the netem qdisc).")
@click.option("--emulate-prefix", default="zepp", show_default=True, hidden=True,
              help="With --emulate: name prefix of the namespaces.")
def run(nodes, gpus_per_node, model, experts, topk, hidden, ffn, budget_mb, tokens, systems, check, history, trace,
        iters, warmup, seed, relaxation, extra, dtype, device, timeout, threads, json_path, fault, emulate, rate_mbit,
        delay_ms, emulate_prefix):
    """Run MoE layers on torch.distributed with each system; report correctness, bytes, time."""
    from zepp.model import model_preset
    from zepp.runtime.systems import parse_systems
    from zepp.runtime.worker import default_config, run_in_process

    for opt, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node), ("--iters", iters)):
        if v < 1:
            raise ZeppInputError(f"{opt} must be at least 1, got {v}")
    if warmup < 0:
        raise ZeppInputError(f"--warmup must be >= 0, got {warmup}")
    if timeout <= 0:
        raise ZeppInputError(f"--timeout must be positive, got {timeout}")
    spec = model_preset(model, experts=experts, topk=topk, hidden=hidden, ffn=ffn)
    if tokens is None:
        spec.tokens_for_budget(budget_mb)  # validates the budget
    elif tokens < 1:
        raise ZeppInputError(f"--tokens must be at least 1, got {tokens}")
    if spec.num_experts % (nodes * gpus_per_node):
        raise ZeppInputError(f"{spec.num_experts} experts do not divide over {nodes * gpus_per_node} ranks; "
                             f"change --experts, --nodes or --gpus-per-node")
    for p in (history, trace):
        if p is not None and not os.path.isfile(p):
            raise ZeppInputError(f"trace file {p!r} does not exist")
    cfg = default_config()
    cfg.update(nodes=nodes, gpus_per_node=gpus_per_node, model=model, experts=experts, topk=topk, hidden=hidden,
               ffn=ffn, budget_mb=budget_mb, tokens=tokens, systems=parse_systems(systems), check=check,
               history=history, trace=trace, iters=iters, warmup=warmup, seed=seed, relaxation=relaxation,
               extra=extra, dtype=dtype, device=device, backend="nccl" if device.startswith("cuda") else "gloo",
               timeout=timeout, fault=json.loads(fault) if fault else None)
    if emulate:
        _run_emulated(cfg, rate_mbit, delay_ms, threads, emulate_prefix, check, json_path)
        return
    if rate_mbit is not None or delay_ms:
        raise ZeppInputError("--rate-mbit/--delay-ms shape the emulated cluster's NICs; add --emulate")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: be that rank
        with tempfile.TemporaryDirectory(prefix="zepp-run-") as tmp:
            cfg["out"] = os.path.join(tmp, "report.json")
            code = run_in_process(cfg)
            if int(os.environ["RANK"]) != 0 or code:
                raise SystemExit(code)
            with open(cfg["out"]) as f:
                report = json.load(f)
        _finish(report, check, json_path)
        return
    try:
        report = spawn_local(cfg, threads=threads)
    except RankFailure as exc:
        click.echo(f"zepp run: {exc}", err=True)
        raise SystemExit(3)
    _finish(report, check, json_path)


def _run_emulated(cfg: dict, rate_mbit, delay_ms, threads, prefix, check, json_path) -> None:
    """``--emulate``: the same run inside an emulated cluster (``zepp.emulate.runner``)."""
    from zepp.emulate.netns import DEFAULT_RATE_MBIT, EmulationError, EmulationUnavailable, availability
    from zepp.emulate.runner import format_emulate, run_emulated

    if cfg["device"] != "cpu":
        raise ZeppInputError("--emulate runs gloo ranks on the CPU; drop --device")
    ok, reason = availability()
    if not ok:
        click.echo(f"zepp run --emulate: emulated cluster unavailable: {reason}", err=True)
        raise SystemExit(2)
    try:
        report = run_emulated(cfg, DEFAULT_RATE_MBIT if rate_mbit is None else rate_mbit, delay_ms, threads=threads,
                              prefix=prefix)
    except RankFailure as exc:
        click.echo(f"zepp run --emulate: {exc}\n(the emulated cluster was torn down)", err=True)
        raise SystemExit(3)
    except (EmulationUnavailable, EmulationError) as exc:
        click.echo(f"zepp run --emulate: {exc}", err=True)
        raise SystemExit(2)
    _finish(report, check, json_path, extra=format_emulate(report))


def _finish(report: dict, check: bool, json_path: str | None, extra: str | None = None) -> None:
    click.echo(format_report(report))
    if extra:
        click.echo(extra)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    bad = [n for n, s in report["systems"].items() if not s["bytes_match"] or (check and not s["correct"])]
    if bad:
        click.echo(f"zepp run: check failed for {', '.join(bad)} (output mismatch or bytes != plan)", err=True)
        raise SystemExit(1)
