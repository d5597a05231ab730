"""The flat view of a routing that the flow builders (``zepp.planner.flows``) and the validation
(``zepp.planner.validation``) read: its entries in batch order and their per-token deduplications
(token-GPU and token-node pairs), built on first use."""

from __future__ import annotations

import functools

import numpy as np

from zepp.planner.types import Routing


class EntryView:
    """Flat views of a routing, plus its per-token deduplications.

    Entries (``[n]``, batch order, missing entries left out): ``owner``, ``token``, ``entry``,
    ``comp``; ``n = R*T*k`` when nothing is missing.
    Token-GPU pairs (``tc_*``, ``[P]``): distinct (token, computing rank), ordered by (owner,
    token, rank). Token-node pairs (``tn_*``, ``[Q]``): distinct (token, computing node), ordered
    by (owner, token, node). ``tc_pair_node [P]`` indexes the token-node pair of each token-GPU
    pair. Dedup sorts each token's ``k`` ranks, so it is linear in the entries; the pairs are built
    on first use (the a2av transports need none).
    """

    def __init__(self, routing: Routing):
        p = routing.placement
        ranks, T, k = routing.topk_ids.shape
        self.ranks, self.T, self.k, self.L = ranks, T, k, p.gpus_per_node
        self.N = ranks // self.L
        comp_all = routing.compute_rank.ravel().astype(np.int32)
        missing = comp_all < 0
        self._valid = None if not missing.any() else np.flatnonzero(~missing)
        self.comp = comp_all if self._valid is None else comp_all[self._valid]
        self._comp_all = comp_all

    _PAIRS = ("tc_owner", "tc_token", "tc_comp", "tn_owner", "tn_token", "tn_node", "tc_pair_node")

    def __getattr__(self, name: str):
        # the token-GPU and token-node pairs are built on first use (a2av needs none of them)
        if name in EntryView._PAIRS:
            self._build_pairs()
            return self.__dict__[name]
        raise AttributeError(f"'EntryView' object has no attribute {name!r}")

    def _build_pairs(self) -> None:
        ranks, T, k = self.ranks, self.T, self.k
        G = ranks * T
        comp = np.sort(self._comp_all.reshape(G, k), axis=1)  # a token's ranks, ascending (so nodes too); -1 first
        node = comp // self.L
        first_c = np.ones((G, k), bool)
        first_c[:, 1:] = comp[:, 1:] != comp[:, :-1]
        first_n = np.ones((G, k), bool)
        first_n[:, 1:] = node[:, 1:] != node[:, :-1]
        if self._valid is not None:  # a missing entry is no pair
            first_c &= comp >= 0
            first_n &= comp >= 0
        fc, fn = first_c.ravel(), first_n.ravel()
        tc_where, tn_where = np.flatnonzero(fc), np.flatnonzero(fn)
        tc_g, tn_g = (tc_where // k).astype(np.int32), (tn_where // k).astype(np.int32)  # token index
        self.tc_owner = tc_g // T
        self.tc_token = tc_g - self.tc_owner * T
        self.tc_comp = comp.ravel()[tc_where].astype(np.int32)
        self.tn_owner = tn_g // T
        self.tn_token = tn_g - self.tn_owner * T
        self.tn_node = node.ravel()[tn_where].astype(np.int32)
        self.tc_pair_node = (np.cumsum(fn) - 1)[fc]

    # Per-entry views, built only where needed (a2av and validation).
    def _keep(self, a: np.ndarray) -> np.ndarray:
        return a if self._valid is None else a[self._valid]

    @functools.cached_property
    def owner(self) -> np.ndarray:
        return self._keep(np.repeat(np.arange(self.ranks, dtype=np.int32), self.T * self.k))

    @functools.cached_property
    def token(self) -> np.ndarray:
        return self._keep(np.tile(np.repeat(np.arange(self.T, dtype=np.int32), self.k), self.ranks))

    @functools.cached_property
    def entry(self) -> np.ndarray:
        return self._keep(np.tile(np.arange(self.k, dtype=np.int8), self.ranks * self.T))

    @functools.cached_property
    def _pair_remote(self) -> np.ndarray:
        return self.tc_comp // self.L != self.tc_owner // self.L

    def same_node_pairs(self) -> np.ndarray:
        """Mask of token-GPU pairs on the owner's node but not the owner itself."""
        return ~self._pair_remote & (self.tc_comp != self.tc_owner)

    def remote_pairs(self) -> np.ndarray:
        """Mask of token-GPU pairs on another node."""
        return self._pair_remote
