"""Overlap: how a layer's computation overlaps its communication (a stage of its own).

``OVERLAPS`` holds one record per choice (``zepp.planner.choices``): ``none`` (dispatch, both
GEMMs and combine one after another), ``comet`` (COMET's fused tile-level kernels, modelled by
the simulator's plug-ins), ``zepp`` (``grouping``: dispatch groups computed on arrival, combine
waves per destination node) and ``zepp-auto`` (``granularity``: those groups and waves merged to
the counts a cost model chooses per batch). ``OVERLAP_COMMS`` names how an executor posts an
overlapped layer's transfers (asynchronous collectives or point-to-point chunks).

- ``grouping``: dispatch groups, arrival stages, combine waves and messages, for both executors;
- ``granularity``: ``zepp-auto``'s per-batch choice, its cost model, GEMM 2 column splits.
"""

from __future__ import annotations

from dataclasses import dataclass

from zepp.planner.choices import Choice, ChoiceTable
from zepp.planner.overlap.granularity import choose

__all__ = ["OVERLAPS", "OverlapChoice", "OVERLAP_COMMS", "OverlapComm"]


@dataclass(frozen=True)
class OverlapChoice(Choice):
    """An overlap: ``function(plan, spec, figures) -> Granularity`` where the groups and waves are
    chosen per batch (``None`` otherwise). Flags: ``overlaps`` (some transfer runs beside a GEMM),
    ``grouped`` (Zepp's dispatch groups and combine waves, run by both executors), ``per_batch``
    (their counts chosen per batch by ``granularity.choose``), ``fused`` (fused tile-level
    kernels: only the simulator's plug-ins model them)."""

    overlaps: bool = False
    grouped: bool = False
    per_batch: bool = False
    fused: bool = False

    def chosen_per_batch(self, on_cpu: bool, comm: "OverlapComm") -> bool:
        """Whether an executor chooses this overlap's groups and waves per batch: always where
        ``per_batch``; for fixed groups too when they run as collectives on CPU tensors, where no
        separate compute engine runs beside the transfers and the cost model (overlap 0) picks
        one dispatch group and one combine wave unless overlapping pays."""
        return self.per_batch or (self.grouped and comm.collective and on_cpu)


@dataclass(frozen=True)
class OverlapComm(Choice):
    """How an executor posts an overlapped layer's transfers. ``collective``: one asynchronous
    all-to-all per stage or wave (else batched point-to-point chunks)."""

    collective: bool = True


OVERLAPS: ChoiceTable[OverlapChoice] = ChoiceTable("overlap", (
    OverlapChoice("none", "dispatch, both GEMMs and combine run one after another"),
    OverlapChoice("comet", "COMET: fused tile-level overlap of dispatch with GEMM 1 and GEMM 2 with combine",
                  overlaps=True, fused=True),
    OverlapChoice("zepp", "dispatch groups (compute on arrival) and combine waves per destination node (PAPER.md 2.5)",
                  overlaps=True, grouped=True),
    OverlapChoice("zepp-auto", "zepp's groups and waves, adjacent ones merged to a count the planner chooses per batch "
                               "(zepp.planner.overlap.granularity)", choose, overlaps=True, grouped=True,
                  per_batch=True),
))

OVERLAP_COMMS: ChoiceTable[OverlapComm] = ChoiceTable("overlap communication", (
    OverlapComm("collective", "each stage or combine wave one asynchronous all_to_all_single"),
    OverlapComm("p2p", "batch_isend_irecv chunks; a stage split into own-node rows (computed first) and remote rows",
                collective=False),
))
