"""Every layer's placement for an engine: total redundant experts, physical slot maps.

Engines count redundancy in total: ``P = E + redundant`` physical experts, which must be
divisible by the EP size ``R = nodes * gpus_per_node``; physical expert ``p`` lives on rank
``p // (P / R)`` (SGLang, vLLM and TensorRT-LLM alike, ``../shared/INTEROP.md``). zepp's
:class:`~zepp.plan.Placement` ``slot_expert [R, S]`` is one layer's map with ``S = P / R``.

Placements (names from ``zepp.registry.PLACEMENTS``):

- ``zepp``: :func:`place_zepp_slots`, the rules of ``zepp.placement.place_zepp`` (PAPER.md
  2.1) for any ``S`` (``E`` need not be a multiple of ``R``): replica counts by load per
  replica, at most one copy of an expert per node, copies on the nodes that ask for them most,
  snake-dealt to GPUs.
- ``eplb``: DeepSeek EPLB as the engines run it by default (``zepp.placement.rebalance_experts``;
  hierarchical when the model's expert groups divide evenly over the nodes, else global).
- ``eplb-distinct``, ``epic``: zepp's variants, where ``E`` is a multiple of ``R``.
- ``home``: only without redundant experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from zepp.errors import ZeppInputError
from zepp.model import MoESpec
from zepp.plan import Placement

__all__ = ["physical_experts", "place_zepp_slots", "place_layer", "EnginePlacement", "plan_layers"]


def physical_experts(num_experts: int, ranks: int, redundant: int) -> int:
    """``P = E + redundant``, checked: divisible by the GPU count, at least ``E``."""
    if isinstance(redundant, bool) or not isinstance(redundant, (int, np.integer)) or redundant < 0:
        raise ZeppInputError(f"--redundant must be an integer >= 0 (extra physical experts in total), got {redundant!r}")
    p = num_experts + int(redundant)
    if p % ranks:
        up = int(redundant) + (-p) % ranks
        down = int(redundant) - p % ranks
        choice = f"--redundant {down} or {up}" if down >= 0 else f"--redundant {up}"
        raise ZeppInputError(
            f"--redundant {redundant}: {num_experts} experts + {redundant} redundant = {p} physical experts, not "
            f"divisible by the {ranks} GPUs (nodes x gpus-per-node); engines put the same number of physical "
            f"experts on every GPU: use {choice}")
    return p


def place_zepp_slots(hist, gpus_per_node: int, slots_per_gpu: int) -> Placement:
    """Zepp's placement (the rules of ``zepp.placement.place_zepp``) with ``slots_per_gpu`` slots
    per GPU; ``hist [N, E]``. ``E`` need not be a multiple of the GPU count. Slots no expert can
    fill without a second copy on one node stay ``-1`` (callers refuse them)."""
    h = np.asarray(hist, dtype=np.int64)
    n_nodes, e_num = h.shape
    L = int(gpus_per_node)
    R = n_nodes * L
    S = int(slots_per_gpu)
    if R * S < e_num:
        raise ZeppInputError(f"{R} GPUs x {S} slots cannot hold {e_num} experts")
    node_slots = L * S
    load = [int(x) for x in h.sum(axis=0)]
    m = math.lcm(*range(1, max(n_nodes, 1) + 1))

    # 1. counts: each spare slot to the largest load / count, never above one copy per node
    import heapq

    counts_plan = [1] * e_num
    heap = [(-(l * m), e) for e, l in enumerate(load)] if n_nodes > 1 else []
    heapq.heapify(heap)
    for _ in range(R * S - e_num):
        if not heap:
            break
        _, e = heapq.heappop(heap)
        counts_plan[e] += 1
        if counts_plan[e] < n_nodes:
            heapq.heappush(heap, (-(load[e] * (m // counts_plan[e])), e))

    share = [load[e] * (m // counts_plan[e]) for e in range(e_num)]
    order = sorted(range(e_num), key=lambda e: (-share[e], e))
    free = [node_slots] * n_nodes
    node_load = [0] * n_nodes
    on_node = np.zeros((n_nodes, e_num), dtype=bool)
    counts = [0] * e_num
    hist_rows = h.T.tolist()

    def best_node(e: int, add: int) -> int | None:
        best, best_key = None, None
        req = hist_rows[e]
        for n in range(n_nodes):
            if free[n] and not on_node[n, e]:
                key = (-req[n], node_load[n], n)
                if best_key is None or key < best_key:
                    best, best_key = n, key
        if best is not None:
            free[best] -= 1
            node_load[best] += add
            on_node[best, e] = True
            counts[e] += 1
        return best

    # 2. nodes: copies in descending share to the node asking most
    for e in order:
        for _ in range(counts_plan[e]):
            if best_node(e, share[e]) is None:
                break
    # 3. leftover slots: highest current share among experts missing from a node with room
    while True:
        free_nodes = np.array([f > 0 for f in free])
        if not free_nodes.any():
            break
        cand = np.flatnonzero((~on_node & free_nodes[:, None]).any(axis=0))
        if cand.size == 0:
            break
        e = min(cand.tolist(), key=lambda x: (-(load[x] * (m // counts[x])), x))
        best_node(e, load[e] * (m // (counts[e] + 1)))
    # 4. GPUs: snake deal in descending final share
    final_share = [load[e] * (m // max(counts[e], 1)) for e in range(e_num)]
    slot_expert = np.full((R, S), -1, dtype=np.int32)
    for n in range(n_nodes):
        experts = sorted(np.flatnonzero(on_node[n]).tolist(), key=lambda x: (-final_share[x], x))
        for i, e in enumerate(experts):
            rnd, pos = divmod(i, L)
            gpu = pos if rnd % 2 == 0 else L - 1 - pos
            slot_expert[n * L + gpu, rnd] = e
    return Placement(slot_expert, e_num, L)


def place_layer(policy: str, hist: np.ndarray, spec: MoESpec, nodes: int, gpus_per_node: int,
                num_physical: int) -> Placement:
    """One layer's placement with ``num_physical`` slots in total (see the module docstring)."""
    from zepp.registry import PLACEMENTS

    if policy not in PLACEMENTS:
        raise ZeppInputError(f"--policy {policy!r}: unknown placement; choose from {', '.join(PLACEMENTS)}")
    e = spec.num_experts
    ranks = nodes * gpus_per_node
    s = num_physical // ranks
    if policy == "zepp":
        if num_physical > e * nodes:
            raise ZeppInputError(
                f"--redundant {num_physical - e}: zepp keeps at most one copy of an expert per node, so {nodes} "
                f"nodes hold at most {e * nodes} physical experts ({e * (nodes - 1)} redundant); lower --redundant")
        pl = place_zepp_slots(hist, gpus_per_node, s)
        if (pl.slot_expert < 0).any():
            raise ZeppInputError(
                f"--redundant {num_physical - e}: some slots cannot be filled without a second copy of an expert on "
                f"one node; lower --redundant")
        return pl
    if policy == "eplb":
        import torch

        from zepp.placement import rebalance_experts

        groups = spec.expert_groups
        g, n = (groups, nodes) if groups > 1 and groups % nodes == 0 and e % groups == 0 else (1, 1)
        w = torch.from_numpy(hist.sum(axis=0).astype(np.float32))[None, :]
        phy2log, _, _ = rebalance_experts(w, num_physical, g, n, ranks)
        return Placement(phy2log[0].numpy().reshape(ranks, s).astype(np.int32), e, gpus_per_node)
    from zepp.placement import make_placement

    if e % ranks:
        raise ZeppInputError(f"--policy {policy}: needs the expert count ({e}) to be a multiple of the GPU count "
                             f"({ranks}); use --policy zepp or eplb")
    extra = s - e // ranks
    if policy == "home" and extra:
        raise ZeppInputError("--policy home has no redundant experts: use --redundant 0")
    return make_placement(policy, hist, e, ranks, gpus_per_node, extra)


