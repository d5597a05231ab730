"""The SGLang plug-in end to end in SGLang 0.5.23's own code: ``zepp place --format sglang`` writes
the placement and the table; SGLang loads the placement with its own loader
(``compute_initial_expert_location_metadata``), its own ``register_forward_hooks`` calls zepp's
factory, and its own ``topk_ids_logical_to_physical`` then gives exactly the physical ids zepp
planned (``plan_tables``, ``route("sglang-table", ...)``). A placement the table was not planned
for, or a dispatch other than static, is one clear error."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from click.testing import CliRunner

from sglang_code import Context, sglang
from zepp.cli import cli
from zepp.errors import ZeppInputError
from zepp.interop.engine_tables import plan_tables, read_tables, table_routing
from zepp.interop.layers import plan_layers
from zepp.model import model_preset
from zepp.planner.routing import route
from zepp.traces.synthetic import synthetic_history

NODES, GPN, REDUNDANT, MODEL = 4, 2, 8, "olmoe"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sglang-place")
    out = d / "placement.json"
    res = CliRunner().invoke(cli, ["place", "--history", "synthetic", "--model", MODEL, "--nodes", str(NODES),
                                   "--gpus-per-node", str(GPN), "--redundant", str(REDUNDANT), "--format", "sglang",
                                   "--out", str(out), "--no-report"])
    assert res.exit_code == 0, res.output
    return out, d / "placement.zepp-table.json"


def _spec_hook(table_path) -> list[dict]:
    return [{"name": "zepp", "target_modules": ["model"], "hook_factory": "zepp.engines.sglang_hook:dispatch_table",
             "config": {"table": str(table_path)}}]


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(1, 1)


def _start_rank(el, ctx: Context, rank: int, placement) -> None:
    """What SGLang does for one rank: its metadata from ``--init-expert-location``."""
    ctx.parallel.moe_ep_rank = rank
    ctx.moe.init_expert_location = str(placement)
    el.set_global_expert_location_metadata(el.compute_initial_expert_location_metadata(SimpleNamespace(hf_config=None), rank),
                                           allow_overwrite=True)


def test_sglangs_dispatch_over_the_installed_table_gives_zepps_ids(files):
    placement, table_path = files
    spec = model_preset(MODEL)
    table = read_tables(table_path)
    hist = synthetic_history(MODEL, seed=0)  # what --history synthetic reads; --no-report plans on all of it
    ep, _ = plan_layers(hist, spec, NODES, GPN, REDUNDANT, "zepp")
    tokens = spec.tokens_for_budget(4.0)  # zepp place's default --budget-mb (1024 tokens: a prefill table)
    planned = plan_tables("sglang", hist, ep, 0.25, tokens)
    R = NODES * GPN
    rng = np.random.default_rng(0)
    ctx = Context(R, NODES, spec.num_layers, spec.num_experts, REDUNDANT)
    with sglang(ctx) as (el, dispatch, hooks):
        for rank in range(R):
            _start_rank(el, ctx, rank, placement)
            hooks.register_forward_hooks(_Model(), _spec_hook(table_path))
            for layer in rng.choice(table["layers"], 3, replace=False):
                info = dispatch.ExpertLocationDispatchInfo.init_new(int(layer))
                ids = rng.integers(0, spec.num_experts, (R, 40, spec.top_k)).astype(np.int32)
                got = dispatch.topk_ids_logical_to_physical(torch.as_tensor(ids[rank]), info).numpy()
                want = route(table_routing("sglang", tokens), ids, ep.placement(int(layer)),
                             table=planned[int(layer)]).slot[rank]
                assert np.array_equal(got, want), f"rank {rank}, layer {layer}"


def test_the_hook_refuses_another_placement_or_dispatch(files, tmp_path):
    placement, table_path = files
    spec = model_preset(MODEL)
    R = NODES * GPN
    trivial = tmp_path / "trivial.json"
    p2l = np.tile(np.arange(spec.num_experts + REDUNDANT) % spec.num_experts, (spec.num_layers, 1))
    trivial.write_text(json.dumps({"physical_to_logical_map": p2l.tolist()}))
    ctx = Context(R, NODES, spec.num_layers, spec.num_experts, REDUNDANT)
    with sglang(ctx) as (el, _, hooks):
        _start_rank(el, ctx, 0, trivial)
        with pytest.raises(ZeppInputError, match="not the one zepp's table was planned for"):
            hooks.register_forward_hooks(_Model(), _spec_hook(table_path))
    ctx = Context(R, NODES, spec.num_layers, spec.num_experts, REDUNDANT, algorithm="dynamic")
    with sglang(ctx) as (el, _, hooks):
        _start_rank(el, ctx, 0, placement)
        with pytest.raises(ZeppInputError, match="needs --ep-dispatch-algorithm static"):
            hooks.register_forward_hooks(_Model(), _spec_hook(table_path))
