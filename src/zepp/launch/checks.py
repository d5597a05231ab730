"""Option checks shared by every command that starts ranks or clusters (``zepp run``,
``zepp generate``, ``zepp cluster``; output paths: ``zepp.outputs``): each
raises one ``ZeppInputError`` naming the option and the fix, before any work starts. One rule
per option, one message, whichever command has it.
"""

from __future__ import annotations

import json
import math
import os

from zepp.errors import ZeppInputError

MAX_RANKS = 256  # ranks on one machine (local processes or emulated namespaces)
FAULT_MODES = ("die", "hang")


def check_number(option: str, v, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                 integer: bool = False):
    """``v`` if it is a finite number (an integer with ``integer``) within ``[lo, hi]``
    (``(lo, hi]`` with ``lo_open``), else ``ZeppInputError`` naming ``option``."""
    good = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    good = good and (not integer or float(v).is_integer())
    if good and lo is not None:
        good = v > lo if lo_open else v >= lo
    if good and hi is not None:
        good = v <= hi
    if not good:
        rng = f"{'above' if lo_open else 'at least'} {_fmt(lo)}" if lo is not None else ""
        if hi is not None:
            rng += (" and " if rng else "") + f"at most {_fmt(hi)}"
        raise ZeppInputError(f"{option} must be {'an integer' if integer else 'a finite number'}"
                             f"{' ' + rng if rng else ''}, got {v!r}")
    return int(v) if integer else v


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


MAX_SEED = 2**63 - 1  # numpy's SeedSequence takes any non-negative integer; one bound for every command


def check_seed(seed, option: str = "--seed") -> int:
    """``seed`` if it is an integer in ``[0, MAX_SEED]`` (numpy refuses negative seeds)."""
    return check_number(option, seed, 0, MAX_SEED, integer=True)


