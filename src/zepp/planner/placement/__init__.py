"""Expert placement: which logical expert each slot holds, computed once from history.

Every placement returns a ``Placement`` (``slot_expert [R, S]``, see ``zepp.planner.types``) built
from a per-node demand histogram ``hist [N, E]`` (entries node ``n`` asked of expert ``e`` in
a past window). Ranks are node-major (node = rank // L). ``S = E/R + extra`` slots per rank
for the replicating placements, ``S = E/R`` for ``home``.

One module per placement (``<name>_placement.py``; checks and exact arithmetic shared in
``base_placement``); ``PLACEMENTS`` below holds one record per choice (``zepp.planner.choices``: function, one-line
meaning, flags; the registry's and ``zepp systems``' table) and ``make_placement`` builds one by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from zepp.errors import ZeppInputError
from zepp.planner.choices import Choice, ChoiceTable
from zepp.planner.placement.base_placement import check_extra, check_hist, check_layout
from zepp.planner.placement.eplb_placement import (build_eplb, build_eplb_distinct, place_eplb, place_eplb_distinct,
                                                   rebalance_experts)
from zepp.planner.placement.epic_placement import build_epic, place_epic
from zepp.planner.placement.home_placement import build_home, place_home
from zepp.planner.placement.zepp_placement import build_zepp, place_zepp, zepp_slots
from zepp.planner.types import Placement

__all__ = ["PLACEMENTS", "PlacementChoice", "make_placement", "place_home", "place_zepp", "zepp_slots", "rebalance_experts",
           "place_eplb", "place_eplb_distinct", "place_epic"]


@dataclass(frozen=True)
class PlacementChoice(Choice):
    """A placement: ``function(hist [N, E] int64 | None, num_experts, ranks, gpus_per_node, extra)
    -> Placement`` (arguments checked by ``make_placement``). ``needs_history``: it reads the
    history histogram."""

    needs_history: bool = True


PLACEMENTS: ChoiceTable[PlacementChoice] = ChoiceTable("placement", (
    PlacementChoice("home", "expert e on GPU e // (E/R); no replicas", build_home, needs_history=False),
    PlacementChoice("zepp", "replicas from node demand, at most one per node, snake-dealt to GPUs (PAPER.md 2.1)",
                    build_zepp),
    PlacementChoice("eplb", "DeepSeek EPLB, global policy, E/R + extra slots per GPU (two replicas may share a GPU)",
                    build_eplb),
    PlacementChoice("eplb-distinct", "EPLB's counts and packing, never two replicas of one expert on one GPU",
                    build_eplb_distinct),
    PlacementChoice("epic", "EPIC's greedy placement: redundancy, GPU packing, then NIC-balancing node positions",
                    build_epic),
))


def make_placement(name: str, hist, num_experts: int, ranks: int, gpus_per_node: int, extra: int = 2) -> Placement:
    """Build placement ``name`` (a key of ``PLACEMENTS``).

    ``hist [N, E]`` non-negative int history histogram with ``N * gpus_per_node == ranks`` and
    ``E == num_experts`` (``home`` ignores it; ``None`` is accepted there). ``E`` must be a
    multiple of ``ranks``; ``extra >= 0`` redundant slots per GPU (not used by ``home``).
    """
    choice = PLACEMENTS.choice(name)
    check_layout(num_experts, ranks, gpus_per_node)
    extra = check_extra(extra)
    if hist is None and choice.needs_history:
        raise ZeppInputError(f"placement {name!r} needs a history histogram hist [nodes, experts]; got None")
    h = None if hist is None else check_hist(hist, gpus_per_node, ranks=ranks, num_experts=num_experts)
    return choice.function(h, num_experts, ranks, gpus_per_node, extra)
