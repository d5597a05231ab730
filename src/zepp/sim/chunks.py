"""DeepEP's chunked pipelining of its normal kernels (``Mechanics.chunked``).

DeepEP V1's normal kernels (facts from its public source, ``deep_ep/buffer.py`` and
``csrc/deep_ep.cpp``, read 2026-12-01; no code taken):

- ``Buffer.num_sms = 20`` SMs by default, and one channel uses two of them (a sender and a
  receiver block): ``DEEPEP_CHANNELS = 10`` channels, each a contiguous range of a rank's tokens,
  running side by side.
- Each channel sends its tokens for a destination node in chunks of at most
  ``num_max_rdma_chunked_send_tokens`` tokens, and a forwarding GPU passes each chunk it received
  on over NVLink in chunks of at most ``num_max_nvl_chunked_send_tokens`` tokens without waiting
  for the rest; the combine runs the same way in reverse. ``Buffer.get_dispatch_config`` and
  ``Buffer.get_combine_config`` give the recommended chunk sizes per EP size
  (``Config(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)``); ``DEEPEP_CHUNKS`` holds their
  send sizes.

The simulator models this as a stream of pieces per message: a message on a relay path (one
that feeds a later stage, or is fed by an earlier one) is cut into ``K`` equal pieces, ``K =
ceil(rows / (channels * chunk))`` (a channel's sequential chunks, the channels side by side),
with its link's chunk size (RDMA across nodes, NVLink inside one). Pieces of a message follow one
another on its link; the first pays the message's fixed cost, the rest stream behind it. Piece
``j`` of a later-stage message waits for the piece of each message that feeds it covering the
same fraction of that message's rows (``ceil((j + 1) * K_in / K) - 1``): the forwarder passes
rows on in the order they arrive. Partners on a relay path take the larger of their piece counts,
so a forward's last piece leaves right after the last input piece lands.

Not modelled: the receive buffers' flow control (``num_max_*_chunked_recv_tokens``), which can
only slow a stage down when its consumer is slower. ``MAX_PIECES`` caps ``K`` (a simulation
coarsening: the pipeline's fill and drain are then at most ``1 / MAX_PIECES`` of the longer
stage, measured on DeepEP's benchmark setting in ``tests/sim/test_sim_today.py``).
"""

from __future__ import annotations

import numpy as np

# Buffer.num_sms (20) / 2 SMs per channel
DEEPEP_CHANNELS = 10
# EP size -> ((dispatch nvl_send, dispatch rdma_send), (combine nvl_send, combine rdma_send)) tokens,
# DeepEP's Buffer.get_dispatch_config / get_combine_config
DEEPEP_CHUNKS: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {
    2: ((24, 6), (10, 6)), 4: ((6, 6), (9, 6)), 8: ((6, 6), (4, 6)),
    16: ((16, 20), (2, 28)), 24: ((8, 32), (1, 20)), 32: ((8, 32), (1, 20)), 64: ((20, 28), (1, 20)),
    128: ((20, 32), (1, 12)), 144: ((32, 12), (2, 8)), 160: ((28, 12), (2, 8)),
}
MAX_PIECES = 32


def chunk_tokens(ranks: int, phase: str) -> tuple[int, int]:
    """``(nvl_send, rdma_send)`` chunk tokens of DeepEP's recommended config for ``ranks`` EP
    ranks and ``phase`` (``dispatch`` / ``combine``): the listed EP size nearest below ``ranks``
    (the smallest listed one below it)."""
    sizes = sorted(DEEPEP_CHUNKS)
    ep = max([s for s in sizes if s <= ranks], default=sizes[0])
    return DEEPEP_CHUNKS[ep][0 if phase == "dispatch" else 1]


