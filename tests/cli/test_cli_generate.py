"""zepp generate: the checks that need a checkpoint (one line, before any rank starts; the options
it shares with zepp run are ``tests/cli/test_cli_bad_inputs.py``), the --record layout read back,
--history, --check, a rank that dies ending the run naming it (the launcher's failure path itself
is ``tests/launch/test_launch_ranks.py``), checkpoint layouts and the emulated cluster. The
command runs in this process (``zepp.cli.main``): no extra interpreter importing torch."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from zepp.cli import main as zepp_main  # noqa: E402
from zepp.errors import ZeppInputError  # noqa: E402
from zepp.serve.tiny import make_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(str(tmp_path_factory.mktemp("qwen")), "qwen3_moe", experts=8, top_k=2, layers=2)


@pytest.fixture
def reqs(tmp_path):
    p = tmp_path / "req.json"
    rng = np.random.default_rng(5)
    p.write_text(json.dumps({"input_ids": [rng.integers(0, 128, n).tolist() for n in (3, 9, 5, 12, 7)]}))
    return str(p)


def _zepp(capfd, *args) -> tuple[int, str, str]:
    """``zepp generate ARGS`` in this process: ``(exit code, stdout, stderr)``."""
    capfd.readouterr()
    try:
        zepp_main(["generate", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capfd.readouterr()
    return code, out, err


def _validate(**kw):
    from zepp.cli.generate import validate

    o = dict(checkpoint=None, nodes=1, gpus_per_node=2, system="a2av", input_ids=None, max_new_tokens=4,
             json_path=None, check=False, emulate=False, rate_mbit=None, delay_ms=0.0, record=None, history=None,
             device="cpu", relaxation=0.25, extra=2, timeout=30.0, threads=1, emulate_prefix="zgen", fault=None)
    o.update(kw)
    return validate(o)


@pytest.mark.parametrize("kw,msg", [
    (dict(gpus_per_node=3), "do not divide over 3 ranks"),
    (dict(history="/nonexistent"), "no layer_000.txt"),
    (dict(extra=9), "--extra must be an integer at least 0 and at most 8"),
])
def test_bad_options_are_one_clear_error(ckpt, reqs, kw, msg):
    kw = {"checkpoint": ckpt, "input_ids": reqs, **kw}
    with pytest.raises(ZeppInputError, match=msg):
        _validate(**kw)


def test_bad_input_ids(ckpt, tmp_path, capfd):
    for body, msg in (({"input_ids": [[1, 2], [500]]}, r"request 1 holds 500"), ({"ids": []}, "unknown key 'ids'"),
                      ({"max_new_tokens": [1]}, "expected"),
                      ({"input_ids": [[]]}, "request 0 is not a non-empty list"),
                      ({"input_ids": [[1]], "max_new_tokens": [0]}, "max_new_tokens must be")):
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(body))
        with pytest.raises(ZeppInputError, match=msg):
            _validate(checkpoint=ckpt, input_ids=str(p))
    code, _, err = _zepp(capfd, "--checkpoint", ckpt, "--input-ids", str(tmp_path / "missing.json"))
    assert code == 2 and err.strip().splitlines() == [f"zepp: error: --input-ids {str(tmp_path / 'missing.json')!r} "
                                                      f"does not exist"], err


def test_record_then_history_with_check(ckpt, reqs, tmp_path, capfd, monkeypatch):
    """... and nothing else is left: no temporary file or lock beside the outputs, nothing in
    ``TMPDIR`` (no ``torchinductor_<user>`` folder either)."""
    from zepp.traces import read_load_histogram, read_trace

    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)
    rec, out = tmp_path / "rec", tmp_path / "out.json"
    code, _, err = _zepp(capfd, "--checkpoint", ckpt, "--nodes", "1", "--gpus-per-node", "2", "--system", "a2av",
                         "--input-ids", reqs, "--max-new-tokens", "6", "--record", str(rec), "--check", "--json",
                         str(out))
    assert code == 0, err
    rep = json.loads(out.read_text())
    assert rep["system"] == "a2av" and rep["matches_reference"] and len(rep["output_ids"]) == 5
    assert all(len(o) == 6 for o in rep["output_ids"]) and rep["prefill_tokens_per_s"] > 0
    rows = sum(rep["rows_per_step"])
    for i in range(2):
        tr = read_trace(str(rec / f"layer_{i:03d}.txt"), num_experts=8, top_k=2)
        assert len(tr) == rows  # every live token of every step, nothing else
        assert np.array_equal(read_load_histogram(str(rec / "load.json"), layer=i),
                              np.bincount(tr.topk_ids.ravel(), minlength=8))
    code, _, err = _zepp(capfd, "--checkpoint", ckpt, "--nodes", "2", "--gpus-per-node", "1", "--system",
                         "eplb,zepp-overlap", "--history", str(rec), "--input-ids", reqs, "--max-new-tokens", "6",
                         "--check", "--json", str(out))
    assert code == 0, err
    rep2 = json.loads(out.read_text())
    assert rep2["systems"]["eplb"]["output_ids"] == rep["output_ids"]
    assert all(s["matches_reference"] for s in rep2["systems"].values())
    assert sorted(os.listdir(rec)) == ["layer_000.txt", "layer_001.txt", "load.json"]
    assert sorted(os.listdir(tmp_path)) == ["out.json", "rec", "req.json", "tmpdir"] and os.listdir(tmpdir) == []


def test_dead_rank_ends_the_run_naming_it(ckpt, reqs, capfd):
    """A rank that dies mid-generation (exit 17): every rank ends, the command exits 3 naming it
    and not the peer that only noticed; no rank process is left."""
    fault = json.dumps({"rank": 1, "step": 3, "mode": "die"})
    code, _, err = _zepp(capfd, "--checkpoint", ckpt, "--nodes", "1", "--gpus-per-node", "2", "--system",
                         "zepp-overlap", "--input-ids", reqs, "--max-new-tokens", "8", "--timeout", "600",
                         "--fault", fault)
    assert code == 3, err
    first = err.splitlines()[0]
    assert first.startswith("zepp generate: rank 1 died (fault injection)"), first
    assert "; rank 0 " not in first and "exit codes by rank: [3, 17]" in first, first
    assert "zepp generate rank 0: communication failed" in err and "Timed out" not in err, err
    assert not _my_ranks()


def test_nan_weights_are_refused_by_the_rank_that_loads_them(ckpt, reqs, tmp_path, capfd, monkeypatch):
    """NaN in an expert's weights: the rank that holds that expert refuses, the command prints
    one line naming the tensor and the rank, exit code 2; no rank or temp folder is left."""
    import shutil
    import tempfile

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nan"
    shutil.copytree(ckpt, bad)
    t = load_file(str(bad / "model.safetensors"))
    name = "model.layers.1.mlp.experts.5.down_proj.weight"  # expert 5 of 8: rank 1's at home placement
    t[name][0, 0] = float("nan")
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # the launcher's temp folder goes to TMPDIR
    code, out, err = _zepp(capfd, "--checkpoint", str(bad), "--nodes", "1", "--gpus-per-node", "2", "--system",
                           "a2av", "--input-ids", reqs, "--max-new-tokens", "2")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("zepp: error: ") and f"tensor {name} holds NaN or Inf" in lines[0], lines[0]
    assert lines[0].endswith("(found by rank 1)"), lines[0]
    assert not _my_ranks() and not list(tmp.iterdir())


def _my_ranks() -> list[int]:
    """Pids of rank processes this test process started that are still alive."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            cmd = open(f"/proc/{p}/cmdline").read()
        except OSError:
            continue
        if ppid == os.getpid() and "zepp.serve.rank" in cmd:
            out.append(int(p))
    return out


