"""The vLLM plug-in in vLLM 0.33.0's own code.

- Zepp's policy passes, through vLLM's ``compute_logical_maps``, the checks of vLLM's
  ``tests/distributed/test_eplb_algo.py`` that hold for any policy (shapes, ids in range, every
  expert at least once, the replica total, a non-dividing slot count refused, experts that stay
  on a GPU keep their old slot); two of its cases put redundant copies on one node
  (``num_nodes=1``), which zepp's one-copy-per-node rule refuses with one clear error instead.
- The entry point is found through ``importlib.metadata`` by vLLM's own ``load_general_plugins``
  and installs into the loaded vLLM modules: after vLLM's own ``_commit_eplb_maps``, each rank's
  rows run through vLLM's kernel give exactly the ids zepp planned, at the file's placement and
  after a re-plan.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vllm_code import vllm, vllm_physical_ids
from zepp.cli import cli
from zepp.engines.vllm_policy import PolicyState, keep_slots
from zepp.errors import ZeppInputError
from zepp.interop.engine_tables import read_tables
from zepp.planner.routing import route
from zepp.planner.routing.engine_tables import HashTable
from zepp.planner.types import Placement

ROOT = Path(__file__).resolve().parents[2]
NODES, GPN, REDUNDANT, MODEL = 4, 2, 8, "deepseek-v3"  # dense first layers: vLLM counts MoE layers only
GROUP = "vllm.general_plugins"


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-place") / "placement.pt"
    res = CliRunner().invoke(cli, ["place", "--history", "synthetic", "--model", MODEL, "--nodes", str(NODES),
                                   "--gpus-per-node", str(GPN), "--redundant", str(REDUNDANT), "--format", "vllm",
                                   "--out", str(out), "--no-report"])
    assert res.exit_code == 0, res.output
    return out.with_name("placement.zepp-table.pt")


def _policy(table_file):
    return PolicyState(read_tables(table_file))


VLLM_CASES = [  # (weight, num_replicas, num_groups, num_nodes, num_gpus): test_eplb_algo.py's, nodes > 1
    ([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86], [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]],
     16, 4, 2, 8),
    ([[10, 20, 30, 40]], 4, 1, 1, 1),
    ([[50] * 8], 8, 2, 2, 4),
    ([[1000, 1, 1, 1, 1, 1, 1, 1]], 12, 2, 2, 4),
    ([[10, 20, 30, 40, 50, 60], [60, 50, 40, 30, 20, 10], [25] * 6], 8, 2, 2, 4),
    ([[10, 20, 30, 40]], 8, 3, 2, 4),
    ([[100, 50, 200, 75, 150, 25, 300, 80]], 12, 4, 2, 4),
    ([[10, 20, 30, 40, 50, 60]], 8, 3, 2, 4),
    ([[50, 100, 75, 120, 90, 60, 80, 110, 40, 70, 95, 85, 65, 55, 45, 35]], 24, 8, 4, 8),
]


@pytest.mark.parametrize("case", VLLM_CASES)
def test_policy_passes_vllms_checks_through_compute_logical_maps(case, table_file):
    weight, replicas, groups, nodes, gpus = case
    w = torch.tensor(weight)
    state = _policy(table_file)
    p2l = torch.as_tensor(state.rebalance(w.numpy(), replicas, nodes, gpus, None))
    with vllm() as v:
        log2phy, logcnt = v.eplb_state.compute_logical_maps(p2l, w.shape[-1])
    L, E = w.shape
    assert p2l.shape == (L, replicas) and log2phy.shape[:2] == (L, E) and logcnt.shape == (L, E)
    assert torch.all(p2l >= 0) and torch.all(p2l < E)
    assert torch.all(logcnt >= 1) and logcnt.sum() == replicas * L
    if replicas == E:
        assert torch.all(logcnt == 1)
    hot = w.argmax(1)  # the hottest expert has the most copies (zepp counts copies by load)
    assert all(logcnt[i, hot[i]] == logcnt[i].max() for i in range(L))


def test_policy_refuses_what_zepps_rule_cannot_fill(table_file):
    state = _policy(table_file)
    with pytest.raises(ZeppInputError, match="must divide"):
        state.rebalance(np.array([[10, 20, 30, 40]]), 7, 2, 4, None)  # 7 not divisible by 4
    for weight, replicas, nodes, gpus in (([[10, 20, 30, 40]], 6, 1, 2), ([[200, 150, 100, 50, 25, 12]] * 2, 10, 1, 2)):
        with pytest.raises(ZeppInputError, match="at most one copy of an expert per node.*use num_redundant_experts 0"):
            state.rebalance(np.array(weight), replicas, nodes, gpus, None)


@pytest.mark.parametrize("ranks, slots, old, new", [
    (2, 4, [0, 1, 2, 3, 4, 5, 6, 7], [1, 5, 0, 4, 6, 2, 7, 3]),
    (2, 5, [0, 1, 0, 2, 3, 4, 5, 6, 1, 2], [0, 5, 4, 0, 1, 6, 2, 3, 2, 1]),
    (3, 4, [0, 1, 2, 3] * 3, [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 0]),
])
def test_experts_that_stay_on_a_gpu_keep_their_old_slot(ranks, slots, old, new):
    """vLLM's test_preserve_intragpu_slots's cases and check, on zepp's ``keep_slots``."""
    old, new = np.array([old]), np.array([new])
    post = keep_slots(new, old, ranks)
    for g in range(ranks):
        seg = slice(g * slots, (g + 1) * slots)
        assert sorted(post[0, seg]) == sorted(new[0, seg])
        for e in set(old[0, seg]) & set(new[0, seg]):
            assert post[0, seg][list(old[0, seg]).index(e)] == e


