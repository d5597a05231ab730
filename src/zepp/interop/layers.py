"""Every layer's placement for an engine: total redundant experts, physical slot maps.

Engines count redundancy in total: ``P = E + redundant`` physical experts, which must be
divisible by the EP size ``R = nodes * gpus_per_node``; physical expert ``p`` lives on rank
``p // (P / R)`` (SGLang, vLLM and TensorRT-LLM alike, ``../shared/INTEROP.md``). zepp's
:class:`~zepp.planner.types.Placement` ``slot_expert [R, S]`` is one layer's map with ``S = P / R``.

Placements (names from ``zepp.registry.PLACEMENTS``):

- ``zepp``: :func:`place_zepp_slots`, the rules of ``zepp.planner.placement.place_zepp`` (PAPER.md
  2.1) for any ``S`` (``E`` need not be a multiple of ``R``): replica counts by load per
  replica, at most one copy of an expert per node, copies on the nodes that ask for them most,
  snake-dealt to GPUs.
- ``eplb``: DeepSeek EPLB as the engines run it by default (``zepp.planner.placement.rebalance_experts``, on numpy;
  hierarchical when the model's expert groups divide evenly over the nodes, else global).
- ``eplb-distinct``, ``epic``: zepp's variants, where ``E`` is a multiple of ``R``.
- ``home``: only without redundant experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zepp.errors import ZeppInputError
from zepp.model import MoESpec
from zepp.planner.types import Placement

__all__ = ["physical_experts", "place_zepp_slots", "place_layer", "EnginePlacement", "plan_layers", "largest_redundant",
           "check_copies_per_node"]


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
    """Zepp's placement (``zepp.planner.placement.place_zepp``'s rules) with ``slots_per_gpu`` slots per
    GPU; ``hist [N, E]``. ``E`` need not be a multiple of the GPU count. Slots no expert can fill
    without a second copy on one node stay ``-1`` (callers refuse them)."""
    from zepp.planner.placement import zepp_slots

    return zepp_slots(np.asarray(hist, dtype=np.int64), gpus_per_node, slots_per_gpu)


def largest_redundant(num_experts: int, nodes: int, gpus_per_node: int) -> tuple[int, int]:
    """``(most, best)``: the most redundant copies Zepp's rule allows (at most one copy of an expert
    per node on a board, one per GPU on a rack-scale node) and the largest count of at most that
    with ``E + redundant`` divisible by the GPUs (``-1``: none)."""
    from zepp.planner.placement.zepp_placement import copies_per_node

    most = num_experts * (nodes * copies_per_node(gpus_per_node) - 1)
    return most, most - (num_experts + most) % (nodes * gpus_per_node)


def check_copies_per_node(policy: str, num_experts: int, nodes: int, gpus_per_node: int, redundant: int,
                          option: str = "--redundant") -> None:
    """One clear error where Zepp's one-copy-per-node rule cannot fill ``redundant`` extra slots
    (policies placed by ``_place_zepp`` only), naming the largest count that works."""
    if ENGINE_PLACERS.get(policy) is not _place_zepp:
        return
    most, best = largest_redundant(num_experts, nodes, gpus_per_node)
    if redundant <= most:
        return
    fix = f"use {option} {best} or fewer" if best >= 0 else "no redundant count works: use --policy eplb"
    raise ZeppInputError(f"{option} {redundant}: zepp keeps at most one copy of an expert per node (one per GPU on a "
                         f"rack-scale node), so {nodes} node(s) of {gpus_per_node} GPUs hold at most {most} redundant "
                         f"copies of {num_experts} experts; {fix}")


def _place_zepp(policy: str, hist: np.ndarray, spec: MoESpec, nodes: int, gpus_per_node: int,
                num_physical: int) -> Placement:
    """Zepp's rules for any slots per GPU; never two copies of an expert on one node."""
    e = spec.num_experts
    check_copies_per_node(policy, e, nodes, gpus_per_node, num_physical - e)
    pl = place_zepp_slots(hist, gpus_per_node, num_physical // (nodes * gpus_per_node))
    if (pl.slot_expert < 0).any():
        raise ZeppInputError(
            f"--redundant {num_physical - e}: some slots cannot be filled without a second copy of an expert on "
            f"one node; lower --redundant")
    return pl


def _place_eplb(policy: str, hist: np.ndarray, spec: MoESpec, nodes: int, gpus_per_node: int,
                num_physical: int) -> Placement:
    """DeepSeek EPLB on the total load: hierarchical when the expert groups divide over the nodes."""
    from zepp.planner.placement.eplb_placement import rebalance_numpy

    e, ranks = spec.num_experts, nodes * gpus_per_node
    groups = spec.expert_groups
    g, n = (groups, nodes) if groups > 1 and groups % nodes == 0 and e % groups == 0 else (1, 1)
    phy2log, _, _ = rebalance_numpy(hist.sum(axis=0).astype(np.float32)[None, :], num_physical, g, n, ranks)
    return Placement(phy2log[0].reshape(ranks, num_physical // ranks).astype(np.int32), e, gpus_per_node)


def _place_per_gpu(policy: str, hist: np.ndarray, spec: MoESpec, nodes: int, gpus_per_node: int,
                   num_physical: int) -> Placement:
    """The planner's placement ``policy`` (``E`` a multiple of the GPU count, extra slots per GPU)."""
    from zepp.planner.placement import make_placement

    e, ranks = spec.num_experts, nodes * gpus_per_node
    if e % ranks:
        raise ZeppInputError(f"--policy {policy}: needs the expert count ({e}) to be a multiple of the GPU count "
                             f"({ranks}); use --policy zepp or eplb")
    extra = num_physical // ranks - e // ranks
    pl = make_placement(policy, hist, e, ranks, gpus_per_node, extra)
    if pl.slots_per_rank * ranks != num_physical:  # a placement without replicas (its S stays E / R)
        raise ZeppInputError(f"--policy {policy} has no redundant experts: use --redundant 0")
    return pl


# {policy: how it places P slots in total}; the registry's other placements go through _place_per_gpu
ENGINE_PLACERS = {"zepp": _place_zepp, "eplb": _place_eplb}


def place_layer(policy: str, hist: np.ndarray, spec: MoESpec, nodes: int, gpus_per_node: int,
                num_physical: int) -> Placement:
    """One layer's placement with ``num_physical`` slots in total (see the module docstring)."""
    from zepp.registry import PLACEMENTS

    if policy not in PLACEMENTS:
        raise ZeppInputError(f"--policy {policy!r}: unknown placement; choose from {', '.join(PLACEMENTS)}")
    place = ENGINE_PLACERS.get(policy, _place_per_gpu)
    return place(policy, hist, spec, nodes, gpus_per_node, num_physical)


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


def _slot_row(policy: str, hist: np.ndarray, spec: MoESpec, nodes: int, gpus_per_node: int,
              num_physical: int) -> np.ndarray:
    """``[P]`` int64: the logical expert in each physical slot of one layer's placement."""
    return place_layer(policy, hist, spec, nodes, gpus_per_node, num_physical).slot_expert.ravel().astype(np.int64)


def plan_layers(history, spec: MoESpec, nodes: int, gpus_per_node: int, redundant: int, policy: str,
                ) -> tuple[EnginePlacement, list[str]]:
    """Plan every MoE layer of ``spec`` from ``history`` (a :class:`zepp.traces.layer_history.LayerHistory`).

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
        row = _slot_row(policy, hist, spec, nodes, gpus_per_node, p)
        for layer in spec.moe_layers:
            maps[layer] = row
        how.append(why)
        notes = ("one recorded layer: the same placement on every MoE layer",)
    else:
        missing = [l for l in spec.moe_layers if l not in history.layers]
        for i, layer in enumerate(history.layers):
            hist, why = history.node_demand(i, nodes, gpus_per_node)
            maps[layer] = _slot_row(policy, hist, spec, nodes, gpus_per_node, p)
            how.append(why)
        notes = ()
        if missing:
            # MoE layers without any record: the total over recorded layers stands in for them
            total = sum(history.node_demand(i, nodes, gpus_per_node)[0] for i in range(history.num_entries))
            row = _slot_row(policy, total, spec, nodes, gpus_per_node, p)
            for layer in missing:
                maps[layer] = row
            notes = (f"{len(missing)} MoE layer(s) without records get the placement of the summed history",)
    return EnginePlacement(spec, nodes, gpus_per_node, p, maps, policy, notes), how
