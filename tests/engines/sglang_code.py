"""SGLang 0.5.23's expert-location code loaded by path (``engine_code``), with the stubs it
imports: its runtime context (which the tests set per case), its elastic-EP check and its model
loader (an architecture that reports the layers and experts of the case)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import torch

from engine_code import loaded, stub


class Context:
    """SGLang's runtime context for one case: ``ranks`` EP ranks on ``nodes`` nodes, ``layers``
    layers of ``experts`` logical experts, ``redundant`` extra physical experts."""

    def __init__(self, ranks: int, nodes: int, layers: int, experts: int, redundant: int, algorithm: str = "static"):
        self.moe = SimpleNamespace(ep_num_redundant_experts=redundant, ep_dispatch_algorithm=algorithm,
                                   moe_a2a_backend="deepep", ep_join_mode="none", init_expert_location="trivial")
        self.parallel = SimpleNamespace(ep_size=ranks, nnodes=nodes, elastic_ep_initial_size=None, tp_size=ranks,
                                        moe_ep_rank=0)
        self.resources = SimpleNamespace(expert_location_metadata=None, lplb_solvers={})
        self.layers, self.experts = layers, experts


@contextlib.contextmanager
def sglang(ctx: Context):
    """``(expert_location, expert_location_dispatch, hook_manager)`` modules of SGLang for ``ctx``."""
    mod_holder = {}

    class Arch:
        @staticmethod
        def get_model_config_for_expert_location(hf_config):
            return mod_holder["el"].ModelConfigForExpertLocation(ctx.layers, ctx.experts, None)

    stubs = {
        "sglang.srt.runtime_context": stub(
            "sglang.srt.runtime_context", get_exec=lambda: SimpleNamespace(moe=ctx.moe),
            get_parallel=lambda: ctx.parallel, get_device=lambda: SimpleNamespace(device="cpu"),
            get_resources=lambda: ctx.resources),
        "sglang.srt.elastic_ep.elastic_ep": stub("sglang.srt.elastic_ep.elastic_ep",
                                                 elastic_expanded_world_enabled=lambda: False),
        "sglang.srt.model_loader": stub("sglang.srt.model_loader", get_model_architecture=lambda cfg: (Arch, None)),
    }
    with loaded("sglang", stubs) as load:
        el = load("sglang.srt.eplb.expert_location")
        mod_holder["el"] = el
        yield el, load("sglang.srt.eplb.expert_location_dispatch"), load("sglang.srt.model_executor.hook_manager")


def metadata_of(el, ctx: Context, p2l: np.ndarray, rank: int):
    """The expert-location metadata rank ``rank`` builds from ``p2l [layers, P]`` loaded from a file
    (``init_by_mapping``, as ``--init-expert-location`` does)."""
    ctx.parallel.moe_ep_rank = rank
    return el.ExpertLocationMetadata.init_by_mapping(SimpleNamespace(hf_config=None), torch.as_tensor(p2l),
                                                     moe_ep_rank=rank)
