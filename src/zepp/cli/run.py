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

Every option (and the trace files, and whether ``--json`` can be written) is checked before
any rank starts: one line ``zepp: error: ...``, exit code 2. The spawned ranks rendezvous
through a file store in the run's temp folder and gloo binds the loopback device (the
emulated cluster: each rank's own NIC address), so nothing listens on the machine's other
interfaces; results come back as JSON, never pickles. Ranks die with the launcher, and the temp
folder is removed on every exit path (``zepp.launch.processes`` says what is guaranteed).
"""

from __future__ import annotations

import json
import os
import sys

import click

from zepp.registry import help_list
from zepp.runtime.systems import DEFAULT_ALL

from zepp.launch.checks import check_input_file, check_number, check_output_path
from zepp.launch.processes import RankGroup, launcher_signals, temp_folder
from zepp.errors import RankFailure, ZeppInputError

__all__ = ["RankFailure", "spawn_local", "validate_run_options", "format_report", "run"]

FAULT_MODES = ("die", "hang")


def spawn_local(cfg: dict, threads: int = 1, quiet: bool = False, grace: float | None = None,
                timeout: float | None = None) -> dict:
    """Start ``nodes * gpus_per_node`` local worker processes for ``cfg`` and wait for them.

    Returns the report rank 0 wrote. Raises ``RankFailure`` when a rank fails; once one has
    failed the others get ``grace`` seconds (default ``timeout + 15``) to end before they are
    killed (and reported as hung), so every process is gone before this returns. ``timeout``:
    an overall limit in seconds (None: none). The ranks' output is kept in the run's temp folder
    and shown (stderr tails) only in a failure; ``quiet`` is accepted for older callers.
    """
    world = cfg["nodes"] * cfg["gpus_per_node"]
    grace = float(cfg["timeout"]) + 15 if grace is None else grace
    with launcher_signals(), temp_folder("zepp-run-") as tmp:
        cfg = dict(cfg, out=os.path.join(tmp, "report.json"))
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        base = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "TORCHELASTIC_RUN_ID")}
        base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(cfg["gpus_per_node"]), MASTER_ADDR="127.0.0.1",
                    ZEPP_STORE_FILE=os.path.join(tmp, "store"), ZEPP_THREADS=str(threads),
                    GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
        envs = [dict(base, RANK=str(r), LOCAL_RANK=str(r % cfg["gpus_per_node"])) for r in range(world)]
        cmd = [sys.executable, "-m", "zepp.runtime.worker", path]
        with RankGroup([cmd] * world, envs, os.path.join(tmp, "logs")) as group:
            res = group.wait(timeout=timeout, grace=grace)
        if not res.ok:
            raise res.failure()
        with open(cfg["out"]) as f:
            return json.load(f)


def _check_device(device: str) -> str:
    import torch

    ok = device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())
    if not ok:
        raise ZeppInputError(f"--device {device!r}: use cpu, cuda (one GPU per rank) or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ZeppInputError(f"--device {device}: no CUDA device is available here; use --device cpu")
        if ":" in device and int(device[5:]) >= torch.cuda.device_count():
            raise ZeppInputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def _parse_fault(text: str | None, systems: list[str], world: int) -> dict | None:
    if text is None:
        return None
    try:
        fault = json.loads(text)
    except ValueError as exc:
        raise ZeppInputError(f"--fault {text!r} is not JSON ({exc.msg}); give "
                             '\'{"rank": 1, "system": "zepp-overlap", "iter": 0, "mode": "die"}\'') from None
    if not isinstance(fault, dict) or set(fault) - {"rank", "system", "iter", "mode"}:
        raise ZeppInputError(f"--fault {text!r}: give a JSON object with keys rank, system, iter, mode")
    rank, it = fault.get("rank"), fault.get("iter")
    if not (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < world):
        raise ZeppInputError(f"--fault: rank must be an integer in 0..{world - 1}, got {rank!r}")
    if not (isinstance(it, int) and not isinstance(it, bool) and it >= 0):
        raise ZeppInputError(f"--fault: iter must be an integer >= 0, got {it!r}")
    if fault.get("system") not in systems:
        raise ZeppInputError(f"--fault: system must be one of the run's systems ({', '.join(systems)}), "
                             f"got {fault.get('system')!r}")
    if fault.setdefault("mode", "die") not in FAULT_MODES:
        raise ZeppInputError(f"--fault: mode must be one of {', '.join(FAULT_MODES)}, got {fault['mode']!r}")
    return fault


def _check_traces(cfg: dict, spec) -> None:
    """Read and validate the trace files here, so a bad file is one line before any rank starts."""
    from zepp.runtime.worker import load_traces

    for opt in ("history", "trace"):
        if cfg.get(opt) is not None:
            check_input_file(cfg[opt], f"--{opt}")
    if cfg.get("history") and not cfg.get("trace"):
        raise ZeppInputError("--history needs --trace too (the evaluation batches are drawn from --trace)")
    if not cfg.get("trace"):
        return
    try:
        load_traces(cfg, spec)
    except ZeppInputError:
        raise
    except (OSError, ValueError, UnicodeDecodeError, EOFError) as exc:
        raise ZeppInputError(f"--trace/--history: {cfg.get('trace')!r} or {cfg.get('history')!r} cannot be read "
                             f"as a trace ({type(exc).__name__}: {exc})") from None


def validate_run_options(o: dict) -> tuple[dict, object]:
    """Check every ``zepp run`` option in ``o`` (the click parameters); returns the worker
    config and the model spec. Raises ``ZeppInputError`` (one line) on the first bad one."""
    from zepp.model import model_preset
    from zepp.runtime.systems import parse_systems
    from zepp.runtime.worker import default_config

    nodes = check_number("--nodes", o["nodes"], 1, 256, integer=True)
    L = check_number("--gpus-per-node", o["gpus_per_node"], 1, 64, integer=True)
    if nodes * L > 256:
        raise ZeppInputError(f"--nodes x --gpus-per-node = {nodes * L} ranks; at most 256 on one machine")
    check_number("--iters", o["iters"], 1, 10**6, integer=True)
    check_number("--warmup", o["warmup"], 0, 10**6, integer=True)
    check_number("--seed", o["seed"], 0, 2**63 - 1, integer=True)
    check_number("--timeout", o["timeout"], 0, 10**6, lo_open=True)
    check_number("--threads", o["threads"], 1, 1024, integer=True)
    check_number("--relaxation", o["relaxation"], 0, 1000)
    device = _check_device(str(o["device"]))
    spec = model_preset(o["model"], experts=o["experts"], topk=o["topk"], hidden=o["hidden"], ffn=o["ffn"])
    check_number("--extra", o["extra"], 0, spec.num_experts, integer=True)
    if o["tokens"] is None:
        check_number("--budget-mb", o["budget_mb"], 0, 1 << 20, lo_open=True)
        spec.tokens_for_budget(o["budget_mb"])  # the model's own checks
    else:
        check_number("--tokens", o["tokens"], 1, 1 << 24, integer=True)
    if spec.num_experts % (nodes * L):
        raise ZeppInputError(f"{spec.num_experts} experts do not divide over {nodes * L} ranks; "
                             f"change --experts, --nodes or --gpus-per-node")
    systems = parse_systems(o["systems"])
    if o["json_path"]:
        check_output_path(o["json_path"], "--json")
    if o["emulate"]:
        if device != "cpu":
            raise ZeppInputError("--emulate runs gloo ranks on the CPU; drop --device")
        from zepp.emulate.topology import DEFAULT_RATE_MBIT, EmulatedCluster

        EmulatedCluster(nodes, L, rate_mbit=DEFAULT_RATE_MBIT if o["rate_mbit"] is None else o["rate_mbit"],
                        delay_ms=o["delay_ms"], prefix=o["emulate_prefix"])  # validates rate, delay, prefix
    elif o["rate_mbit"] is not None or o["delay_ms"]:
        raise ZeppInputError("--rate-mbit/--delay-ms shape the emulated cluster's NICs; add --emulate")
    cfg = default_config()
    cfg.update(nodes=nodes, gpus_per_node=L, model=o["model"], experts=o["experts"], topk=o["topk"],
               hidden=o["hidden"], ffn=o["ffn"], budget_mb=o["budget_mb"], tokens=o["tokens"], systems=systems,
               check=o["check"], history=o["history"], trace=o["trace"], iters=o["iters"], warmup=o["warmup"],
               seed=o["seed"], relaxation=o["relaxation"], extra=o["extra"], dtype=o["dtype"], device=device,
               backend="nccl" if device.startswith("cuda") else "gloo", timeout=float(o["timeout"]),
               fault=_parse_fault(o["fault"], systems, nodes * L))
    _check_traces(cfg, spec)
    return cfg, spec


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
              help=f"Comma list of {help_list('runtime')}; zepp runs each of its variants; 'all' = "
                   f"{', '.join(DEFAULT_ALL)}. See zepp systems.")
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
    from zepp.runtime.worker import run_in_process

    cfg, _ = validate_run_options(dict(
        nodes=nodes, gpus_per_node=gpus_per_node, model=model, experts=experts, topk=topk, hidden=hidden, ffn=ffn,
        budget_mb=budget_mb, tokens=tokens, systems=systems, check=check, history=history, trace=trace, iters=iters,
        warmup=warmup, seed=seed, relaxation=relaxation, extra=extra, dtype=dtype, device=device, timeout=timeout,
        threads=threads, json_path=json_path, fault=fault, emulate=emulate, rate_mbit=rate_mbit, delay_ms=delay_ms,
        emulate_prefix=emulate_prefix))
    if emulate:
        _run_emulated(cfg, rate_mbit, delay_ms, threads, emulate_prefix, check, json_path)
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: be that rank
        with temp_folder("zepp-run-") as tmp:
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
    from zepp.emulate.runner import format_emulate, run_emulated
    from zepp.emulate.topology import DEFAULT_RATE_MBIT, availability
    from zepp.errors import EmulationError, EmulationUnavailable

    ok, reason = availability()
    if not ok:
        click.echo(f"zepp run --emulate: emulated cluster unavailable: {reason}", err=True)
        raise SystemExit(2)
    try:
        with launcher_signals():
            report = run_emulated(cfg, DEFAULT_RATE_MBIT if rate_mbit is None else rate_mbit, delay_ms,
                                  threads=threads, prefix=prefix)
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
