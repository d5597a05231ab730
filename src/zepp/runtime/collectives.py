"""The Dispatcher's calls on the wire: process groups, call scopes, all-to-alls, point-to-point chunks.

- ``stage_groups``: the node and rail process groups, created once per process;
- ``plan_scopes``: which group carries each call of a plan (``zepp.planner.flows.call_scopes``);
- ``all_to_all``: one stage (or one wave of a stage) as one ``all_to_all_single`` with uneven
  splits, on the group that carries it, or not at all where that group moves nothing;
- ``post_p2p``: one wave of a stage as a batch of ``batch_isend_irecv`` chunks (through host
  memory where gloo needs it);
- ``LinkCounter``: the bytes this rank put on the wire, per destination and phase.

Each call takes the ``Dispatcher`` ``d`` it runs for (its group, rank, node and rail groups,
counter and timing).
"""

from __future__ import annotations

import atexit
import time

import numpy as np
import torch
import torch.distributed as dist

from zepp.planner.flows.call_scopes import NODE, RAIL, CallScopes, call_scopes
from zepp.planner.overlap.grouping import combine_wave
from zepp.planner.types import FlowPlan
from zepp.runtime.program import Stage

_GROUPS: list = []  # [(world group, ranks, L, node groups, rail groups)]: created once per process group


def stage_groups(world, ranks: int, gpus_per_node: int) -> tuple[list, list]:
    """``(node groups [N], rail groups [L])`` of process group ``world`` (the default group):
    created on first use, by every rank in the same order (``new_group`` is collective over the
    default group), then reused by every Dispatcher of the process. A group of one rank is ``None``."""
    for w, r, l, nodes, rails in _GROUPS:
        if w is world and r == ranks and l == gpus_per_node:
            return nodes, rails
    L, N = gpus_per_node, ranks // gpus_per_node

    from zepp.runtime.rank_process import subgroup

    def new(members):
        return subgroup(members) if len(members) > 1 else None

    nodes = [new(list(range(n * L, n * L + L))) for n in range(N)]
    rails = [new(list(range(q, ranks, L))) for q in range(L)]
    if not _GROUPS:  # a process that never calls leave_group lets go of them before interpreter teardown
        atexit.register(release_groups)
    _GROUPS.append((world, ranks, L, nodes, rails))
    return nodes, rails


def release_groups() -> None:
    """Forget the node and rail groups ``stage_groups`` made (before ``destroy_process_group``,
    so that no group outlives the process group: ``zepp.runtime.rank_process.leave_group``)."""
    _GROUPS.clear()


