"""vLLM's ``vllm.general_plugins`` entry point (``zepp = zepp.engines.vllm_plugin:register`` in
pyproject.toml): vLLM 0.33.0 runs it in every process before the model loads.

With ``ZEPP_VLLM_TABLE`` naming a table file of ``zepp place --format vllm`` (unset: it does
nothing), ``register``:

- puts Zepp's policy (``vllm_policy.PolicyState``) behind the name ``default`` in vLLM's
  ``EPLB_POLICIES`` (``EPLBConfig.policy`` takes no other name), so every rebalance plans Zepp's
  placement; vLLM's own ``rearrange`` still moves the weights;
- wraps vLLM's ``_commit_eplb_maps`` and ``_commit_eplb_maps_for_layer`` (which rewrite every map
  after a rearrangement): after them, this rank's ``logical_to_physical_map`` rows and
  ``logical_replica_count`` are Zepp's (each copy listed in proportion to its share for this rank);
- moves the first rearrangement to the first step (``EplbState.add_model``), so the file's
  placement is in use from the start instead of after three quarters of ``step_interval``.

Loading it twice in one process changes nothing more (vLLM may).
"""

from __future__ import annotations

import os

from zepp.engines import VLLM_TABLE_ENV
from zepp.errors import ZeppInputError

__all__ = ["register", "install"]


def register() -> None:
    """The entry point: install Zepp into the loaded vLLM when ``ZEPP_VLLM_TABLE`` is set."""
    path = os.environ.get(VLLM_TABLE_ENV)
    if not path:
        return
    from vllm.distributed.eplb import eplb_state, policy

    install(path, policy, eplb_state)


def install(path: str, policy, eplb_state) -> None:
    """Install the table file ``path`` into vLLM's ``policy`` and ``eplb_state`` modules."""
    from zepp.engines.vllm_policy import PolicyState
    from zepp.interop.engine_tables import read_tables

    if getattr(eplb_state._commit_eplb_maps, "zepp_state", None) is not None:
        return
    table = read_tables(path)
    if table["zepp_table"] != "vllm":
        raise ZeppInputError(f"{path}: a {table['zepp_table']} table, not a vLLM one ({VLLM_TABLE_ENV})")
    state = PolicyState(table)
    policy.EPLB_POLICIES["default"] = _policy_class(policy.AbstractEplbPolicy, state)
    _wrap_commits(eplb_state, state)
    _start_early(eplb_state.EplbState)


def _policy_class(base, state):
    import torch

    class ZeppEplbPolicy(base):
        """Zepp's placement (zepp.engines.vllm_policy)."""

        @classmethod
        def rebalance_experts(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                              old_global_expert_indices=None):
            old = None if old_global_expert_indices is None else old_global_expert_indices.cpu().numpy()
            new = state.rebalance(weight.cpu().numpy(), num_replicas, num_nodes, num_ranks, old)
            return torch.as_tensor(new, dtype=torch.int64)

    return ZeppEplbPolicy


def _wrap_commits(eplb_state, state) -> None:
    every, one = eplb_state._commit_eplb_maps, eplb_state._commit_eplb_maps_for_layer

    def commit_every_layer(model_state, new_physical_to_logical_map):
        every(model_state, new_physical_to_logical_map)
        for layer in range(model_state.physical_to_logical_map.shape[0]):
            _write_rows(model_state, layer, state)

    def commit_one_layer(model_state, new_physical_to_logical_map, layer):
        one(model_state, new_physical_to_logical_map, layer)
        _write_rows(model_state, layer, state)

    commit_every_layer.zepp_state = commit_one_layer.zepp_state = state
    eplb_state._commit_eplb_maps, eplb_state._commit_eplb_maps_for_layer = commit_every_layer, commit_one_layer


def _write_rows(model_state, layer: int, state) -> None:
    """This rank's Zepp rows of MoE layer ``layer``, written in place over vLLM's."""
    import torch
    from vllm.distributed.parallel_state import get_ep_group

    group = get_ep_group()
    l2p_all, count_all = model_state.logical_to_physical_map, model_state.logical_replica_count
    p2l = model_state.physical_to_logical_map[layer].cpu().numpy()
    l2p, count = state.rows(layer, p2l, group.rank_in_group, group.world_size, l2p_all.shape[-1])
    l2p_all[layer].copy_(torch.as_tensor(l2p, dtype=l2p_all.dtype))
    count_all[layer].copy_(torch.as_tensor(count, dtype=count_all.dtype))


def _start_early(EplbState) -> None:
    add = EplbState.add_model
    if getattr(add, "zepp_wrapped", False):
        return

    def add_model(self, *args, **kwargs):
        add(self, *args, **kwargs)
        self.expert_rearrangement_step = max(self.expert_rearrangement_step, self.expert_rearrangement_step_interval - 1)

    add_model.zepp_wrapped = True
    EplbState.add_model = add_model
