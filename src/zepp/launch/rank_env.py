"""The environment ``torchrun`` (or another launcher) gives a rank, checked before the rank waits
on any other: ``zepp run`` and ``zepp generate`` started as one rank of a process group.

``RANK`` and ``WORLD_SIZE`` together make this process a rank (``zepp.launch.ranks.under_torchrun``);
one without the other is refused. Under a launcher: ``WORLD_SIZE`` = ``--nodes`` x
``--gpus-per-node``, ``RANK`` in ``[0, WORLD_SIZE)``, ``LOCAL_RANK`` = ``RANK`` mod
``--gpus-per-node`` (consecutive ranks form a node), ``LOCAL_WORLD_SIZE`` (when set) =
``--gpus-per-node``, ``MASTER_ADDR`` set, ``MASTER_PORT`` a port number; every one an integer
where a number goes. Rank 0 of a group without torchrun's agent store (the variables set by
hand) binds ``MASTER_PORT`` itself: a port another process holds is refused here, not left to
``torch.distributed``'s error after the other ranks started waiting. Each problem is one
``ZeppInputError`` naming the variable and the fix.
"""

from __future__ import annotations

import errno
import os
import socket

from zepp.errors import ZeppInputError

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _int(name: str, lo: int, hi: int, env) -> int:
    text = env.get(name)
    if text is None:
        raise ZeppInputError(f"{name} is not set, but RANK and WORLD_SIZE are (this process runs as one rank of a "
                             f"group); start it with torchrun, which sets {', '.join(RANK_VARS)}")
    try:
        value = int(text.strip())
    except ValueError:
        raise ZeppInputError(f"{name}={text!r} is not an integer; check the launcher's environment") from None
    if not lo <= value <= hi:
        raise ZeppInputError(f"{name}={value} is out of range (expected {lo}..{hi}); check the launcher's "
                             f"environment and --nodes/--gpus-per-node")
    return value


def _group(nodes: int, gpus_per_node: int, env) -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)``, both checked against the options."""
    world = _int("WORLD_SIZE", 1, 1 << 20, env)
    if world != nodes * gpus_per_node:
        raise ZeppInputError(f"WORLD_SIZE={world}, but --nodes {nodes} x --gpus-per-node {gpus_per_node} = "
                             f"{nodes * gpus_per_node} ranks; start torchrun with --nnodes {nodes} --nproc-per-node "
                             f"{gpus_per_node}, or change the options")
    rank = _int("RANK", 0, world - 1, env)
    local = _int("LOCAL_RANK", 0, gpus_per_node - 1, env)
    if local != rank % gpus_per_node:
        raise ZeppInputError(f"LOCAL_RANK={local} on RANK={rank}: zepp expects consecutive ranks to form a node "
                             f"(LOCAL_RANK = RANK mod --gpus-per-node = {rank % gpus_per_node}); give torchrun "
                             f"--nproc-per-node {gpus_per_node}")
    if env.get("LOCAL_WORLD_SIZE") is not None:
        lws = _int("LOCAL_WORLD_SIZE", 1, 1 << 20, env)
        if lws != gpus_per_node:
            raise ZeppInputError(f"LOCAL_WORLD_SIZE={lws}, but --gpus-per-node {gpus_per_node}; give torchrun "
                                 f"--nproc-per-node {gpus_per_node}")
    return rank, world


def check_rank_env(nodes: int, gpus_per_node: int, emulate: bool = False, env=None) -> bool:
    """Whether this process runs as one rank of a launcher's group (``RANK`` and ``WORLD_SIZE``
    set), after checking that group's variables (module docstring); ``False`` when neither is set."""
    env = os.environ if env is None else env
    has = [v for v in ("RANK", "WORLD_SIZE") if env.get(v) is not None]
    if not has:
        return False
    if len(has) == 1:
        other = ({"RANK", "WORLD_SIZE"} - set(has)).pop()
        raise ZeppInputError(f"{has[0]} is set but {other} is not: a launcher sets both; unset {has[0]} to start "
                             f"the ranks here, or start this command with torchrun")
    if emulate:
        raise ZeppInputError("--emulate starts its own ranks in the emulated cluster; run it without torchrun (unset "
                             "RANK and WORLD_SIZE)")
    rank, _ = _group(nodes, gpus_per_node, env)
    if not (env.get("MASTER_ADDR") or "").strip():
        raise ZeppInputError("MASTER_ADDR is not set (the address of rank 0); start this command with torchrun, "
                             "which sets it")
    port = _int("MASTER_PORT", 1, 65535, env)
    if rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        check_port_free(port)
    return True


def check_port_free(port: int) -> None:
    """Refuse ``MASTER_PORT`` when another process listens on it here (rank 0 will bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ZeppInputError(f"MASTER_PORT={port} cannot be bound here ({exc.strerror}); choose another "
                                     f"port") from None
            raise ZeppInputError(f"MASTER_PORT={port} is already in use on this machine (another run?); choose a "
                                 f"free port (torchrun --master-port, or MASTER_PORT)") from None
