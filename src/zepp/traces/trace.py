"""The ``Trace`` object: one layer's expert choices, ``topk_ids [N, k]`` (one row per token), and
the checks every trace passes whatever file it came from (ids in range, no id twice in a
token's top-k, finite gate weights), shared by the readers (``zepp.traces.formats``) so each
problem reads the same whichever file it is in. Sampling and demand histograms
(``zepp.traces.sampling``) use it. It imports no reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zepp.errors import ZeppInputError

__all__ = ["Trace", "check_id_range", "check_no_repeats", "check_weights", "MAX_INFERRED_EXPERTS"]

MAX_INFERRED_EXPERTS = 1 << 16  # without num_experts, larger ids are refused (pass the count)
_INT32_MAX = (1 << 31) - 1


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
            check_id_range(ids, int(self.num_experts), self.source, lambda r: f"row {r}")
        object.__setattr__(self, "topk_ids", np.ascontiguousarray(ids, dtype=np.int32))
        object.__setattr__(self, "num_experts", int(self.num_experts))
        if self.topk_weights is not None:
            w = self.topk_weights
            w = np.asarray(w.detach().cpu().numpy() if hasattr(w, "detach") else w)
            object.__setattr__(self, "topk_weights", check_weights(w, self.source, ids.shape))

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[1])

    def __len__(self) -> int:
        return int(self.topk_ids.shape[0])

    def expert_load(self) -> np.ndarray:
        """Entries per expert over the whole trace, ``[E]`` int64."""
        return np.bincount(self.topk_ids.ravel(), minlength=self.num_experts).astype(np.int64)


# ---------------------------------------------------------------- checks shared by every reader


def check_id_range(ids: np.ndarray, num_experts: int | None, source: str, where) -> None:
    """Raise on the first id of ``ids [N, k]`` outside ``[0, num_experts)`` (``num_experts``
    ``None``: outside the int32 range, the count is inferred later), compared in the array's own
    dtype (large unsigned values never wrap). ``where(r)`` names row ``r`` in the message
    (``"line 7"``, ``"row 6"``)."""
    bad = (ids < 0) | (ids >= (num_experts if num_experts is not None else _INT32_MAX + 1))
    if not bad.any():
        return
    r, c = np.argwhere(bad)[0]
    v = int(ids[r, c])
    if v < 0:
        why = f"negative expert id {v} (position {c + 1}); expert ids must lie in [0, {num_experts or 'num_experts'})"
    elif num_experts is None:
        why = f"expert id {v} (position {c + 1}) exceeds the int32 range; expert ids are small integers, check the file"
    else:
        why = (f"expert id {v} (position {c + 1}) is out of range [0, {num_experts}); pass the model's expert count "
               f"(--experts) if this trace has more experts")
    raise ZeppInputError(f"{source}: {where(r)}: {why}")


def check_no_repeats(ids: np.ndarray, source: str, where) -> None:
    """Raise on the first row of ``ids [N, k]`` that holds one expert twice (a router never does)."""
    if ids.shape[1] < 2:
        return
    s = np.sort(ids, axis=1)
    dup = (s[:, 1:] == s[:, :-1]).any(axis=1)
    if dup.any():
        r = int(np.flatnonzero(dup)[0])
        v = int(s[r, 1:][s[r, 1:] == s[r, :-1]][0])
        raise ZeppInputError(f"{source}: {where(r)}: expert id {v} appears twice in one token's top-k (a router "
                             f"never picks an expert twice); allow it only for synthetic data "
                             f"(allow_duplicates=True, --allow-duplicate-ids)")


def check_weights(a: np.ndarray, where: str, shape: tuple[int, ...]) -> np.ndarray:
    """Gate weights ``a [N, k]`` as float32: real, finite, of the ids' ``shape``."""
    if a.dtype.kind not in "fiu":
        raise ZeppInputError(f"{where}: topk_weights must be real numbers, got dtype {a.dtype}")
    if a.shape != shape:
        raise ZeppInputError(f"{where}: topk_weights has shape {a.shape}, topk_ids has {shape}; they must match")
    if a.size and not np.all(np.isfinite(a)):
        row, col = np.argwhere(~np.isfinite(a))[0]
        raise ZeppInputError(f"{where}: topk_weights holds {a[row, col].item()!r} at row {row}, position {col + 1}; "
                             f"gate weights must be finite")
    return a.astype(np.float32)
