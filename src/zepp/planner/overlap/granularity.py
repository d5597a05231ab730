"""How many dispatch groups and combine waves a batch runs: a planner decision, like routing.

Zepp's overlap (PAPER.md 2.5) runs GEMM 1 per *dispatch group* (own GPU, own node, each remote
node in arrival order) and GEMM 2 per *combine wave* (one per destination node, ring order, own
node last; ``zepp.planner.overlap.grouping``). Every extra group or wave re-reads the weights of every expert it
touches: at tens of rows per expert a GEMM is weight-read bound, and ``2N + 1`` GEMMs cost up to
``2N + 1`` weight reads where one GEMM per phase pays 2. ``choose`` weighs those re-reads against
the communication each split hides, per batch, from the cost model below, and returns a
``Granularity``: ``groups`` coarse dispatch groups (``1 .. N + 1``) and ``waves`` coarse combine
waves (``1 .. N``). Both executors read it (``zepp.sim.layer.build_layer`` through
``LayerWork.granularity``, ``zepp.runtime.program.compile_rank``), so "group 1" means the same rows
in both.

Candidates (adjacent fine groups / waves merged, order kept; ``Granularity.group_map`` /
``wave_map``):

- dispatch: ``groups = N + 1`` is the fine partition (own GPU, own node, remote node 1 .. N-1
  behind in ring order); ``groups <= N`` first merges own GPU and own node into one local group,
  then splits the ``N - 1`` remote groups into ``groups - 1`` contiguous blocks of near-equal
  size; ``groups = 1`` is one GEMM after the whole dispatch.
- combine: ``waves = N`` is one wave per destination node; ``waves < N`` keeps the own node's
  wave last and splits the ``N - 1`` remote waves into ``waves - 1`` contiguous blocks;
  ``waves = 1`` is one GEMM 2 and one combine.

Cost model (``predict``; seconds; every rank evaluates it on the same FlowPlan with the same
cluster figures, so the choice is identical on every rank; numpy over the plan's volumes (rows per
stage, source, destination and owner node: ``FlowPlan.volumes``), ranks and groups,
loops over the candidates and their groups only; ``candidates``: every count up to 4 nodes, a
handful beyond):

- arrival of a fine dispatch group at its computing rank: own tokens at 0; own-node rows after
  one NVLink message; a remote node's rows when its NIC flows complete, each NIC flow at the
  later of its completion under fair sharing of the receiving NIC (flows into one rank,
  keyed by source node) and of the sending NIC (flows out of one rank, keyed by destination), plus one NIC
  message cost, plus one NVLink message and the NVLink bytes when the transport forwards
  inside the node (the busiest GPU of the receiving node sets the node's arrival);
- one GEMM of ``rows`` rows over ``active`` distinct experts: ``max(rows * 2 H F / (peak *
  eff(rows / active)), active * H F * dtype / HBM) + launch`` (the simulator's rule); a rank runs
  its GEMM-1 groups in order, each after its arrival, then its GEMM-2 waves back to back;
- combine: a rank's NIC sends of a wave leave after that wave's GEMM 2 (for rows forwarded
  from a node's gateway: the slowest GPU of the node, plus an NVLink message) and after the
  rank's earlier waves' sends (one NIC, first in first out), each wave paying one NIC message
  cost; the layer ends at the last send or the last GEMM, whichever is later, on any rank.

``Figures.overlap`` (default 1) is the fraction of transfer time a rank can compute through;
below 1 (an executor whose transfers take the same CPU cores as its GEMMs, as the emulated
cluster's gloo ranks) the cost blends toward the serial sum ``last arrival + all GEMMs + all
sends``.

Ties (within ``TIE`` relative) go to fewer groups, then fewer waves: a split must buy time
the model can see.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.planner.overlap.grouping import combine_wave, dispatch_group

TIE = 1e-3  # relative cost difference below which the coarser candidate wins


@dataclass(frozen=True)
class Granularity:
    """``groups`` coarse dispatch groups (``1 .. nodes + 1``) and ``waves`` coarse combine waves
    (``1 .. nodes``) of a cluster of ``nodes`` nodes; ``predicted`` the cost model's layer
    seconds for this choice (0.0 for a fixed choice)."""

    nodes: int
    groups: int
    waves: int
    predicted: float = 0.0

    def __post_init__(self) -> None:
        if not (1 <= self.groups <= self.nodes + 1 and 1 <= self.waves <= self.nodes):
            raise ValueError(f"granularity ({self.groups} groups, {self.waves} waves) out of range for "
                             f"{self.nodes} nodes")

    @classmethod
    def per_node(cls, nodes: int) -> "Granularity":
        """The fixed fine choice (today's ``zepp-overlap``): one group per source, one wave per node."""
        return cls(nodes, nodes + 1, nodes)

    @classmethod
    def single(cls, nodes: int) -> "Granularity":
        """One GEMM per phase (``zepp-sync``'s compute)."""
        return cls(nodes, 1, 1)

    @property
    def is_per_node(self) -> bool:
        return self.groups == self.nodes + 1 and self.waves == self.nodes

    def group_map(self) -> np.ndarray:
        """``[N + 1]`` coarse group of each fine dispatch group (``zepp.planner.overlap.grouping.dispatch_group``)."""
        return group_map(self.groups, self.nodes)

    def wave_map(self) -> np.ndarray:
        """``[N]`` coarse wave of each fine combine wave (``zepp.planner.overlap.grouping.combine_wave``)."""
        return wave_map(self.waves, self.nodes)

    def label(self) -> str:
        return f"{self.groups}g/{self.waves}w"


def group_map(groups: int, nodes: int) -> np.ndarray:
    """``[N + 1]`` coarse dispatch group of fine groups ``0 .. N`` (see the module notes)."""
    N = nodes
    f = np.arange(N + 1, dtype=np.int64)
    if groups == N + 1:
        return f
    if groups == 1:
        return np.zeros(N + 1, np.int64)
    u = np.maximum(f - 1, 0)  # own GPU and own node: unit 0; remote node d: unit d
    return np.where(u == 0, 0, 1 + ((u - 1) * (groups - 1)) // (N - 1))


def wave_map(waves: int, nodes: int) -> np.ndarray:
    """``[N]`` coarse combine wave of fine waves ``0 .. N-1`` (own node's wave ``N-1`` last)."""
    N = nodes
    f = np.arange(N, dtype=np.int64)
    if waves == N:
        return f
    if waves == 1:
        return np.zeros(N, np.int64)
    return np.where(f == N - 1, waves - 1, (f * (waves - 1)) // (N - 1))


def _onehot(m: np.ndarray) -> np.ndarray:
    """``[F, C]`` float membership of fine index ``f`` in coarse ``m[f]``."""
    out = np.zeros((m.size, int(m.max()) + 1))
    out[np.arange(m.size), m] = 1.0
    return out


def _fair_share_completion(b: np.ndarray) -> np.ndarray:
    """Completion times (in bytes at unit rate) of flows ``b [R, F]`` sharing one link per row
    fairly, all started at once: the i-th smallest ends at ``sum_{j<i} b_j + (F - i) b_i``."""
    order = np.argsort(b, axis=1, kind="stable")
    s = np.take_along_axis(b, order, axis=1)
    F = b.shape[1]
    before = np.cumsum(s, axis=1) - s
    done_sorted = before + (F - np.arange(F))[None, :] * s
    out = np.empty_like(b)
    np.put_along_axis(out, order, done_sorted, axis=1)
    return out


def _entries(routing):
    """``(owner, comp, local slot)`` ``[n]`` of every present entry of a ``Routing``."""
    R, T, k = routing.topk_ids.shape
    S = routing.placement.slots_per_rank
    slot = routing.slot.ravel().astype(np.int64)
    idx = np.flatnonzero(slot >= 0)
    slot = slot[idx]
    return idx // (T * k), slot // S, slot % S


@dataclass(frozen=True)
class Figures:
    """The cost model's hardware figures (bytes/s, FLOP/s, seconds). ``of(cluster)`` takes them
    from a ``zepp.cluster.Cluster``; the simulator passes its calibrated NIC rate and put cost."""

    nic_bw: float
    nvlink_bw: float
    nic_msg: float
    nvlink_msg: float
    peak_flops: float
    hbm_bw: float
    launch: float
    eff_max: float
    rows_half: float
    overlap: float = 1.0  # fraction of transfer time a rank can compute through (1: GPUs, NICs apart)
    weight_eff: float = 1.0  # fraction of hbm_bw a grouped GEMM streams its weights at
    split_share: float = 1.0  # fraction of the GPU a GEMM gets in a phase of several (communication beside it)

    @classmethod
    def of(cls, cluster, nic_bw: float | None = None, nic_msg: float | None = None, overlap: float = 1.0,
           split_share: float = 1.0) -> "Figures":
        return cls(nic_bw=cluster.nic_bw if nic_bw is None else nic_bw, nvlink_bw=cluster.nvlink_bw,
                   nic_msg=cluster.nic_msg_cost if nic_msg is None else nic_msg, nvlink_msg=cluster.nvlink_msg_cost,
                   peak_flops=cluster.peak_flops, hbm_bw=cluster.hbm_bw, launch=cluster.kernel_launch,
                   eff_max=cluster.gemm_eff_max, rows_half=cluster.gemm_rows_half, overlap=overlap,
                   weight_eff=cluster.weight_read_eff, split_share=split_share)

    def gemm(self, rows: np.ndarray, active: np.ndarray, hidden: int, ffn: int, dtype_bytes: int,
             split: bool = False) -> np.ndarray:
        """Seconds of one grouped GEMM (``H -> F`` or ``F -> H``) per cell of ``rows`` / ``active``
        (same shape); 0 where ``rows == 0``. ``split``: one of several GEMMs of its phase, which
        run beside the phase's communication kernels (``split_share`` of the GPU)."""
        rows = np.asarray(rows, float)
        act = np.maximum(np.asarray(active, float), 1.0)
        eff = self.eff_max * (rows / act) / (rows / act + self.rows_half) * (self.split_share if split else 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            flops_t = np.where(rows > 0, rows * 2.0 * hidden * ffn / (self.peak_flops * np.maximum(eff, 1e-30)), 0.0)
        t = np.maximum(flops_t, act * hidden * ffn * dtype_bytes / (self.hbm_bw * self.weight_eff)) + self.launch
        return np.where(rows > 0, t, 0.0)


def candidates(nodes: int) -> tuple[list[int], list[int]]:
    """The candidate group and wave counts of a cluster of ``nodes`` nodes: every count up to 4
    nodes; beyond, one and the per-node extremes plus ``2^i + 1`` in between (a handful)."""
    N = nodes
    steps = {1, 2, 3} | {2**i + 1 for i in range(2, max(N, 2).bit_length() + 1)}
    groups = sorted({g for g in steps if g <= N + 1} | {N, N + 1} | (set(range(1, N + 2)) if N <= 4 else set()))
    waves = sorted({w for w in steps if w <= N} | {N} | (set(range(1, N + 1)) if N <= 4 else set()))
    return groups, waves


def predict(plan, spec, fig: Figures) -> tuple[list[int], list[int], np.ndarray]:
    """Modelled layer seconds of every candidate for ``plan`` (a ``FlowPlan``) of model
    ``spec``: ``(groups [a], waves [b], cost [a, b])`` (see the module notes and ``candidates``)."""
    model = _LayerModel(plan, spec, fig)
    groups, waves = candidates(model.N)
    e1, c1 = model.gemm1_ends(groups)
    cost = np.zeros((len(groups), len(waves)))
    for wi, w in enumerate(waves):
        cost[:, wi] = model.layer_end(w, e1, c1)
    return groups, waves, cost


class _LayerModel:
    """``predict``'s figures of one FlowPlan, per rank: entries per fine dispatch group
    (``rows1 [R, F]``, ``F = N + 1``) and combine wave (``rows2 [R, N]``) with the local slots
    they touch (``pres1 [R, F, S]``, ``pres2 [R, N, S]``), arrival of each fine group ``A [R, F]``
    and combine NIC bytes per wave ``cbytes [R, N]`` (``direct_w`` / ``gate_w [R, N]``: whether a
    wave sends from its computing rank / from a gateway after the node's slowest GPU)."""

    def __init__(self, plan, spec, fig: Figures):
        p = plan.routing.placement
        R, L, S = p.ranks, plan.gpus_per_node, p.slots_per_rank
        self.R, self.L, self.N = R, L, R // L
        self.F = self.N + 1
        self.fig = fig
        self.rb = float(plan.row_bytes)
        self.ranks = np.arange(R)
        self.node_of = self.ranks // L
        self.cross_pair = self.node_of[:, None] != self.node_of[None, :]  # [dst, src]
        self._count_entries(plan.routing, S)
        self.gemm = lambda rows, act, split: fig.gemm(rows, act, spec.hidden, spec.ffn, spec.dtype_bytes,  # noqa: E731
                                                      split)
        self.A = self._arrivals(plan.volumes.dispatch)
        self._combine_sends(plan.volumes.combine)

    def _count_entries(self, routing, S: int) -> None:
        """``rows1``, ``pres1``, ``rows2``, ``pres2``: one pass over the entries."""
        R, L, N, F, ranks = self.R, self.L, self.N, self.F, self.ranks
        owner, comp, ls = _entries(routing)
        cnt = np.bincount((comp * R + owner) * S + ls, minlength=R * R * S).reshape(R, R, S)  # [comp, owner, slot]
        fg_pair = dispatch_group(ranks[None, :], ranks[:, None], L, N)  # [comp, owner] fine group
        fw_pair = combine_wave(ranks[None, :], ranks[:, None], L, N)
        G1 = np.zeros((R, R, F))
        G1[ranks[:, None], ranks[None, :], fg_pair] = 1.0  # [comp, owner, fine group]
        W1 = np.zeros((R, R, N))
        W1[ranks[:, None], ranks[None, :], fw_pair] = 1.0
        self.rows1 = np.einsum("cos,cof->cf", cnt, G1)
        self.pres1 = (np.einsum("cos,cof->cfs", cnt, G1) > 0).astype(float)  # [R, F, S]
        self.rows2 = np.einsum("cos,cow->cw", cnt, W1)
        self.pres2 = (np.einsum("cos,cow->cws", cnt, W1) > 0).astype(float)  # [R, N, S]

    def _arrivals(self, d) -> np.ndarray:
        """``A [R, F]``: arrival of each fine dispatch group at each rank; rows by (dst, src, owner
        node), from the dispatch's volumes ``d``."""
        R, L, N, F, ranks, fig, rb = self.R, self.L, self.N, self.F, self.ranks, self.fig, self.rb
        cross_pair = self.cross_pair
        dn = np.arange(N)
        key = (d.dst.astype(np.int64) * R + d.src) * N + d.owner_node
        hk = np.bincount(key, weights=d.rows, minlength=R * R * N).astype(np.int64).reshape(R, R, N)
        stage_gt0 = np.bincount(key, weights=d.rows * (d.stage > 0), minlength=R * R * N).reshape(R, R, N)
        g_of = np.where(dn[None, :] == self.node_of[:, None], 1, 1 + (dn[None, :] - self.node_of[:, None]) % N)
        A = np.zeros((R, F))
        xk = np.where(cross_pair[:, :, None], hk, 0) * rb  # [dst, src, owner node] bytes over the NIC
        if xk.any():
            A = self._nic_arrivals(xk, g_of)
        fwd = np.where(~cross_pair[:, :, None], stage_gt0, 0).sum(axis=1) * rb  # [dst, owner node] NVLink fan-out
        if fwd.any():  # rows that crossed to a gateway, then NVLink to their computing rank
            fb = np.zeros((R, F))
            np.add.at(fb, (ranks[:, None].repeat(N, 1), g_of), fwd)
            A[:, 2:] += np.where(fb[:, 2:] > 0, fig.nvlink_msg + fb[:, 2:] / fig.nvlink_bw, 0.0)
        own_nv = (np.where(~cross_pair[:, :, None], hk - stage_gt0, 0).sum(axis=(1, 2))) * rb
        A[:, 0] = 0.0
        A[:, 1] = np.where(own_nv > 0, fig.nvlink_msg + own_nv / fig.nvlink_bw, 0.0)
        return np.where(self.rows1 > 0, A, 0.0)

    def _nic_arrivals(self, xk: np.ndarray, g_of: np.ndarray) -> np.ndarray:
        """``[R, F]`` arrival of the NIC flows ``xk [dst, src, owner node]`` (bytes; ``g_of [dst,
        owner node]`` their fine group): each flow at the later of its fair-share completion at the
        receiving and at the sending NIC, the node's slowest gateway, plus one NIC message."""
        R, L, N, F, ranks, fig = self.R, self.L, self.N, self.F, self.ranks, self.fig
        recv = np.zeros((R, F))
        np.add.at(recv, (ranks[:, None].repeat(N, 1), g_of), xk.sum(axis=1))  # [dst, group]
        send = xk.sum(axis=2).T  # [src, dst]
        t_recv = _fair_share_completion(recv) / fig.nic_bw
        t_send = _fair_share_completion(send) / fig.nic_bw
        # per (dst, owner node): its slowest sender, then per (dst, group)
        t_src = np.where(xk > 0, t_send.T[:, :, None], 0.0).max(axis=1)  # [dst, owner node]
        t_src_g = np.zeros((R, F))
        np.maximum.at(t_src_g, (ranks[:, None].repeat(N, 1), g_of), t_src)
        arr = np.where(recv > 0, np.maximum(t_recv, t_src_g), 0.0)
        node_arr = arr.reshape(N, L, F).max(axis=1) + fig.nic_msg  # [N, F]: the node's slowest gateway
        return np.repeat(node_arr, L, axis=0)

    def _combine_sends(self, c) -> None:
        """``cbytes``, ``direct_w``, ``gate_w``: combine NIC bytes per (sending rank, fine wave) and
        whether they leave from the computing rank or a gateway, from the combine's volumes ``c``."""
        R, L, N, ranks, rb = self.R, self.L, self.N, self.ranks, self.rb
        dn = np.arange(N)
        ck = (c.src.astype(np.int64) * R + c.dst) * N + c.owner_node
        ch = np.bincount(ck, weights=c.rows, minlength=R * R * N).astype(np.int64).reshape(R, R, N)  # [src, dst, owner node]
        cg = np.bincount(ck, weights=c.rows * (c.stage > 0), minlength=R * R * N).reshape(R, R, N)
        w_of = (dn[None, :] - self.node_of[:, None] - 1) % N  # [src, owner node] fine wave
        per_src = np.where(self.cross_pair[:, :, None], ch, 0).sum(axis=1)  # [src, owner node]
        gate_src = np.where(self.cross_pair[:, :, None], cg, 0).sum(axis=1)
        cbytes = np.zeros((R, N))
        np.add.at(cbytes, (ranks[:, None].repeat(N, 1), w_of), per_src * rb)
        gate_w = np.zeros((R, N))
        np.add.at(gate_w, (ranks[:, None].repeat(N, 1), w_of), gate_src)
        self.cbytes = cbytes
        self.direct_w = ((cbytes / rb - gate_w) > 0).astype(float)
        self.gate_w = (gate_w > 0).astype(float)

    def gemm1_ends(self, groups: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per (candidate group count, rank): the end of GEMM 1, run per coarse group in order,
        each after its arrival, ``e1 [a, R]``; and the GEMM 1 seconds ``c1 [a, R]`` (serial bound)."""
        R, N, A = self.R, self.N, self.A
        e1 = np.zeros((len(groups), R))
        c1 = np.zeros((len(groups), R))
        for gi, g in enumerate(groups):
            M = _onehot(group_map(g, N))  # [F, C]
            Rc = self.rows1 @ M
            Ac = (np.einsum("rfs,fc->rcs", self.pres1, M) > 0).sum(axis=2)
            Tc = (A[:, :, None] * M[None]).max(axis=1)
            d1 = self.gemm(Rc, Ac, M.shape[1] > 1)
            c1[gi] = d1.sum(axis=1)
            t = np.zeros(R)
            for ci in range(M.shape[1]):
                t = np.where(Rc[:, ci] > 0, np.maximum(t, Tc[:, ci]) + d1[:, ci], t)
            e1[gi] = np.maximum(t, A.max(axis=1))  # GEMM 2 needs all rows of GEMM 1 (GELU)
        return e1, c1

    def layer_end(self, waves: int, e1: np.ndarray, c1: np.ndarray) -> np.ndarray:
        """``[a]`` layer seconds of ``waves`` combine waves after each candidate's GEMM 1 ends ``e1``."""
        R, L, N, fig = self.R, self.L, self.N, self.fig
        a = e1.shape[0]
        M2 = _onehot(wave_map(waves, N))  # [N, W]
        Aw = (np.einsum("rfs,fw->rws", self.pres2, M2) > 0).sum(axis=2)
        d2 = self.gemm(self.rows2 @ M2, Aw, M2.shape[1] > 1)
        f2 = e1[:, :, None] + np.cumsum(d2, axis=1)[None]  # [G, R, W] end of each GEMM 2
        node_f2 = np.repeat(f2.reshape(a, N, L, -1).max(axis=2), L, axis=1) + fig.nvlink_msg
        Bw = self.cbytes @ M2
        ready = np.maximum(np.where((self.direct_w @ M2) > 0, f2, 0.0), np.where((self.gate_w @ M2) > 0, node_f2, 0.0))
        s_end = np.zeros((a, R))
        for k in range(M2.shape[1]):  # one NIC per rank: a wave's sends after its GEMM and the earlier sends
            s_end = np.where(Bw[:, k] > 0, np.maximum(s_end, ready[:, :, k] + fig.nic_msg) + Bw[:, k] / fig.nic_bw,
                             s_end)
        pipelined = np.maximum(s_end, f2[:, :, -1]).max(axis=1)
        if fig.overlap < 1.0:  # transfers and GEMMs of a rank share its cores: partly one after the other
            sends = (Bw / fig.nic_bw + (Bw > 0) * fig.nic_msg).sum(axis=1)
            serial = (self.A.max(axis=1)[None] + c1 + d2.sum(axis=1)[None] + sends[None]).max(axis=1)
            pipelined = fig.overlap * pipelined + (1.0 - fig.overlap) * np.maximum(serial, pipelined)
        return pipelined


def choose(plan, spec, fig: Figures) -> Granularity:
    """The granularity of ``plan`` (a ``FlowPlan``): the cheapest candidate of ``predict``, ties
    (within ``TIE``) to fewer groups, then fewer waves. Deterministic: every rank that holds the
    same plan and figures gets the same record."""
    N = plan.routing.placement.ranks // plan.gpus_per_node
    groups, waves, cost = predict(plan, spec, fig)
    best = float(cost.min())
    gi, wi = np.argwhere(cost <= best * (1.0 + TIE))[0]  # row-major: fewest groups, then fewest waves
    return Granularity(N, groups[gi], waves[wi], predicted=float(cost[gi, wi]))


MAX_COLUMN_SPLITS = 4  # GEMM 2 column splits of a low-latency combine (zepp.sim.mechanics deepep-ll-cols)


def column_splits(tokens_per_rank: int, top_k: int, row_bytes: float, nodes: int, gpus_per_node: int,
                  fig: Figures) -> int:
    """How many column splits GEMM 2 runs in when each split sends its slice of the partials at
    once (``zepp-deepep-table-cols``): ``s`` splits cost ``s - 1`` extra launches and leave about
    ``1 / s`` of the combine after the last one, so the best ``s`` is ``sqrt(combine / launch)``,
    rounded, in ``1 .. MAX_COLUMN_SPLITS``. The combine's time is predicted from the batch shape
    alone (``T * k`` rows, the remote share ``(N - 1) / N`` on the NIC and the rest on the GPU's
    NVLink peers), so every rank computes the same choice before it routes."""
    rows_bytes = float(tokens_per_rank) * top_k * row_bytes
    remote = rows_bytes * (nodes - 1) / nodes
    local = rows_bytes - remote
    combine = max(remote / fig.nic_bw, local / (fig.nvlink_bw * max(gpus_per_node - 1, 1)))
    return int(min(MAX_COLUMN_SPLITS, max(1, round((combine / fig.launch) ** 0.5))))
