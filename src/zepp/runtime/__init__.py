"""The real executor: expert-parallel MoE layers on torch.distributed (gloo on CPU, NCCL on GPU).

- ``Dispatcher`` (``dispatcher.py``): one per process group; ``dispatch(x, topk_ids, topk_weights)
  -> (ExpertInputs, handle)`` and ``combine(expert_outputs, handle) -> y``, executing a planner
  FlowPlan's hop tables for the ``a2av``, ``relay`` and ``zepp`` transports.
- ``MoELayer`` (``moe.py``): this rank's expert weights, grouped GELU-MLP compute, overlap,
  intra-node weight swaps; ``swap_copies.py``: the swaps' weight copies, posted before a step on
  a channel of their own and waited for slot by slot; ``swap_steps.py``: a swapping system's swaps per step
  in ``zepp run`` (plan, post, finish, what it cost).
- ``program.py``: compiles one rank's part of a FlowPlan into index arrays (pure numpy).
- ``reference.py``: the single-process reference MoE and an in-process executor.
- ``worker.py``: one rank of ``zepp run`` (``python -m zepp.runtime.worker CONFIG``): ``case.py`` runs
  and measures every system's layer, ``inputs.py`` its traces and inputs, ``report.py`` rank 0's
  report; ``rank_process.py`` the life of a rank process (rendezvous, exit codes, JSON exchange),
  shared with ``zepp.serve.rank``. ``zepp run`` itself (``zepp.cli.run``) starts the ranks through
  ``zepp.launch``; nothing here imports ``zepp.launch``, ``zepp.emulate`` or ``zepp.cli``.

Importing this package does not import torch.distributed modules beyond torch itself; the
submodules are imported on use.
"""

__all__ = ["Dispatcher", "MoELayer", "ExpertInputs"]


def __getattr__(name):
    if name in ("Dispatcher", "ExpertInputs"):
        from zepp.runtime import dispatcher

        return getattr(dispatcher, name)
    if name == "MoELayer":
        from zepp.runtime.moe import MoELayer

        return MoELayer
    raise AttributeError(name)
