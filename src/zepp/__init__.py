"""zepp: plan, simulate and execute distributed MoE layers under relaxed balance constraints.

The packages follow one batch through the pipeline: ``traces`` (what the router chose) ->
``planner`` (placement, routing, flow plan) -> ``sim`` (simulated executor) or ``runtime`` (real
executor on torch.distributed) -> ``serve`` (whole transformers models); ``interop`` (engines'
files), ``emulate`` (the emulated cluster), ``launch`` (spawning ranks) and ``cli`` (commands)
serve them. ``registry`` is the one table of systems.
"""

# the names below load their module on first use (PEP 562), so ``import zepp.cli`` (every command
# line) starts without numpy: a Ctrl-C that early is still zepp's one line (``zepp.cli``)
_EXPORTS = {"Cluster": "zepp.cluster", "cluster_preset": "zepp.cluster", "MoESpec": "zepp.model",
            "model_preset": "zepp.model", "ZeppInputError": "zepp.errors", "Placement": "zepp.planner.types",
            "Routing": "zepp.planner.types", "FlowPlan": "zepp.planner.types", "Hops": "zepp.planner.types",
            "LinkStats": "zepp.planner.volumes"}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'zepp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