def plot_suffixes() -> tuple[str, ...]:
    """The file suffixes matplotlib can write (``png``, ``pdf``, ``svg``, ...), from its own table."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


MAX_SIM_NODES = 4096  # the largest cluster a cluster file may describe (``zepp.cluster.FIELD_RANGES``)


def check_sim_numbers(*, nodes=None, gpus_per_node=None, budget_mb=None, iters=None, warmup=None, seed=None) -> None:
    """The numbers the simulating commands (``plan``, ``bench``, ``timeline``, ``place``) share,
    each checked when given: node and GPU counts, the message budget (MB per GPU), iterations,
    warm-up iterations and the seed."""
    if nodes is not None:
        check_number("--nodes", nodes, 1, MAX_SIM_NODES, integer=True)
    if gpus_per_node is not None:
        check_number("--gpus-per-node", gpus_per_node, 1, 1024, integer=True)
    if budget_mb is not None:
        check_number("--budget-mb", budget_mb, 0, 1 << 20, lo_open=True)
    if iters is not None:
        check_number("--iters", iters, 1, 10**6, integer=True)
    if warmup is not None:
        check_number("--warmup", warmup, 0, 10**6, integer=True)
    if seed is not None:
        check_seed(seed)


def check_input_file(path: str, option: str) -> str:
    """``path`` if it is a regular, readable file (not a folder, pipe or device)."""
    if not os.path.exists(path):
        raise ZeppInputError(f"{option} {path!r} does not exist")
    if not os.path.isfile(path):
        raise ZeppInputError(f"{option} {path!r} is not a regular file (a folder, pipe or device); give a trace file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ZeppInputError(f"{option} {path!r} cannot be read ({exc.strerror})") from None
    return path


def check_ranks(nodes, gpus_per_node) -> tuple[int, int]:
    """``(nodes, gpus_per_node)`` if both are positive integers and their product, the ranks on
    this machine, is at most ``MAX_RANKS``."""
    n = check_number("--nodes", nodes, 1, MAX_RANKS, integer=True)
    L = check_number("--gpus-per-node", gpus_per_node, 1, 64, integer=True)
    if n * L > MAX_RANKS:
        raise ZeppInputError(f"--nodes x --gpus-per-node = {n * L} ranks; at most {MAX_RANKS} on one machine")
    return n, L


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` (one GPU per rank, ``LOCAL_RANK``) or ``cuda:N``, if this machine has it."""
    device = str(device)
    if not (device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ZeppInputError(f"--device {device!r}: use cpu, cuda (one GPU per rank) or cuda:N")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ZeppInputError(f"--device {device}: no CUDA device is available here; use --device cpu")
        if ":" in device and int(device[5:]) >= torch.cuda.device_count():
            raise ZeppInputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def check_fault(text: str | None, world: int, systems: list[str], at: str) -> dict | None:
    """The hidden ``--fault`` test hook: JSON ``{"rank", "system" (optional: every system), at,
    "mode": "die"|"hang"}``, where ``at`` is the counter the ranks fire it on (``iter``, ``step``)."""
    if text is None:
        return None
    example = f'\'{{"rank": 1, "system": "{systems[0]}", "{at}": 0, "mode": "die"}}\''
    try:
        fault = json.loads(text)
    except ValueError as exc:
        raise ZeppInputError(f"--fault {text!r} is not JSON ({exc.msg}); give {example}") from None
    if not isinstance(fault, dict) or set(fault) - {"rank", "system", at, "mode"}:
        raise ZeppInputError(f"--fault {text!r}: give a JSON object with keys rank, system, {at}, mode")
    rank, when = fault.get("rank"), fault.get(at)
    if not (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < world):
        raise ZeppInputError(f"--fault: rank must be an integer in 0..{world - 1}, got {rank!r}")
    if not (isinstance(when, int) and not isinstance(when, bool) and when >= 0):
        raise ZeppInputError(f"--fault: {at} must be an integer >= 0, got {when!r}")
    if "system" in fault and fault["system"] not in systems:
        raise ZeppInputError(f"--fault: system must be one of the run's systems ({', '.join(systems)}), "
                             f"got {fault['system']!r}")
    if fault.setdefault("mode", "die") not in FAULT_MODES:
        raise ZeppInputError(f"--fault: mode must be one of {', '.join(FAULT_MODES)}, got {fault['mode']!r}")
    return fault


def check_launch_options(o: dict) -> dict:
    """The options every rank launcher has (``zepp run``, ``zepp generate``): ``nodes``,
    ``gpus_per_node`` (under torchrun: with the environment it hands this rank,
    ``zepp.launch.rank_env``), ``timeout``, ``threads``, ``relaxation``, ``device``, ``emulate``
    with ``rate_mbit``/``delay_ms`` (values checked by the emulated cluster itself), ``json_path``.
    Returns ``{nodes, gpus_per_node, device, backend, timeout}`` for the rank config."""
    from zepp.launch.rank_env import check_rank_env

    nodes, L = check_ranks(o["nodes"], o["gpus_per_node"])
    check_rank_env(nodes, L, o["emulate"])
    timeout = float(check_number("--timeout", o["timeout"], 0, 10**6, lo_open=True))
    check_number("--threads", o["threads"], 1, 1024, integer=True)
    check_number("--relaxation", o["relaxation"], 0, 1000)
    device = check_device(o["device"])
    if o["emulate"] and device != "cpu":
        raise ZeppInputError("--emulate runs gloo ranks on the CPU; drop --device")
    if not o["emulate"] and (o["rate_mbit"] is not None or o.get("delay_ms")):
        raise ZeppInputError("--rate-mbit/--delay-ms shape the emulated cluster's NICs; add --emulate")
    if o["json_path"] is not None:
        from zepp.outputs import check_output_file

        check_output_file(o["json_path"], "--json")
    return dict(nodes=nodes, gpus_per_node=L, device=device, backend="nccl" if device.startswith("cuda") else "gloo",
                timeout=timeout)
