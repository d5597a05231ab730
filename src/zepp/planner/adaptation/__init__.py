"""Adaptation: how the placement changes while serving (a stage of its own).

``ADAPTATIONS`` holds one record per choice (``zepp.planner.choices``): ``none``, ``moonep``
(per-batch redundant experts, the ``moonep`` routing's own slots), ``zepp-swap`` and
``zepp-swap-once`` (``swaps``: intra-node swaps when demand drifts, PAPER.md 2.6).
"""

from __future__ import annotations

from dataclasses import dataclass

from zepp.planner.adaptation.swaps import plan_swaps
from zepp.planner.choices import Choice, ChoiceTable

__all__ = ["ADAPTATIONS", "AdaptationChoice"]


@dataclass(frozen=True)
class AdaptationChoice(Choice):
    """An adaptation: ``function`` plans its change (``plan_swaps(placement, slot_load,
    relaxation) -> SwapPlan`` for the swaps). Flags: ``changes_placement`` (the placement a batch
    runs on is not the planned one), ``swaps`` (intra-node swaps from the previous batch's loads),
    ``once`` (only one round, from the first batch; then the placement is kept)."""

    changes_placement: bool = True
    swaps: bool = False
    once: bool = False


ADAPTATIONS: ChoiceTable[AdaptationChoice] = ChoiceTable("adaptation", (
    AdaptationChoice("none", "the placement stays as planned", changes_placement=False),
    AdaptationChoice("moonep", "per-batch redundant experts whose weights are pulled from their home GPU before the "
                               "GEMM"),
    AdaptationChoice("zepp-swap", "intra-node expert swaps planned from the previous batch's loads, weights over "
                                  "NVLink only (PAPER.md 2.6); the simulator keeps a node's swaps where they pay within "
                                  "a batch (gate_swaps), the runtime where the node is out of band", plan_swaps,
                     swaps=True),
    AdaptationChoice("zepp-swap-once", "one round of zepp-swap's swaps: planned from the first batch's loads, then kept",
                     plan_swaps, swaps=True, once=True),
))