def test_the_policy_keeps_one_table_per_layer_and_rebuilds_a_returning_placement_alike(table_file):
    """A long run re-balances often: the policy holds only the latest placement's table per layer,
    and a placement that comes back gets the rows a fresh policy gives it."""
    state = _policy(table_file)
    R, E, L = NODES * GPN, state.file["num_logical_experts"], len(state.file["layers"])
    P, rng = E + REDUNDANT, np.random.default_rng(1)
    first = state.rebalance(np.ones((L, E), np.int64), P, NODES, R, None)
    seen = state.rows(0, first[0], 0, R, 1024)
    for _ in range(3):
        other = state.rebalance(rng.integers(1, 99, (L, E)), P, NODES, R, first)
        assert not np.array_equal(other[0], first[0])
        state.rows(0, other[0], 0, R, 1024)
        assert len(state._tables) == 1
    again = state.rows(0, first[0], 0, R, 1024)
    fresh = _policy(table_file).rows(0, first[0], 0, R, 1024)
    for a, b, c in zip(seen, again, fresh):
        assert np.array_equal(a, b) and np.array_equal(b, c)


def _entry_point(monkeypatch, tmp_path):
    """The ``zepp`` entry point of ``vllm.general_plugins`` as ``importlib.metadata`` finds it. Where
    the installed zepp's metadata predates this checkout (an editable install of another tree),
    the metadata of this checkout's pyproject.toml is put on the path (what ``pip install -e .`` writes)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]["zepp"]
    if not [e for e in importlib.metadata.entry_points(group=GROUP) if e.name == "zepp"]:
        info = tmp_path / "zepp_checkout-0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zepp-checkout\nVersion: 0\n")
        (info / "entry_points.txt").write_text(f"[{GROUP}]\nzepp = {declared}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()
    found = [e for e in importlib.metadata.entry_points(group=GROUP) if e.name == "zepp"]
    assert len(found) == 1 and found[0].value == declared
    return found[0]


def _model_state(v, L, E, P, ranks):
    """vLLM's per-model EPLB maps as ``add_model`` builds them (initial arrangement, width 1024)."""
    p2l = torch.as_tensor(np.tile(np.arange(P) % E, (L, 1)), dtype=torch.int64)
    l2p, cnt = v.eplb_state.compute_logical_maps(p2l, E)
    wide = torch.full((L, E, 1024), -1, dtype=torch.int64)
    wide[:, :, :l2p.shape[2]] = l2p
    return SimpleNamespace(physical_to_logical_map=p2l, logical_to_physical_map=wide, logical_replica_count=cnt)