@dataclass(frozen=True)
class EnginePlacement:
    """Every MoE layer's physical map for one engine deployment.

    ``maps``: model layer index -> ``[P]`` int64 logical expert per physical slot (MoE layers
    only; dense layers get SGLang's trivial row ``arange(P) % E`` where a format needs them).
    """

    model: MoESpec
    nodes: int
    gpus_per_node: int
    num_physical: int
    maps: dict[int, np.ndarray]
    policy: str = "zepp"
    notes: tuple[str, ...] = field(default=())

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def slots_per_gpu(self) -> int:
        return self.num_physical // self.ranks

    @property
    def redundant(self) -> int:
        return self.num_physical - self.model.num_experts

    def placement(self, layer: int) -> Placement:
        return Placement(self.maps[layer].reshape(self.ranks, -1).astype(np.int32), self.model.num_experts,
                         self.gpus_per_node)

    def full_map(self) -> np.ndarray:
        """``[num_layers, P]``: MoE rows from ``maps``, dense rows trivial."""
        out = np.tile(np.arange(self.num_physical, dtype=np.int64) % self.model.num_experts,
                      (self.model.num_layers, 1))
        for layer, row in self.maps.items():
            out[layer] = row
        return out

    def same_as(self, other: "EnginePlacement") -> bool:
        return (self.num_physical == other.num_physical and sorted(self.maps) == sorted(other.maps)
                and all(np.array_equal(self.maps[k], other.maps[k]) for k in self.maps))


def plan_layers(history, spec: MoESpec, nodes: int, gpus_per_node: int, redundant: int, policy: str,
                ) -> tuple[EnginePlacement, list[str]]:
    """Plan every MoE layer of ``spec`` from ``history`` (a :class:`zepp.history.LayerHistory`).

    Returns the placement and, per planned layer, how its node demand was obtained. A history
    of one layer (``layers is None``) gives every MoE layer the same placement."""
    if history.num_experts != spec.num_experts:
        raise ZeppInputError(f"{history.source}: {history.num_experts} experts, model {spec.name!r} has "
                             f"{spec.num_experts}; pass the right --model")
    ranks = nodes * gpus_per_node
    p = physical_experts(spec.num_experts, ranks, redundant)
    maps: dict[int, np.ndarray] = {}
    how: list[str] = []
    if history.layers is None:
        hist, why = history.node_demand(0, nodes, gpus_per_node)
        row = place_layer(policy, hist, spec, nodes, gpus_per_node, p).slot_expert.ravel().astype(np.int64)
        for layer in spec.moe_layers:
            maps[layer] = row
        how.append(why)
        notes = ("one recorded layer: the same placement on every MoE layer",)
    else:
        missing = [l for l in spec.moe_layers if l not in history.layers]
        for i, layer in enumerate(history.layers):
            hist, why = history.node_demand(i, nodes, gpus_per_node)
            maps[layer] = place_layer(policy, hist, spec, nodes, gpus_per_node, p).slot_expert.ravel().astype(np.int64)
            how.append(why)
        notes = ()
        if missing:
            # MoE layers without any record: the total over recorded layers stands in for them
            total = sum(history.node_demand(i, nodes, gpus_per_node)[0] for i in range(history.num_entries))
            row = place_layer(policy, total, spec, nodes, gpus_per_node, p).slot_expert.ravel().astype(np.int64)
            for layer in missing:
                maps[layer] = row
            notes = (f"{len(missing)} MoE layer(s) without records get the placement of the summed history",)
    return EnginePlacement(spec, nodes, gpus_per_node, p, maps, policy, notes), how
