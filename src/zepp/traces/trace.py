"""The ``Trace`` object: one layer's expert choices, ``topk_ids [N, k]`` (one row per token), and
the checks every trace passes whatever file it came from. Readers (``zepp.traces.formats``) build it;
sampling and demand histograms (``zepp.traces.sampling``) use it. It imports no reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError


@dataclass(frozen=True)
class Trace:
    """``topk_ids [N, k]`` int32 expert ids per token, ids in ``[0, num_experts)``.

    ``source`` names where the rows came from (a path, or ``synthetic:k2/pool``) for messages.
    ``topk_weights [N, k]`` float32 gate weights, when the source had them.
    """

    topk_ids: np.ndarray
    num_experts: int
    source: str = "<array>"
    topk_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        ids = np.asarray(self.topk_ids)
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ZeppInputError(f"{self.source}: topk_ids must be [tokens, k], got shape {ids.shape}")
        if ids.size and (ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer)):
            raise ZeppInputError(f"{self.source}: topk_ids must hold integers, got dtype {ids.dtype}")
        if isinstance(self.num_experts, bool) or int(self.num_experts) != self.num_experts or self.num_experts < 1:
            raise ZeppInputError(f"{self.source}: num_experts must be a positive integer, got {self.num_experts!r}")
        if ids.size:
            _check_range(ids, int(self.num_experts), self.source, row_base=0, unit="row")
        object.__setattr__(self, "topk_ids", np.ascontiguousarray(ids, dtype=np.int32))
        object.__setattr__(self, "num_experts", int(self.num_experts))
        if self.topk_weights is not None:
            object.__setattr__(self, "topk_weights", _weights(self.topk_weights, self.source, ids.shape))

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[1])

    def __len__(self) -> int:
        return int(self.topk_ids.shape[0])

    def expert_load(self) -> np.ndarray:
        """Entries per expert over the whole trace, ``[E]`` int64."""
        return np.bincount(self.topk_ids.ravel(), minlength=self.num_experts).astype(np.int64)


# ---------------------------------------------------------------- validation helper


def _check_range(ids: np.ndarray, num_experts: int, source: str, row_base: int, unit: str) -> None:
    """Raise on the first negative or ``>= num_experts`` id (compared in the array's own dtype,
    so large unsigned values never wrap)."""
    bad = (ids < 0) | (ids >= num_experts)
    if not bad.any():
        return
    row, col = np.argwhere(bad)[0]
    value = int(ids[row, col])
    where = row_base + int(row)
    if value < 0:
        raise ZeppInputError(
            f"{source}: {unit} {where}: negative expert id {value} (position {col + 1}); "
            f"expert ids must lie in [0, {num_experts})"
        )
    raise ZeppInputError(
        f"{source}: {unit} {where}: expert id {value} (position {col + 1}) is out of range "
        f"[0, {num_experts}); pass the model's expert count (--experts) if this trace has more experts"
    )


def _weights(x, where: str, shape: tuple[int, ...]) -> np.ndarray:
    """Gate weights ``[N, k]`` float32: real, finite, of the ids' shape."""
    a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if a.dtype.kind not in "fiu":
        raise ZeppInputError(f"{where}: topk_weights must be real numbers, got dtype {a.dtype}")
    if a.shape != shape:
        raise ZeppInputError(f"{where}: topk_weights has shape {a.shape}, topk_ids has {shape}; they must match")
    if a.size and not np.all(np.isfinite(a)):
        row, col = np.argwhere(~np.isfinite(a))[0]
        raise ZeppInputError(f"{where}: topk_weights holds {a[row, col].item()!r} at row {row}, position {col + 1}; "
                             f"gate weights must be finite")
    return a.astype(np.float32)