def test_the_entry_point_installs_zepp_into_vllm(table_file, monkeypatch, tmp_path):
    ep = _entry_point(monkeypatch, tmp_path)
    monkeypatch.setenv("ZEPP_VLLM_TABLE", str(table_file))
    table = read_tables(table_file)
    R, E, L = NODES * GPN, table["num_logical_experts"], len(table["layers"])
    P = E + REDUNDANT
    group = SimpleNamespace(rank_in_group=0, world_size=R)
    with vllm() as v:
        import sys

        sys.modules["vllm.distributed.parallel_state"].get_ep_group = lambda: group
        v.plugins.load_general_plugins()  # vLLM's own loader: entry points of vllm.general_plugins
        assert ep.load().__module__ == "zepp.engines.vllm_plugin"
        pol = v.policy.EPLB_POLICIES["default"]
        assert pol.__name__ == "ZeppEplbPolicy" and v.eplb_state.EPLB_POLICIES is v.policy.EPLB_POLICIES
        assert v.eplb_state.EplbState.add_model.zepp_wrapped
        rng = np.random.default_rng(0)
        start = _model_state(v, L, E, P, R).physical_to_logical_map
        for step, weight in enumerate((torch.ones(L, E, dtype=torch.int64), torch.as_tensor(rng.integers(1, 99, (L, E))))):
            new = pol.rebalance_experts(weight, P, 1, NODES, R, start)  # every rank computes the same
            if step == 0:
                assert np.array_equal(new.numpy(), table["physical_to_logical_map"])  # the file's placement
            else:
                assert not np.array_equal(new.numpy(), table["physical_to_logical_map"])  # re-planned from the load
            for rank in (0, R - 1):
                group.rank_in_group = rank
                ms = _model_state(v, L, E, P, R)
                v.eplb_state._commit_eplb_maps(ms, new)
                for i in (0, L - 1):
                    pl = Placement(new[i].numpy().reshape(R, -1), E, GPN)
                    held = ms.logical_to_physical_map[i].numpy()
                    assert (pl.slot_expert.ravel()[held[held >= 0]] == np.nonzero(held >= 0)[0]).all()
                    ids = rng.integers(0, E, (R, 64, 8)).astype(np.int32)
                    got = vllm_physical_ids(v, ids[rank], held, ms.logical_replica_count[i].numpy())
                    if step == 0:
                        t = HashTable(table["choices"][i], table["counts"][i], table["width"], 0.25, pl)
                        assert np.array_equal(got, route("vllm-table", ids, pl, table=t).slot[rank])
                    assert (pl.slot_expert.ravel()[got] == ids[rank]).all()


def test_the_plug_ins_refuse_bad_files_with_one_line(table_file, tmp_path, monkeypatch):
    from zepp.engines.sglang_hook import dispatch_table
    from zepp.engines.vllm_plugin import install, register

    untouched = SimpleNamespace(_commit_eplb_maps=lambda *a: None)
    with pytest.raises(ZeppInputError, match="does not exist"):
        install(str(tmp_path / "missing.pt"), None, untouched)
    with pytest.raises(ZeppInputError, match="not an SGLang one"):
        dispatch_table({"table": str(table_file)})
    with pytest.raises(ZeppInputError, match='needs "config": {"table"'):
        dispatch_table({"tabel": str(table_file)})
    res = CliRunner().invoke(cli, ["place", "--history", "synthetic", "--model", MODEL, "--nodes", str(NODES),
                                   "--gpus-per-node", str(GPN), "--redundant", str(REDUNDANT), "--format", "sglang",
                                   "--out", str(tmp_path / "s-place.json"), "--no-report"])
    assert res.exit_code == 0
    with pytest.raises(ZeppInputError, match="not a vLLM one"):
        install(str(tmp_path / "s-place.zepp-table.json"), None, untouched)
    monkeypatch.delenv("ZEPP_VLLM_TABLE", raising=False)
    register()  # unset: vLLM runs without zepp (nothing imported, nothing changed)
