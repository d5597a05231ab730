"""How a layer's rows group into dispatch groups, combine waves and messages.

One definition for both executors: the simulator (``zepp.sim.layer``) and the runtime's
per-rank programs (``zepp.runtime.program``) call these functions, so "wave 0" or "dispatch
group 2" means the same rows in both.

- A *dispatch group* of a computing rank ``at`` is the set of its entries whose token came from
  one place: ``0`` its own tokens, ``1`` tokens of the other GPUs of its node, ``1 + d`` tokens of
  the node ``d`` steps behind it in ring order (``d = 1 .. N-1``): GEMM 1 runs per group in
  arrival order.
- An executor that runs each dispatch stage as one collective groups by *arrival stage*
  instead: ``0`` its own tokens, ``1 + s`` the rows first delivered by stage ``s`` (the
  runtime's ``arrival_event`` ``e`` of ``zepp.runtime.program`` is in group ``(e + 1) // 2``).
- A *combine wave* of rank ``at`` is the set of its entries whose owner lives on one node: wave
  ``i`` holds the owners of node ``node(at) + i + 1`` (ring order), the own node last
  (``i = N-1``). At wave ``i`` every rank sends to node ``node + i + 1`` and receives from node
  ``node - i - 1`` (a ring shift), so the waves of all ranks pair up.
- A *message* is every hop of one phase sharing ``(stage, src, dst, msg)``; with groups or waves
  the message key is refined by the owner's node, so a forwarded message carries one source
  node's rows and a combine message one destination node's partials.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zepp.planner.intsort import sorted_with_order
from zepp.planner.types import Hops, PlanInvariantError

def dispatch_group(owner: np.ndarray, at: np.ndarray, gpus_per_node: int, nodes: int) -> np.ndarray:
    """``[n]`` dispatch group of entries owned by ``owner [n]`` computed on ``at [n]`` (see above)."""
    own, at = np.asarray(owner, np.int64), np.asarray(at, np.int64)
    on, an = own // gpus_per_node, at // gpus_per_node
    return np.where(own == at, 0, np.where(on == an, 1, 1 + (on - an) % nodes))


def arrival_stage(owner: np.ndarray, token: np.ndarray, at: np.ndarray, dispatch: Hops, tokens_per_rank: int
                  ) -> np.ndarray:
    """``[n]`` arrival-stage group of entries of token ``(owner [n], token [n])`` computed on
    ``at [n]``: 0 for own tokens, else ``1 +`` the earliest stage of a ``dispatch`` hop that
    delivers the token to ``at``. A non-own entry that no hop delivers is a ``PlanInvariantError``."""
    own, tok, at = (np.asarray(a, np.int64) for a in (owner, token, at))
    out = np.zeros(own.size, np.int64)
    far = np.flatnonzero(own != at)
    if far.size == 0:
        return out
    R = int(max(own.max(), at.max(), dispatch.dst.max(initial=0))) + 1
    T = int(tokens_per_rank)
    hkey = (dispatch.dst.astype(np.int64) * R + dispatch.owner) * T + dispatch.token
    order = np.lexsort((dispatch.stage, hkey))  # by key, earliest stage first
    hk = hkey[order]
    want = (at[far] * R + own[far]) * T + tok[far]
    i = np.minimum(np.searchsorted(hk, want), max(hk.size - 1, 0))
    if hk.size == 0 or np.any(hk[i] != want):
        raise PlanInvariantError("an entry is computed on a rank that no dispatch hop delivers its token to")
    out[far] = 1 + dispatch.stage[order[i]].astype(np.int64)
    return out


def combine_wave(owner: np.ndarray, at: np.ndarray, gpus_per_node: int, nodes: int) -> np.ndarray:
    """``[n]`` combine wave of entries owned by ``owner [n]`` computed (or held) on ``at [n]``:
    the ring offset of the owner's node from ``at``'s node, own node last."""
    own, at = np.asarray(owner, np.int64), np.asarray(at, np.int64)
    return ((own // gpus_per_node) - (at // gpus_per_node) - 1) % nodes


def split_by_owner_node(h: Hops, gpus_per_node: int) -> Hops:
    """The same hops with message keys refined by the token owner's node."""
    if h.size == 0:
        return h
    msg = h.msg.astype(np.int64) * (int(h.owner.max()) // gpus_per_node + 1) + h.owner // gpus_per_node
    return Hops(h.stage, h.src, h.dst, h.owner, h.token, msg.astype(np.int32), h.entry)


def split_by_key(h: Hops, key: np.ndarray) -> Hops:
    """The same hops with message keys refined by ``key [M]`` (ints >= 0): hops of one message
    with different keys become different messages (coarse dispatch groups / combine waves of a
    ``zepp.planner.overlap.granularity.Granularity``)."""
    if h.size == 0:
        return h
    key = np.asarray(key, np.int64)
    msg = h.msg.astype(np.int64) * (int(key.max()) + 1) + key
    return Hops(h.stage, h.src, h.dst, h.owner, h.token, msg.astype(np.int32), h.entry)


@dataclass
class Messages:
    """The messages of one phase: ``hop_msg [M]`` message index of each hop; per message
    ``stage``, ``src``, ``dst``, ``rows`` (``[m]`` each). ``entry_task`` / ``exit_task`` are
    filled by the simulator (the task that receives the message's dependencies, the transfer);
    so are ``pieces`` and ``pairs`` where it cuts messages into pieces (``zepp.sim.chunks``:
    pieces per message, and the stage dependencies ``(pre, post)`` between messages). ``keys [m]``:
    each message's ``(stage, src, dst, msg)`` key, ascending (``messages``)."""

    hop_msg: np.ndarray
    stage: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rows: np.ndarray
    entry_task: np.ndarray = field(default=None)
    exit_task: np.ndarray = field(default=None)
    pieces: np.ndarray = field(default=None)
    pairs: tuple = field(default=None)
    keys: np.ndarray = field(default=None)


def messages(h: Hops, ranks: int, weights: np.ndarray | None = None) -> Messages:
    """Group the hops of one phase into messages (see the module notes); ``weights [n]``: the rows
    each element stands for where it is not one row (the simulator's cells), else one each."""
    R = ranks
    mmax = int(h.msg.max(initial=0)) + 1
    key = ((h.stage.astype(np.int64) * R + h.src) * R + h.dst) * mmax + h.msg
    uniq, inv, cnt = group_keys(key)
    if weights is not None:
        cnt = np.bincount(inv, weights=weights, minlength=uniq.size).astype(np.int64)
    sd = uniq // mmax
    return Messages(hop_msg=inv, stage=sd // (R * R), src=(sd // R) % R, dst=sd % R, rows=cnt, keys=uniq)


def group_keys(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(uniq, inv, cnt)`` of integer keys ``[n]``: the sorted distinct keys, each key's index in
    ``uniq`` and each distinct key's count (``int64`` each; ``np.unique``'s answer). Keys that
    fit a table of a few times ``n`` entries are counted in one pass instead of sorted."""
    key = np.asarray(key, np.int64)
    if key.size == 0:
        z = np.zeros(0, np.int64)
        return z, z.copy(), z.copy()
    lo, hi = int(key.min()), int(key.max())
    if lo >= 0 and hi < max(1 << 20, 4 * key.size):
        tab = np.bincount(key, minlength=hi + 1)
        uniq = np.flatnonzero(tab)
        pos = np.zeros(hi + 1, np.int64)
        pos[uniq] = np.arange(uniq.size)
        return uniq.astype(np.int64), pos[key], tab[uniq].astype(np.int64)
    ks, order = sorted_with_order(key)
    new = np.concatenate(([True], ks[1:] != ks[:-1]))
    inv = np.empty(key.size, np.int64)
    inv[order] = np.cumsum(new) - 1
    cnt = np.diff(np.concatenate((np.flatnonzero(new), [ks.size])))
    return ks[new], inv, cnt.astype(np.int64)