def plan_scopes(plan: FlowPlan, waves: int, wmap: np.ndarray | None) -> CallScopes:
    """Scopes (``zepp.planner.flows.call_scopes``) of a plan's calls: dispatch stages, then combine
    stage 0 (``waves`` calls, wave of a hop ``wmap[combine_wave]``; ``wmap=None``: one call), then
    the other combine stages. The same on every rank (the plan is)."""
    d, c, L = plan.dispatch, plan.combine, plan.gpus_per_node
    R = plan.routing.topk_ids.shape[0]
    nd = d.num_stages
    if wmap is not None:
        w = wmap[combine_wave(c.owner, c.src, L, R // L)]
        c_call = np.where(c.stage == 0, w, waves - 1 + c.stage.astype(np.int64))
        n_cc = waves + max(c.num_stages - 1, 0) if c.num_stages else 0
    else:
        c_call, n_cc = c.stage.astype(np.int64), c.num_stages
    call = np.concatenate([d.stage.astype(np.int64), nd + c_call])
    return call_scopes(call, np.concatenate([d.src, c.src]), np.concatenate([d.dst, c.dst]), nd + n_cc, R, L)


class LinkCounter:
    """Bytes this rank put on the wire, per destination rank, per phase."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.reset()

    def reset(self) -> None:
        self.by_dst = {p: np.zeros(self.ranks, np.int64) for p in ("dispatch", "combine", "metadata")}

    def add(self, phase: str, dst: int, nbytes: int) -> None:
        self.by_dst[phase][dst] += int(nbytes)

    def split(self, phase: str, rank: int, gpus_per_node: int) -> dict:
        """``{"nvlink": bytes to own-node ranks, "nic": bytes to other nodes}``."""
        b = self.by_dst[phase]
        same = (np.arange(self.ranks) // gpus_per_node) == rank // gpus_per_node
        return {"nvlink": int(b[same].sum()), "nic": int(b[~same].sum())}


def all_to_all(d, recv: torch.Tensor, send: torch.Tensor, st: Stage, phase: str, wave: int = 0,
               async_op: bool = False, h=None, stage: int = 0):
    """All-to-all of one wave of a stage (``W == 1``: the whole stage). ``send``/``recv`` hold
    exactly that wave's rows, by destination / by source. With the handle's scopes the call
    runs on the group that carries it (a node's or a rail's), or not at all where that group
    moves nothing (then only this rank's rows to itself are copied)."""
    sc = st.send_counts[:, wave]
    rc = st.recv_counts[:, wave]
    row = send.shape[1] * send.element_size()
    for q in np.flatnonzero(sc).tolist():
        d.counter.add(phase, q, sc[q] * row)
    t0 = time.perf_counter()
    key = f"{phase[0]}{stage}" + (f"w{wave}" if st.send_counts.shape[1] > 1 else "")
    group, members = d.group, None
    if h is not None and h.scopes is not None:
        k = h.call(phase, stage, wave)
        if not h.scopes.active[k, d.rank]:
            d.calls_skipped += 1
            _copy_own_rows(d.rank, recv, send, sc, rc)
            return _Done()
        group, members = _scope_group(d, int(h.scopes.kind[k]))
    if members is not None:
        sc, rc = sc[members], rc[members]
    d.calls_run += 1
    work = dist.all_to_all_single(recv, send, rc.tolist(), sc.tolist(), group=group, async_op=async_op)
    if not async_op:
        d.timing[key] = d.timing.get(key, 0.0) + time.perf_counter() - t0
    return work


def _copy_own_rows(r: int, recv: torch.Tensor, send: torch.Tensor, sc: np.ndarray, rc: np.ndarray) -> None:
    """The rows rank ``r`` sends itself, in a call it does not run."""
    n = int(sc[r])
    if n:
        recv[int(rc[:r].sum()): int(rc[:r].sum()) + n].copy_(send[int(sc[:r].sum()): int(sc[:r].sum()) + n])


def _scope_group(d, kind: int):
    """``(process group, members slice or None)`` of this rank's group of scope ``kind``."""
    L = d.gpus_per_node
    if kind == NODE:
        return d.node_groups[d.rank // L], slice(d.rank // L * L, (d.rank // L + 1) * L)
    if kind == RAIL:
        return d.rail_groups[d.rank % L], slice(d.rank % L, d.world, L)
    return d.group, None


def post_p2p(d, recv: torch.Tensor, send: torch.Tensor, st: Stage, phase: str, tag: int, wave: int,
             send_offset: int = 0):
    """Post wave ``wave`` of a stage's point-to-point chunks as one batch (every rank posts
    wave ``i`` at the same point, so the batches pair up, as NCCL needs). ``send`` holds the
    stage's send rows from position ``send_offset`` on (wave-major, then destination).
    Returns ``({src: recv work}, [send works])``; an own-rank chunk is copied locally."""
    R, W = st.send_counts.shape
    so = np.r_[0, np.cumsum(st.send_counts.T.ravel())]
    ro = np.r_[0, np.cumsum(st.recv_counts.T.ravel())]
    row = send.shape[1] * send.element_size()
    ops, kinds = [], []
    base_tag = (0 if phase == "dispatch" else 1 << 12) + tag * 64 + wave
    for q in range(R):
        nr = int(st.recv_counts[q, wave])
        a = int(ro[wave * R + q])
        if nr and q != d.rank:
            buf = recv[a: a + nr]
            if d.host_p2p:
                buf = torch.empty(buf.shape, dtype=buf.dtype)
            ops.append(dist.P2POp(dist.irecv, buf, q, d.group, base_tag))
            kinds.append(("r", q, recv[a: a + nr] if d.host_p2p else None))
    for q in range(R):
        ns = int(st.send_counts[q, wave])
        a = int(so[wave * R + q]) - send_offset
        if not ns:
            continue
        d.counter.add(phase, q, ns * row)
        if q == d.rank:
            b = int(ro[wave * R + q])
            recv[b: b + ns].copy_(send[a: a + ns])
        else:
            chunk = send[a: a + ns].cpu() if d.host_p2p else send[a: a + ns]
            ops.append(dist.P2POp(dist.isend, chunk, q, d.group, base_tag))
            kinds.append(("s", q, None))
    return _works(dist.batch_isend_irecv(ops) if ops else [], ops, kinds)


def _works(works: list, ops: list, kinds: list):
    """``({src: recv work}, [send works])`` of a posted batch ``ops`` (``kinds``: ``(r|s, peer,
    device rows of a host-staged receive)`` per op)."""
    recv_w, send_w = {}, []
    if len(works) == len(ops):
        for (kind, q, dev), w, op in zip(kinds, works, ops):
            if kind == "r":
                recv_w[q] = _HostStaged(w, op.tensor, dev) if dev is not None else w
            else:
                send_w.append(w)
    else:  # a coalesced work (NCCL): one wait covers every op
        done = _AllOf(works)
        recv_w = {q: done for kind, q, _ in kinds if kind == "r"}
    return recv_w, send_w


class _HostStaged:
    """A gloo receive into host memory whose ``wait`` also copies the rows to the device."""

    def __init__(self, work, host: torch.Tensor, dev: torch.Tensor):
        self.work, self.host, self.dev = work, host, dev

    def wait(self):
        self.work.wait()
        self.dev.copy_(self.host)


class _Done:
    """The work of a call this rank did not run (its group moves nothing)."""

    def wait(self):
        return True


class _AllOf:
    def __init__(self, works):
        self.works, self.done = works, False

    def wait(self):
        if not self.done:
            for w in self.works:
                w.wait()
            self.done = True
