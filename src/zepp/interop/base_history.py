"""What every engine's history reader shares: the request it answers and the checks on its
counts and layer numbering.

Each engine's module reads its own recording into a :class:`~zepp.traces.layer_history.LayerHistory`
(``sglang.read_dumps``, ``trtllm.read_statistics``, ``vllm.read_load_window``,
``zepp_format.read_recorder`` and ``read_text_trace``); :func:`zepp.interop.history.read_history`
picks the reader from the path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError
from zepp.model import MoESpec

__all__ = ["HistoryRequest"]


@dataclass(frozen=True)
class HistoryRequest:
    """What the caller knows about the recording: the model preset it was recorded with (with
    the overrides applied; ``None``: unknown), the ``--experts`` / ``--topk`` overrides as
    given, and whether one id twice in a token's top-k is accepted."""

    spec: MoESpec | None
    num_experts: int | None = None
    top_k: int | None = None
    allow_duplicates: bool = False

    @property
    def experts(self) -> int | None:
        """The expert count the recording must have (``None``: read it from the recording)."""
        if self.num_experts is not None:
            return int(self.num_experts)
        return self.spec.num_experts if self.spec is not None else None

    @property
    def k(self) -> int | None:
        """The top-k: the override, else the model's (``None`` when neither is known)."""
        return self.top_k or (self.spec.top_k if self.spec else None)

    def model_layers(self, recorded: int, source: str, what: str) -> tuple[int, ...]:
        """Model layer index of each of ``recorded`` rows: all layers (``num_layers``) or MoE layers only."""
        spec = self.spec
        if spec is None:
            return tuple(range(recorded))
        if recorded == spec.num_layers:
            return tuple(range(recorded))
        if recorded == len(spec.moe_layers):
            return spec.moe_layers
        raise ZeppInputError(
            f"{source}: {what} has {recorded} layers, but model {spec.name!r} has {spec.num_layers} layers "
            f"({len(spec.moe_layers)} MoE); pass the model the dump was recorded with (--model)")

    def moe_rows(self, layers: tuple[int, ...], counts: np.ndarray) -> list[int]:
        """Rows of ``counts [L, ...]`` to keep: the model's MoE layers, or (model unknown) the
        rows with any entry."""
        spec = self.spec
        return [i for i, l in enumerate(layers) if (spec is None and counts[i].sum() > 0) or
                (spec is not None and l in spec.moe_layers)]
