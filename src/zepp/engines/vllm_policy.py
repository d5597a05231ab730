"""Zepp's placement policy and per-rank rows for vLLM's EPLB (vLLM 0.33.0), engine-free numpy.

vLLM calls its policy on every rank (the async worker on a thread, with CPU tensors) as
``rebalance_experts(weight [L, E], num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices [L, P]) -> physical_to_logical_map [L, P]`` (``L`` MoE layers, ``P``
physical experts, rank ``r`` holding ``P / num_ranks`` consecutive ones), derives its maps with
``compute_logical_maps`` and moves the weights itself. ``PolicyState.rebalance`` answers:

- while the table file's placement has not been applied (and whenever the load is all zero, as
  in vLLM's profiling run): the file's placement, where its shape fits;
- afterwards: Zepp's placement re-planned per layer from the window's load (vLLM's window has no
  source ranks: every node is taken to ask for the same share), at most one copy of an expert
  per node; where zepp's rule cannot fill the slots, one ``ZeppInputError`` naming the largest
  count that works.

After a re-plan, experts that stay on a GPU keep their old slot on it (``keep_slots``), so vLLM
moves only the weights that change GPU (the file's placement is returned as written: its table
belongs to those slots). ``PolicyState.rows`` gives one rank's ``logical_to_physical_map`` row
block ``[E, width]`` and ``logical_replica_count [E]`` for a layer's placement: the file's table
where the placement is the file's, else Zepp's table planned from the latest load.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError

__all__ = ["PolicyState", "keep_slots"]


def keep_slots(new: np.ndarray, old: np.ndarray, ranks: int) -> np.ndarray:
    """``new [L, P]`` with each GPU's slots permuted so that experts it held before keep the old
    slot of their first copy there; the multiset of experts on every GPU is unchanged."""
    out = new.copy()
    L, P = new.shape
    S = P // ranks
    for layer in range(L):
        for g in range(ranks):
            seg_new, seg_old = list(new[layer, g * S:(g + 1) * S]), old[layer, g * S:(g + 1) * S]
            place = [-1] * S
            for pos, e in enumerate(seg_old):  # an expert staying on the GPU keeps its old slot (once)
                if e in seg_new and place[pos] < 0 and e not in place:
                    place[pos] = int(e)
                    seg_new.remove(e)
            free = [pos for pos in range(S) if place[pos] < 0]
            for pos, e in zip(free, seg_new):
                place[pos] = int(e)
            out[layer, g * S:(g + 1) * S] = place
    return out


class PolicyState:
    """One process's policy state over the table file ``table`` (``read_tables``' dict of a vLLM table)."""

    def __init__(self, table: dict):
        self.file = table
        self.applied = False
        self.gpus_per_node = table["gpus_per_node"]
        self.load: dict[int, np.ndarray] = {}  # MoE layer -> the load [E] of the latest re-plan
        # MoE layer -> (its placement's bytes, its hash table): one table per layer, the latest
        # placement's, so a long run that re-balances often holds no table of a retired placement
        self._tables: dict[int, tuple[bytes, object]] = {}

    def rebalance(self, weight: np.ndarray, num_replicas: int, num_nodes: int, num_ranks: int,
                  old: np.ndarray | None) -> np.ndarray:
        """The new ``physical_to_logical_map [L, P]`` int64 (see the module docstring)."""
        weight = np.asarray(weight, np.int64)
        L, E = weight.shape
        if num_replicas % num_ranks or num_ranks % num_nodes:
            raise ZeppInputError(f"vLLM asked for {num_replicas} physical experts over {num_ranks} ranks on "
                                 f"{num_nodes} nodes: they must divide")
        fp = self.file["physical_to_logical_map"]
        fits = fp.shape == (L, num_replicas) and self.file["ep_size"] == num_ranks
        if fits and (not self.applied or not weight.any()):  # as written: the file's table belongs to it
            self.applied = self.applied or bool(weight.any())
            return fp.astype(np.int64)
        new = np.stack([self._plan(weight[layer], num_replicas, num_nodes, num_ranks) for layer in range(L)])
        self.load = {layer: weight[layer] for layer in range(L)}
        return keep_slots(new, np.asarray(old, np.int64), num_ranks) if old is not None else new

    def _plan(self, load: np.ndarray, num_replicas: int, num_nodes: int, num_ranks: int) -> np.ndarray:
        from zepp.interop.layers import check_copies_per_node, place_zepp_slots

        E, gpn = load.size, num_ranks // num_nodes
        check_copies_per_node("zepp", E, num_nodes, gpn, num_replicas - E, option="num_redundant_experts")
        row = place_zepp_slots(np.tile(load, (num_nodes, 1)), gpn, num_replicas // num_ranks).slot_expert.ravel()
        if (row < 0).any():
            raise ZeppInputError(f"num_redundant_experts {num_replicas - E}: zepp's placement leaves slots empty; "
                                 f"lower it")
        return row.astype(np.int64)

    def rows(self, layer: int, p2l: np.ndarray, rank: int, ranks: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s ``([E, width] physical ids, -1 padded; [E] counts)`` for vLLM's MoE layer
        ``layer`` (its ordinal among the MoE layers, the file's row) placed as ``p2l [P]``."""
        from zepp.planner.routing.engine_tables import HashTable, build_hash_table, hash_rows
        from zepp.planner.routing.table_routing import demand_per_gpu
        from zepp.planner.types import Placement

        p2l = np.asarray(p2l, np.int64)
        E, gpn = self.file["num_logical_experts"], self.gpus_per_node
        key = p2l.tobytes()
        W = 1 << (min(width, 1 << 30).bit_length() - 1)  # the widest power of two vLLM's row holds
        if self._tables.get(layer, (None,))[0] != key:
            fp = self.file["physical_to_logical_map"]  # row i: the i-th MoE layer, as vLLM counts them
            placement = Placement(p2l.reshape(ranks, -1), E, gpn)
            if layer < fp.shape[0] and np.array_equal(fp[layer], p2l) and self.file["width"] <= W:
                table = HashTable(self.file["choices"][layer], self.file["counts"][layer],
                                  self.file["width"], self.file["relaxation"], placement, self.file["objective"])
            else:
                load = self.load.get(layer, np.ones(E, np.int64)).astype(float) + 1e-9
                demand = demand_per_gpu(np.tile(load, (ranks // gpn, 1)) / (ranks // gpn), gpn)
                table = build_hash_table(placement, demand, self.file["relaxation"], gpn, W, self.file["objective"])
            self._tables[layer] = (key, table)
        l2p, count = hash_rows(self._tables[layer][1], rank)
        full = np.full((E, width), -1, np.int64)
        full[:, :l2p.shape[1]] = l2p
        return full, count
