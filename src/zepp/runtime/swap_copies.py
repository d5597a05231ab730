"""The weight copies of intra-node swaps, posted before a step and waited for slot by slot.

``plan_swaps`` (``zepp.planner.adaptation.swaps``) gives ``copies [M, 3]`` = ``(src_global_slot,
dst_global_slot, expert)`` (global slot = ``rank * S + local slot``). ``post_copies`` starts
every copy of this rank at once and returns ``PendingCopies``; the step that follows runs with
the new placement, and only the GEMM of a slot whose weights have not landed waits for them:
``PendingCopies.run`` computes the rows of slots in place (or landed by then) at once and
queues those of slots still in flight, which ``drain`` computes last, each slot right after its
own copy is in (the layer drains after its last dispatch group, before the combine; ``grouped``
is run + drain within one GEMM call, for the single-GEMM paths and ``zepp generate``).
``finish()`` waits for what is left (sends too), zeroes the slots the swap emptied and leaves
nothing running. ``post_copies(...).finish()`` at once is
the blocking swap.

How the copies travel, beside the step's own traffic:

- A channel of their own (``SwapChannel``): a second process group over the same ranks, so the
  copies never share tags, connections or (NCCL) a stream with the dispatcher's collectives.
- Sources are staged first (a clone of the old weights of every source slot: a slot is often
  both the source of one copy and the destination of another).
- gloo (CPU): one asynchronous ``isend``/``irecv`` per copy and weight tensor, tagged by
  ``tag_base + copy * W + j``; gloo's transport threads move the bytes while this thread
  computes, and ``irecv(...).wait()`` of one slot waits for that slot only. Copies never cross a
  node (``SwapError`` before anything is posted), so on the emulated cluster they use the
  "NVLink" veths, never a NIC.
- NCCL (GPU): the staging clones run on a side CUDA stream and the sends/receives are one
  ``batch_isend_irecv`` on the swap group's own communicator (its own stream), so they overlap
  the step's kernels; a slot's GEMM makes the compute stream wait for the batch (NCCL groups
  the point-to-point calls of a batch into one operation, so there the first pending slot waits
  for all of this rank's copies).
- Same-rank copies are a clone at post time and a ``copy_`` into place when the slot is needed.

Nothing here changes what a GEMM computes: the same rows meet the same weights, so results are
bit-identical to blocking swaps (``grouped`` splits a group only between slots, never inside a
slot's run of rows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from zepp.runtime.rank_process import subgroup


class SwapError(AssertionError):
    """A weight copy would cross nodes: swaps must stay inside one node."""


def check_swap_copies(copies, slots: int, gpus_per_node: int) -> np.ndarray:
    """``copies [M, 3]`` (src global slot, dst global slot, expert) as int64; ``SwapError`` if any
    copy would cross nodes."""
    copies = np.asarray(copies, np.int64).reshape(-1, 3)
    src_rank, dst_rank = copies[:, 0] // slots, copies[:, 1] // slots
    cross = src_rank // gpus_per_node != dst_rank // gpus_per_node
    if np.any(cross):
        i = int(np.flatnonzero(cross)[0])
        raise SwapError(f"swap copy {i} moves expert {copies[i, 2]} from rank {src_rank[i]} to rank "
                        f"{dst_rank[i]} on another node; swaps stay inside a node")
    return copies


class SwapChannel:
    """The process group the weight copies travel on: a second group over the ranks of
    ``group`` (default: the world), created collectively (every rank of ``group`` constructs
    its ``SwapChannel`` at the same point); ``own=False`` uses ``group`` itself (the blocking
    swaps of ``zepp.runtime.moe``, which run between steps). ``host_p2p``: stage through host memory (gloo with
    CUDA tensors)."""

    def __init__(self, group=None, device=None, own: bool = True):
        group = group if group is not None else dist.group.WORLD
        self.backend = dist.get_backend(group)
        self.group = subgroup(dist.get_process_group_ranks(group), self.backend) if own else group
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.host_p2p = self.backend == "gloo" and self.device.type == "cuda"
        self.nccl = self.backend == "nccl"
        self.stream = torch.cuda.Stream(self.device) if own and self.device.type == "cuda" else None


@dataclass
class _Incoming:
    """One slot's coming weights: ``bufs[j]`` shaped like ``weights[j][slot]`` (received into, or
    the staged clone of a same-rank source); ``work``: the receives (empty: already here);
    ``event``: CUDA event after which the buffers are valid (side-stream clones), else None."""

    bufs: list
    works: list = field(default_factory=list)
    event: object = None


@dataclass
class CopyStats:
    """What one swap cost this rank: ``copies`` (global count, the same on every rank),
    ``sent_to [R]`` weight bytes this rank sent per destination rank, ``received`` bytes,
    ``local`` bytes of same-rank copies, ``post_s`` seconds spent posting (staging included),
    ``wait_s`` seconds this thread waited for or wrote landed weights, ``waited_slots``."""

    copies: int
    sent_to: np.ndarray
    received: int = 0
    local: int = 0
    post_s: float = 0.0
    wait_s: float = 0.0
    waited_slots: int = 0

    @property
    def sent(self) -> int:
        return int(self.sent_to.sum())

    def cross_node(self, rank: int, gpus_per_node: int) -> int:
        """Bytes this rank sent to ranks of other nodes (always 0: ``SwapError`` first)."""
        other = np.arange(self.sent_to.size) // gpus_per_node != rank // gpus_per_node
        return int(self.sent_to[other].sum())


class PendingCopies:
    """A swap in flight on this rank (see the module docstring).

    ``weights``: this rank's per-slot tensors ``[S, ...]`` (e.g. ``w1 [S, H, F]``, ``w2 [S, F, H]``);
    ``incoming``: ``{local slot: _Incoming}``; ``sends``: works of this rank's sends (their
    staged buffers are kept alive until they finish); ``emptied [n]``: local slots that the
    swap leaves empty (zeroed by ``finish``).
    """

    def __init__(self, weights: list, incoming: dict, sends: list, emptied: np.ndarray, stats: CopyStats):
        self.weights, self.incoming, self.sends = weights, incoming, sends
        self.emptied, self.stats = emptied, stats
        self._pending = np.array(sorted(incoming), np.int64)
        self._queue: list = []  # GEMMs of slots in flight, deferred by run() until drain()

    def waiting(self) -> np.ndarray:
        """``[n]`` local slots whose weights are not in place yet (sorted)."""
        return self._pending

    def ready(self, slots) -> None:
        """Put the weights of local ``slots`` in place, waiting for their copies (others untouched)."""
        t0 = time.perf_counter()
        for s in np.asarray(slots, np.int64).reshape(-1).tolist():
            inc = self.incoming.pop(s, None)
            if inc is None:
                continue
            for w in inc.works:
                w.wait()
            if inc.event is not None:
                torch.cuda.current_stream(self.weights[0].device).wait_event(inc.event)
            for w, b in zip(self.weights, inc.bufs):
                w[s].copy_(b.view(w[s].shape), non_blocking=True)
            self.stats.waited_slots += 1
        self._pending = np.array(sorted(self.incoming), np.int64)
        self.stats.wait_s += time.perf_counter() - t0

    def landed(self) -> None:
        """Put in place, without blocking, the slots whose copies have all completed."""
        done = [s for s, inc in self.incoming.items() if all(w.is_completed() for w in inc.works)]
        if done:
            self.ready(done)

    def run(self, gemm, x: torch.Tensor, slot: np.ndarray, w: torch.Tensor, put) -> None:
        """``gemm(x [n, *], slot [n], w) -> [n, out]`` (a grouped GEMM over runs of equal slots),
        its results handed to ``put(sel [m] int64 rows of x, y [m, out])``: the rows of slots in
        place (or landed by now) at once; the rows of each slot still in flight are queued and
        computed by ``drain`` after everything else, each slot after its own weights land. Each
        slot's rows go through ``gemm`` together, as without swaps."""
        slot = np.asarray(slot)
        self.landed()
        late = np.isin(slot, self._pending) if self._pending.size else np.zeros(slot.size, bool)
        if not late.any():
            put(np.arange(slot.size), gemm(x, slot, w))
            return
        now = np.flatnonzero(~late)
        if now.size:
            put(now, gemm(x[torch.as_tensor(now, device=x.device)], slot[now], w))
        for s in np.unique(slot[late]).tolist():
            sel = np.flatnonzero(slot == s)
            self._queue.append((s, gemm, x[torch.as_tensor(sel, device=x.device)], slot[sel], w, put, sel))

    def drain(self) -> None:
        """The queued GEMMs of ``run``, in slot order, each after its slot's weights land."""
        queue, self._queue = sorted(self._queue, key=lambda q: q[0]), []
        for s, gemm, xs, ss, w, put, sel in queue:
            self.ready([s])
            put(sel, gemm(xs, ss, w))

    def grouped(self, gemm, x: torch.Tensor, slot: np.ndarray, w: torch.Tensor) -> torch.Tensor:
        """``run`` then ``drain`` into one output ``[n, out]``: the rows of slots still in flight
        computed last in this group, each right after its own weights land."""
        parts = []
        self.run(gemm, x, slot, w, lambda sel, y: parts.append((sel, y)))
        self.drain()
        if len(parts) == 1 and parts[0][0].size == x.shape[0]:
            return parts[0][1]
        out = parts[0][1].new_empty((x.shape[0], *parts[0][1].shape[1:]))
        for sel, y in parts:
            out[torch.as_tensor(sel, device=x.device)] = y
        return out

    def in_flight(self) -> int:
        """Copies (receives and sends) of this rank not finished yet."""
        works = [w for inc in self.incoming.values() for w in inc.works] + [w for w, _ in self.sends]
        return sum(1 for w in works if not w.is_completed())

    def finish(self) -> CopyStats:
        """Wait for every copy of this rank (the rest of the receives, then the sends), zero the
        emptied slots; afterwards nothing of this swap is running."""
        self.drain()
        self.ready(list(self.incoming))
        t0 = time.perf_counter()
        for w, _ in self.sends:
            w.wait()
        self.sends = []
        for s in self.emptied.tolist():
            for w in self.weights:
                w[s].zero_()
        if self.weights and self.weights[0].device.type == "cuda":
            torch.cuda.current_stream(self.weights[0].device).synchronize()
        self.stats.wait_s += time.perf_counter() - t0
        return self.stats