def test_stacked_checkpoint_layout(tmp_path):
    """transformers 5's stacked expert tensors: only the asked row is read."""
    from safetensors.torch import save_file

    from zepp.serve.checkpoint import Checkpoint

    (tmp_path / "config.json").write_text("{}")
    gu, dn = torch.randn(4, 6, 5), torch.randn(4, 5, 3)
    save_file({"m.layers.0.mlp.experts.gate_up_proj": gu, "m.layers.0.mlp.experts.down_proj": dn},
              str(tmp_path / "model.safetensors"))
    ck = Checkpoint(tmp_path)
    a, b = ck.expert_weights("m.layers.0.mlp", 2)
    assert torch.equal(a, gu[2]) and torch.equal(b, dn[2])
    assert ck.bytes_read == (6 * 5 + 5 * 3) * 4
    with pytest.raises(ZeppInputError, match="no weights of expert"):
        ck.expert_weights("m.layers.1.mlp", 0)


def test_deal_balances_prompt_tokens():
    from zepp.serve.engine import deal

    d = deal([10, 1, 1, 1, 9, 2], 2)
    assert sorted(sum(d, [])) == list(range(6))
    load = [sum([10, 1, 1, 1, 9, 2][i] for i in r) for r in d]
    assert max(load) - min(load) <= 1
    assert deal([3], 4) == [[0], [], [], []]  # ranks without requests still take part


def _netns_ok():
    from zepp.emulate.topology import availability

    return availability()


@pytest.mark.netns
@pytest.mark.skipif(not _netns_ok()[0], reason=f"emulated cluster unavailable: {_netns_ok()[1]}")
def test_emulated_cluster(ckpt, reqs, tmp_path, capfd, netns_prefix):
    from zepp.emulate import inventory

    out, prefix = tmp_path / "emu.json", netns_prefix("gn")
    code, _, err = _zepp(capfd, "--checkpoint", ckpt, "--nodes", "2", "--gpus-per-node", "1", "--system",
                         "zepp-direct", "--emulate", "--rate-mbit", "500", "--emulate-prefix", prefix, "--input-ids",
                         reqs, "--max-new-tokens", "4", "--check", "--json", str(out))
    assert code == 0, err
    assert inventory.list_namespaces(prefix) == []
    rep = json.loads(out.read_text())
    assert rep["matches_reference"]
    wire = rep["wire_nic_tx_bytes"]
    assert wire is not None and wire["total"] >= rep["nic_bytes"] > 0


def test_unknown_block_parts_are_refused():
    """A MoE block with a part zepp would silently drop is refused, naming the part."""
    from torch import nn

    from zepp.serve.moe_blocks import UnsupportedBlock, find_moe_blocks

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.zeros(4, 6, 5))
            self.down_proj = nn.Parameter(torch.zeros(4, 5, 3))
            self.act_fn = nn.SiLU()

    class Router(nn.Module):
        top_k = 2

    class Block(nn.Module):
        def __init__(self, extra):
            super().__init__()
            self.gate, self.experts = Router(), Experts()
            if extra:
                self.bias_mlp = nn.Linear(5, 5)

    assert [n for n, _ in find_moe_blocks(nn.Sequential(Block(False)))] == ["0"]
    with pytest.raises(UnsupportedBlock, match="bias_mlp"):
        find_moe_blocks(nn.Sequential(Block(True)))
