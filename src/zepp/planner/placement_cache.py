"""Values built once per placement and kept for the last few placements (the routings' static
tables). A ``Placement`` holds arrays and is not hashed by value, so an entry is keyed by the
placement's identity and returned only for that very object (an id may be reused once a
placement is gone; the entry holds its placement, so not while it is kept)."""

from __future__ import annotations

from typing import Callable, TypeVar

V = TypeVar("V")


class PlacementCache:
    """``get(placement, build, *key)``: ``build()``'s value for ``placement`` (and any hashable
    ``key``: a device, the experts it covers), built on first use; the last ``size`` built are kept."""

    def __init__(self, size: int = 8):
        self.size = size
        self._entries: dict[tuple, tuple] = {}

    def get(self, placement, build: Callable[[], V], *key) -> V:
        k = (id(placement), *key)
        hit = self._entries.get(k)
        if hit is not None and hit[0] is placement:
            return hit[1]
        value = build()
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[k] = (placement, value)
        return value