def _stage(weights: list, s: int, channel: SwapChannel) -> list:
    """Clones ``[w[s] for w in weights]`` of local slot ``s`` (on the side stream on CUDA; in
    host memory with ``host_p2p``)."""
    bufs = [w[s].clone() for w in weights]
    return [b.cpu() for b in bufs] if channel.host_p2p else bufs


def post_copies(weights: list, copies, old_slot_expert: np.ndarray, new_slot_expert: np.ndarray,
                channel: SwapChannel, gpus_per_node: int, tag_base: int = 0) -> PendingCopies:
    """Start this rank's part of a swap; every rank calls this with the same arguments.

    ``weights``: per-slot tensors ``[S, ...]`` of this rank; ``copies [M, 3]`` from
    ``plan_swaps``; ``old_slot_expert`` / ``new_slot_expert [R, S]``: the placements before and
    after. Raises ``SwapError`` before posting anything if a copy would cross nodes or read a
    slot that does not hold its expert. ``tag_base``: distinct per swap in flight at once (one
    per layer), at least ``M * len(weights)`` apart.
    """
    t0 = time.perf_counter()
    old, new = np.asarray(old_slot_expert), np.asarray(new_slot_expert)
    S, r = old.shape[1], channel.rank
    copies = check_swap_copies(copies, S, gpus_per_node)
    if np.any(old.ravel()[copies[:, 0]] != copies[:, 2]):
        raise SwapError("a swap copy reads a slot that does not hold its expert")
    stats = CopyStats(int(copies.shape[0]), np.zeros(channel.world, np.int64))
    side = torch.cuda.stream(channel.stream) if channel.stream is not None else _Null()
    if channel.stream is not None:
        channel.stream.wait_stream(torch.cuda.current_stream(channel.device))
    sends: list = []
    with side:
        staged = {a - r * S: _stage(weights, a - r * S, channel) for a in np.unique(copies[:, 0]).tolist()
                  if a // S == r}
        incoming, ops, op_slots = _copy_ops(weights, copies, staged, S, channel, tag_base, stats)
        _post(ops, op_slots, incoming, sends, staged, channel)
        event = None
        if channel.stream is not None:
            event = torch.cuda.Event()
            event.record(channel.stream)
    for inc in incoming.values():
        inc.event = event
    emptied = np.flatnonzero((new[r] < 0) & (old[r] >= 0))
    stats.post_s = time.perf_counter() - t0
    return PendingCopies(list(weights), incoming, sends, emptied, stats)


def _copy_ops(weights: list, copies: np.ndarray, staged: dict, S: int, channel: SwapChannel, tag_base: int,
              stats: CopyStats) -> tuple[dict, list, list]:
    """This rank's part of ``copies [M, 3]``: ``(incoming {local slot: _Incoming}, ops [P2POp],
    op_slots [local slot of a receive, None for a send])``; a copy inside the rank takes its
    ``staged`` clone at once. ``stats`` gets the bytes."""
    r, W = channel.rank, len(weights)
    incoming, ops, op_slots = {}, [], []
    for i, (a, b, _) in enumerate(copies.tolist()):
        ra, rb = a // S, b // S
        if ra == r and rb == r:
            incoming[b - r * S] = _Incoming(staged[a - r * S])
            stats.local += sum(x.numel() * x.element_size() for x in staged[a - r * S])
        elif ra == r:
            for j, buf in enumerate(staged[a - r * S]):
                tag = tag_base + i * W + j
                ops.append(dist.P2POp(dist.isend, buf, group=channel.group, tag=tag, group_peer=rb))
                op_slots.append(None)
                stats.sent_to[rb] += buf.numel() * buf.element_size()
        elif rb == r:
            dev = "cpu" if channel.host_p2p else weights[0].device
            bufs = [w[0].new_empty(w[0].shape, device=dev) for w in weights]
            incoming[b - r * S] = _Incoming(bufs)
            for j, buf in enumerate(bufs):
                tag = tag_base + i * W + j
                ops.append(dist.P2POp(dist.irecv, buf, group=channel.group, tag=tag, group_peer=ra))
                op_slots.append(b - r * S)
                stats.received += buf.numel() * buf.element_size()
    return incoming, ops, op_slots


def _post(ops: list, op_slots: list, incoming: dict, sends: list, staged: dict, channel: SwapChannel) -> None:
    """Post ``ops``: one by one on gloo (a work per receive, so a slot waits for itself only),
    as one batch on NCCL (every receiving slot then waits for the batch)."""
    if not ops:
        return
    if channel.nccl:
        works = dist.batch_isend_irecv(ops)
        for inc in incoming.values():
            inc.works.extend(works)
        sends.extend((w, staged) for w in works)
        return
    for op, s in zip(ops, op_slots):
        work = op.op(op.tensor, group=op.group, tag=op.tag, group_dst=op.group_peer) if op.op is dist.isend \
            else op.op(op.tensor, group=op.group, tag=op.tag, group_src=op.group_peer)
        if s is None:
            sends.append((work, op.tensor))
        else:
            incoming[s].works.append(work)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