def piece_counts(rows: np.ndarray, cross: np.ndarray, pre: np.ndarray, post: np.ndarray, nvl_chunk: int,
                 rdma_chunk: int) -> np.ndarray:
    """Pieces per message ``[M]`` of messages with ``rows [M]``, ``cross [M]`` (across nodes),
    related by the stage dependencies ``pre [P] -> post [P]`` (message indices): 1 off a relay
    path, else ``ceil(rows / (channels * chunk))`` raised to its partners' counts, in
    ``[1, MAX_PIECES]``."""
    chunk = np.where(cross, rdma_chunk, nvl_chunk) * DEEPEP_CHANNELS
    own = np.clip(-(-rows // chunk), 1, MAX_PIECES).astype(np.int64)
    on_path = np.zeros(rows.size, bool)
    on_path[pre] = True
    on_path[post] = True
    k = np.where(on_path, own, 1)
    best = k.copy()
    np.maximum.at(best, post, k[pre])
    np.maximum.at(best, pre, k[post])
    return best


def add_pieces(g, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, fixed: np.ndarray, pieces: np.ndarray,
               kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Transfers of ``[M]`` messages cut into ``pieces [M]`` equal pieces each, chained per
    message; the first piece pays ``fixed``. Returns ``(first [M], last [M])`` task ids (a
    message's pieces have consecutive ids)."""
    n = pieces.size
    start = np.cumsum(pieces) - pieces
    msg = np.repeat(np.arange(n), pieces)
    first_piece = np.zeros(msg.size, bool)
    first_piece[start] = True
    ids = g.add_transfer(src[msg], dst[msg], (nbytes / pieces)[msg], np.where(first_piece, fixed[msg], 0.0),
                         kind=kind, label=kind)
    ids = np.atleast_1d(ids)
    g.after(ids[:-1][~first_piece[1:]], ids[1:][~first_piece[1:]])
    return ids[start], ids[start + pieces - 1]


def link_pieces(g, first: np.ndarray, pieces: np.ndarray, pre: np.ndarray, post: np.ndarray) -> None:
    """Piece ``j`` of message ``post[i]`` after the piece of ``pre[i]`` that covers the same
    fraction of its rows (``ceil((j + 1) * K_pre / K_post) - 1``)."""
    kb = pieces[post]
    pair = np.repeat(np.arange(post.size), kb)
    j = np.arange(pair.size) - np.repeat(np.cumsum(kb) - kb, kb)
    ka = pieces[pre][pair]
    need = -(-(j + 1) * ka // kb[pair]) - 1
    g.after(first[pre][pair] + need, first[post][pair] + j)


def send_classes(owner_node: np.ndarray, dst: np.ndarray, gpus_per_node: int, nodes: int) -> np.ndarray:
    """Send class ``[M]`` of dispatch messages carrying rows owned by node ``owner_node [M]`` to
    ``dst [M]``: ``(owner node - dst node) % nodes``. Rows of the destination's own node are
    class 0; rows from another node are ``g - 1`` where ``g`` is their dispatch group at the
    destination's node (``zepp.planner.overlap.grouping.dispatch_group``), so a sender that sends its
    classes in ascending order delivers each receiver's GEMM groups in the order it computes them."""
    return (np.asarray(owner_node, np.int64) - np.asarray(dst, np.int64) // gpus_per_node) % nodes


def order_sends(g, src: np.ndarray, cross: np.ndarray, cls: np.ndarray, first: np.ndarray, last: np.ndarray,
                ranks: int) -> None:
    """In-order sends: per source rank and link kind (NIC ``cross`` or NVLink), the messages of
    send class ``c`` start (their first piece, ``first [M]``) after every message of the largest
    present class below ``c`` has ended (its last piece, ``last [M]``): one zero-time join task
    per (rank, link kind, class) that has a successor."""
    span = int(cls.max(initial=0)) + 1
    key = (np.asarray(src, np.int64) * 2 + cross) * span + cls  # (rank, link, class)
    keys = np.unique(key)
    if keys.size < 2:
        return
    same_lane = (keys[1:] // span) == (keys[:-1] // span)
    pre_keys, post_keys = keys[:-1][same_lane], keys[1:][same_lane]
    if pre_keys.size == 0:
        return
    joins = g.add_fixed(pre_keys // span // 2, np.zeros(pre_keys.size), kind="barrier", stream=None,
                        label="send order")
    joins = np.atleast_1d(joins)
    jpos = np.full(ranks * 2 * span, -1, np.int64)
    jpos[pre_keys] = np.arange(pre_keys.size)
    before = jpos[key] >= 0  # messages of a class that a later class waits for
    g.after(last[before], joins[jpos[key[before]]])
    nxt = np.full(ranks * 2 * span, -1, np.int64)
    nxt[post_keys] = np.arange(post_keys.size)
    after = nxt[key] >= 0
    g.after(joins[nxt[key[after]]], first[after])
