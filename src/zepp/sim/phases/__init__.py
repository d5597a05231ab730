"""The baselines' special phases: what is special to COMET, FAST and MoonEP beyond a FlowPlan.

A registry row names its phases (``System.plugins``, registry data); ``apply(name, ctx)`` lets
each change the batch's ``BatchInputs`` before the layer's task graph is built. One module per
baseline, one entry per name in ``PHASES``:

- ``comet``: ``comet-allgather`` (the dense all-gather dispatch) and ``comet-ring-combine``
  (the in-node ring combine with put-with-signal);
- ``fast``: ``fast-rounds`` (Birkhoff-von Neumann rounds, both phases);
- ``moonep``: ``moonep-pulls`` (the prefetched experts' weight pulls).
"""

from __future__ import annotations

from zepp.errors import ZeppInputError
from zepp.sim.phases import comet, fast, moonep
from zepp.sim.phases.inputs import BatchInputs

__all__ = ["PHASES", "BatchInputs", "apply"]

PHASES = {"comet-allgather": comet.use_allgather, "comet-ring-combine": comet.use_ring_combine,
          "fast-rounds": fast.use_rounds, "moonep-pulls": moonep.use_pulls}


def apply(name: str, ctx: BatchInputs) -> None:
    """Let phase ``name`` change ``ctx``."""
    if name not in PHASES:
        raise ZeppInputError(f"unknown simulator phase {name!r}; choose one of {', '.join(PHASES)}")
    PHASES[name](ctx)
