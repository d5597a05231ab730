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
``python -m zepp.emulate.worker_rank CONFIG.json OUTDIR`` (the same worker, plus NIC counters)
in each rank's namespace with ``GLOO_SOCKET_IFNAME=nic``.

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
folder is removed on every exit path (``zepp.launch.processes`` says what is guaranteed). The
launch itself (local ranks, torchrun, the emulated cluster) is ``zepp.launch.ranks.launch``,
the same as ``zepp generate``'s; the option rules shared with it are ``zepp.launch.checks``.
"""

from __future__ import annotations

import functools
import os

import click
import numpy as np

from zepp.errors import RankFailure, ZeppInputError
from zepp.launch import ranks
from zepp.launch.checks import check_fault, check_input_file, check_launch_options, check_number, check_seed
from zepp.outputs import Place
from zepp.registry import help_list
from zepp.runtime.systems import DEFAULT_ALL
from zepp.traces.schedules import SCHEDULES

__all__ = ["RankFailure", "spawn_local", "validate_run_options", "format_report", "run"]

RANK_MODULE = "zepp.runtime.worker"  # what every rank of ``zepp run`` runs


def spawn_local(cfg: dict, threads: int = 1, grace: float | None = None, timeout: float | None = None) -> dict:
    """Run ``cfg`` (a ``zepp.runtime.worker`` config) on ``nodes * gpus_per_node`` local
    processes and return rank 0's report (``zepp.launch.ranks.spawn_local``). Raises
    ``RankFailure``; once a rank has failed the others get ``grace`` seconds (default
    ``timeout + 15``) to end before they are killed (and reported as hung). ``timeout``: an
    overall limit in seconds (None: none)."""
    return ranks.spawn_local(RANK_MODULE, cfg, threads=threads, grace=grace, timeout=timeout)


def _check_traces(cfg: dict, spec) -> None:
    """Read and validate the trace files here, so a bad file is one line before any rank starts."""
    from zepp.runtime.inputs import load_traces

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


def _check_model(o: dict, ranks_: int):
    """The model spec of the options, its token count and its experts over ``ranks_`` ranks."""
    from zepp.model import model_preset

    spec = model_preset(o["model"], experts=o["experts"], topk=o["topk"], hidden=o["hidden"], ffn=o["ffn"])
    check_number("--extra", o["extra"], 0, spec.num_experts, integer=True)
    if o["tokens"] is None:
        check_number("--budget-mb", o["budget_mb"], 0, 1 << 20, lo_open=True)
        spec.tokens_for_budget(o["budget_mb"])  # the model's own checks
    else:
        check_number("--tokens", o["tokens"], 1, 1 << 24, integer=True)
    if spec.num_experts % ranks_:
        raise ZeppInputError(f"{spec.num_experts} experts do not divide over {ranks_} ranks; "
                             f"change --experts, --nodes or --gpus-per-node")
    return spec


def validate_run_options(o: dict) -> tuple[dict, object]:
    """Check every ``zepp run`` option in ``o`` (the click parameters); returns the worker config
    and, with ``--emulate``, the emulated cluster (not up yet; else None). Raises
    ``ZeppInputError`` (one line) on the first bad one."""
    from zepp.runtime.systems import parse_systems

    common = check_launch_options(o)  # (before importing the worker, and torch with it)
    check_number("--iters", o["iters"], 1, 10**6, integer=True)
    check_number("--warmup", o["warmup"], 0, 10**6, integer=True)
    check_seed(o["seed"])
    spec = _check_model(o, common["nodes"] * common["gpus_per_node"])
    systems = parse_systems(o["systems"])
    cluster = None
    if o["emulate"]:
        from zepp.emulate.launcher import check_cluster

        cluster = check_cluster(common["nodes"], common["gpus_per_node"], o["rate_mbit"], o["delay_ms"],
                                o["emulate_prefix"])
    claim_run_outputs([Place("--json", o["json_path"])],
                      [Place("--history", o["history"]), Place("--trace", o["trace"])])
    from zepp.runtime.worker import default_config

    cfg = default_config()
    cfg.update(common, model=o["model"], experts=o["experts"], topk=o["topk"], hidden=o["hidden"], ffn=o["ffn"],
               budget_mb=o["budget_mb"], tokens=o["tokens"], systems=systems, check=o["check"], history=o["history"],
               trace=o["trace"], iters=o["iters"], warmup=o["warmup"], seed=o["seed"], relaxation=o["relaxation"],
               extra=o["extra"], dtype=o["dtype"], schedule=_schedule(o["schedule"]),
               fault=check_fault(o["fault"], common["nodes"] * common["gpus_per_node"], systems, "iter"))
    _check_traces(cfg, spec)
    return cfg, cluster


def claim_run_outputs(outputs: list, inputs: list) -> None:
    """The last check of ``zepp run`` and ``zepp generate``: the outputs (``zepp.outputs``), held
    by the process that writes them (rank 0 under torchrun, else the launcher)."""
    from zepp.outputs import claim_outputs

    claim_outputs(outputs, inputs, lock=not ranks.under_torchrun() or os.environ["RANK"].strip() == "0")


def _schedule(name: str | None) -> str | None:
    """``--schedule``: a name of ``zepp.traces.schedules.SCHEDULES`` (one-line error otherwise), or None."""
    if name is None:
        return None
    from zepp.traces.schedules import check_schedule

    return check_schedule(name)


def format_report(report: dict) -> str:
    mb = 2**20
    head = (f"{report['model']['name']} (E={report['model']['experts']}, k={report['model']['topk']}, "
            f"H={report['model']['hidden']}, FFN={report['model']['ffn']}), {report['config']['nodes']} nodes x "
            f"{report['config']['gpus_per_node']} ranks, {report['tokens_per_rank']} tokens/rank, "
            f"{report['config']['dtype']}; batches from {(report.get('traces') or {}).get('eval')}")
    cols = f"{'system':<11} {'correct':>8} {'max rel err':>12} {'bytes==plan':>11} {'NIC MB/it':>10} " \
           f"{'NVLink MB/it':>12} {'meta KB/it':>10} {'layer ms':>9} {'plan ms':>8}"
    sched = (report.get("traces") or {}).get("schedule")
    lines = [head] + ([sched["describe"]] if sched else []) + [cols, "-" * len(cols)]
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
    lines += _swap_lines(report)
    return "\n".join(lines)


def _swap_lines(report: dict) -> list[str]:
    """Per swapping system: swaps per step, their bytes (across nodes: must be 0) and the time
    they add to the step (``zepp.runtime.swap_steps``)."""
    out = []
    for name, s in report["systems"].items():
        sw = s.get("swaps")
        if not sw or not sw["per_step"]:
            continue
        mb = [b / 2**20 for b in sw["bytes_per_step"]]
        out.append(f"{name} swaps ({sw['mode']} copies): slots per step {sw['per_step']}, weight MB per step "
                   f"{[round(v, 2) for v in mb]}, across nodes {sum(sw['cross_node_bytes_per_step'])} B, "
                   f"exposed ms per step (posting + waiting) {[round(v, 2) for v in sw['exposed_ms']]}, "
                   f"planning ms median {float(np.median(sw['plan_ms'])):.2f}")
        if sw.get("added_ms") is not None:
            out.append(f"{name} swap time added to a step (step - control replay, median) {sw['added_ms']:.2f} ms; "
                       f"the same copies alone, blocking {sw['alone_median_ms']:.2f} ms; ratio "
                       f"{sw['added_over_alone']:.2f}")
    return out


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
@click.option("--schedule", default=None, metavar="NAME",
              help=f"Demand schedule, one of {', '.join(SCHEDULES)} (zepp.traces.schedules); default: batches "
                   f"sampled from the whole --trace, as stationary.")
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
        schedule, iters, warmup, seed, relaxation, extra, dtype, device, timeout, threads, json_path, fault, emulate,
        rate_mbit, delay_ms, emulate_prefix):
    """Run MoE layers on torch.distributed with each system; report correctness, bytes, time."""
    cfg, cluster = validate_run_options(dict(locals()))
    emulated = None
    if cluster is not None:
        from zepp.emulate.launcher import run_emulated

        emulated = functools.partial(run_emulated, cfg, threads=threads, cluster=cluster)
    report = ranks.launch(RANK_MODULE, cfg, label="zepp run" + (" --emulate" if emulate else ""), threads=threads,
                          emulated=emulated)
    _finish(report, check, json_path)


def _finish(report: dict, check: bool, json_path: str | None) -> None:
    click.echo(format_report(report))
    if "emulate" in report:
        from zepp.emulate.nic_bytes import format_emulate

        click.echo(format_emulate(report))
    if json_path:
        from zepp.outputs import write_json

        write_json(json_path, report, "--json")
    bad = [n for n, s in report["systems"].items() if not s["bytes_match"] or (check and not s["correct"])]
    if bad:
        click.echo(f"zepp run: check failed for {', '.join(bad)} (output mismatch or bytes != plan)", err=True)
        raise SystemExit(1)
