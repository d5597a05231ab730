"""The probe table (issue 20): bad input to every command, as a careless or hostile user gives it.

Each case runs ``zepp ARGV`` in-process (``clirun.run_cli``) with its own ``TMPDIR`` and asserts:
exit code 2, exactly one line on stderr and it starts ``zepp: error:``, no traceback, nothing on
stdout (no work started), the ``TMPDIR`` empty afterwards, no child process left and no file
written beside the fixtures. The fixtures (tiny and broken checkpoints, histories, cluster files,
resume files) are made here, in ``tmp_path``. ``tests/cli/test_cli_options.py`` holds the option
table of the shared launcher options; this table covers the other categories (``CATEGORIES``).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from clirun import run_cli

SMALL_PLAN = ["plan", "--model", "olmoe", "--experts", "16", "--topk", "2", "--hidden", "64", "--nodes", "2",
              "--gpus-per-node", "2", "--budget-mb", "0.01", "--iters", "1", "--trace", "{trace}"]
PLAN_FILE = ["plan", "--model", "olmoe", "--nodes", "2", "--budget-mb", "0.1", "--iters", "1", "--trace", "{trace64}"]
BENCH = ["bench", "--nodes", "1", "--models", "k2", "--budgets", "1", "--iters", "1", "--warmup", "0", "--jobs", "1",
         "--systems", "a2av"]
TIMELINE = ["timeline", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5", "--out", "{out}/t.png"]
PLACE = ["place", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2",
         "--redundant", "4", "--format", "zepp", "--out", "{out}/p.json"]
PLACE_H = ["place", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2", "--redundant", "4", "--format", "zepp",
           "--out", "{out}/p.json", "--history"]
RUN = ["run", "--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--experts", "8", "--topk", "2",
       "--hidden", "16", "--ffn", "8", "--warmup", "0", "--iters", "1", "--systems", "a2av"]
GEN = ["generate", "--nodes", "1", "--gpus-per-node", "2", "--system", "a2av", "--input-ids", "{prompts}",
       "--max-new-tokens", "4"]
GEN_CK = GEN + ["--checkpoint", "{ck}"]
ABLATION = ["ablation", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5", "--iters", "1"]

# ----------------------------------------------------------------------------- the cases
# (category, argv); placeholders in braces are fixtures made by ``_materialise``

USAGE = [  # click's own errors, as zepp's one line
    ["nosuch"], ["plan", "--nosuch"], ["plan", "--nodes", "abc"], ["plan", "--model", "gpt"], ["plan", "--seed", "x"],
    ["plan", "--budget-mb", "lots"], ["plan", "--nodes"], ["bench", "--sweep", "strong"], ["bench", "--iters", "1.5"],
    ["bench", "extra-arg"], ["timeline", "--nodes", "two"], ["timeline", "--bogus", "1"],
    ["place", "--format", "foo", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--out", "x.json"],
    ["place", "--model", "olmoe"], ["place", "--nodes", "2.5"], ["run", "--dtype", "float8"], ["run", "--threads", "x"],
    ["generate"], ["generate", "--checkpoint", "x"], ["generate", "--max-new-tokens", "many"],
    ["cluster", "nosuch"], ["cluster", "up", "--nodes", "x"], ["cluster", "check", "--timeout", "soon"],
    ["cluster", "down", "--bogus"], ["systems", "--bogus"], ["systems", "extra"],
]

NUMBERS = [  # finite, in range, integers where counts are meant, seeds non-negative
    SMALL_PLAN + ["--seed", "-1"], SMALL_PLAN + ["--seed", str(2**64)], SMALL_PLAN + ["--nodes", "0"],
    SMALL_PLAN + ["--nodes", "100000"], SMALL_PLAN + ["--gpus-per-node", "0"], SMALL_PLAN + ["--budget-mb", "nan"],
    SMALL_PLAN + ["--budget-mb", "-1"], SMALL_PLAN + ["--budget-mb", "inf"], SMALL_PLAN + ["--iters", "-3"],
    SMALL_PLAN + ["--relaxation", "-0.5"], SMALL_PLAN + ["--relaxation", "inf"], SMALL_PLAN + ["--extra", "-1"],
    SMALL_PLAN + ["--experts", "0"], SMALL_PLAN + ["--topk", "0"],
    BENCH + ["--seed", "-1"], BENCH + ["--warmup", "-1"], BENCH + ["--gpus-per-node", "0"], BENCH + ["--nodes", "0"],
    BENCH + ["--nodes", "-4"], BENCH + ["--budgets", "nan"], BENCH + ["--budgets", "-1"], BENCH + ["--jobs", "100000"],
    BENCH + ["--iters", "0"],
    TIMELINE + ["--seed", "-1"], TIMELINE + ["--gpus-per-node", "0"], TIMELINE + ["--nodes", "0"],
    TIMELINE + ["--budget-mb", "nan"], TIMELINE + ["--budget-mb", "0"], TIMELINE + ["--ranks", "99"],
    TIMELINE + ["--ranks", "-1"],
    PLACE + ["--seed", "-1"], PLACE + ["--nodes", "0"], PLACE + ["--gpus-per-node", "0"], PLACE + ["--iters", "0"],
    PLACE + ["--heldout", "-0.1"], PLACE + ["--heldout", "nan"], PLACE + ["--sim-layers", "-1"],
    PLACE + ["--redundant", "-4"], PLACE + ["--budget-mb", "nan"], PLACE + ["--relaxation", "-1"],
    RUN + ["--seed", "-1"], RUN + ["--warmup", "-1"], RUN + ["--tokens", "0"], RUN + ["--threads", "100000"],
    RUN + ["--timeout", "-1"], RUN + ["--extra", "-2"],
    GEN_CK + ["--max-new-tokens", "1000000000"], GEN_CK + ["--max-new-tokens", "-1"], GEN_CK + ["--timeout", "nan"],
    GEN_CK + ["--threads", "100000"], GEN_CK + ["--extra", "-1"], GEN_CK + ["--relaxation", "inf"],
    ["cluster", "up", "--nodes", "0"], ["cluster", "up", "--nic-mtu", "0"], ["cluster", "check", "--timeout", "nan"],
    ["cluster", "check", "--timeout", "0"],
    ABLATION + ["--seed", "-1"], ABLATION + ["--period", "0"], ABLATION + ["--nodes", "0"],
    ABLATION + ["--budget-mb", "nan"], ABLATION + ["--iters", "0"], ABLATION + ["--schedules", "rotating,,unseen"],
    ABLATION + ["--schedules", "nosuch"], ABLATION + ["--model", "gpt"], ABLATION + ["--cluster", "tpu"],
    ABLATION + ["--gpus-per-node", "0"], ABLATION + ["--traces", "/nonexistent-zepp"], ABLATION + ["--period", "x"], BENCH + ["--nodes", "1,,2"], BENCH + ["--budgets", ","],
    BENCH + ["--schedule", "nosuch"], SMALL_PLAN + ["--schedule", "drifting"], TIMELINE + ["--schedule", "x"],
    RUN + ["--schedule", "rotate"],
]

OUTPUTS = [  # the folder exists and is writable, the path is not a folder, the writer supports the suffix
    SMALL_PLAN + ["--json", "{out}"], SMALL_PLAN + ["--json", "/nonexistent-zepp/p.json"],
    SMALL_PLAN + ["--json", "/proc/zepp-p.json"], SMALL_PLAN + ["--json", "{afile}/p.json"],
    SMALL_PLAN + ["--dump", "{afile}"], SMALL_PLAN + ["--dump", "/nonexistent-zepp/a/b"],
    SMALL_PLAN + ["--json", ""], BENCH + ["--json", ""], BENCH + ["--plot", ""], PLACE + ["--report", ""],
    RUN + ["--json", ""], GEN_CK + ["--json", ""], ["cluster", "calibrate", "--json", ""],
    BENCH + ["--json", "{out}"], BENCH + ["--json", "/proc/zepp-b.json"], BENCH + ["--plot", "{out}/b.xyz"],
    BENCH + ["--plot", "{out}/b"], BENCH + ["--plot", "{out}"], BENCH + ["--plot", "/nonexistent-zepp/b.png"],
    BENCH + ["--json", "{out}/b.json", "--plot", "{out}/b.docx"],
    ABLATION + ["--plot", "{out}/a.xyz"], ABLATION + ["--json", "{out}"], ABLATION + ["--plot", "/proc/zepp-a.png"],
    TIMELINE + ["--out", "{out}/t.xyz"], TIMELINE + ["--out", "{out}/t"], TIMELINE + ["--out", "{out}"],
    TIMELINE + ["--out", "/proc/zepp-t.png"], TIMELINE + ["--out", "{afile}/t.png"],
    PLACE + ["--out", "{out}"], PLACE + ["--out", "/proc/zepp-p.json"], PLACE + ["--report", "{out}"],
    PLACE + ["--report", "/proc/zepp-r.json"],
    RUN + ["--json", "{out}"], RUN + ["--json", "{afile}/r.json"],
    GEN_CK + ["--json", "{out}"], GEN_CK + ["--json", "/proc/zepp-g.json"], GEN_CK + ["--record", "{afile}"],
    GEN_CK + ["--record", "/nonexistent-zepp/a/rec"],
    ["cluster", "calibrate", "--json", "/nonexistent-zepp/c.json"], ["cluster", "calibrate", "--json", "{out}"],
]

CHECKPOINTS = [GEN + ["--checkpoint", c] for c in (
    "{ck:config=vocab_size:lots}", "{ck:config=hidden_size:-4}", "{ck:config=num_hidden_layers:0}",
    "{ck:config=vocab_size:true}", "{ck:config=num_attention_heads:1.5}", "{ck:config=max_position_embeddings:-1}",
    "{ck:config=model_type:nosuch_moe}", "{ck:config=model_type:null}", "{ck:config=model_type:llama}",
    "{ck:config=num_hidden_layers:3}", "{ck:config=num_local_experts:16}", "{ck:config=moe_intermediate_size:32}",
    "{ck:config=hidden_size:64}", "{ck:config=vocab_size:256}", "{ck:config_text={}",
    "{ck:config_text=[1, 2]}", "{ck:config_text=}", "{ck:empty}", "{ck:truncated}", "{ck:short}",
    "{ck:header_length}", "{ck:header_garbage}", "{ck:header_list}", "{ck:bad_offsets}", "{ck:bad_dtype}",
    "{ck:missing_tensor}", "{ck:index_garbage}", "{ck:index_missing_file}", "{ck:index_wrong_file}",
    "{ck:index_escape}", "{ck:no_config}", "{ck:no_weights}", "{afile}", "/nonexistent-zepp-ck",
)]

GEN_PROMPTS = ["generate", "--nodes", "1", "--gpus-per-node", "2", "--system", "a2av", "--checkpoint", "{ck}",
               "--input-ids"]
LIMITS = [  # prompt + new tokens against max_position_embeddings (512 in the tiny checkpoints)
    GEN_PROMPTS + ["{prompts:600}"], GEN_PROMPTS + ["{prompts:512}"],
    GEN_PROMPTS + ["{prompts:500}", "--max-new-tokens", "100"], GEN_PROMPTS + ["{prompts:510:per}"],
    GEN_PROMPTS + ["{prompts:bad_token}"], GEN_PROMPTS + ["{prompts:empty}"],
]

CLUSTER_TEXTS = [
    "gemm_eff_max: 7", "gemm_eff_max: 0", "gemm_eff_max: -0.5", "gemm_rows_half: 0", "weight_copy_bw: 0",
    "nic_msg_cost: 1e30", "nvlink_msg_cost: 1", "nvlink_bw: 1e-300", "nic_bw: 0", "nic_bw: .nan", "nic_bw: .inf",
    "peak_flops: 1e30", "hbm_bw: -1", "kernel_launch: -1e-6", "nvlink_bw: fast", "nvlink_bw: true",
    "nodes: 0", "nodes: 2.5", "gpus_per_node: 100000", "gpus_per_node: 0", "nic_speed: 3", "base: tpu",
    "name: ''", "nvlink_bw: [1, 2]", "nodes: [1", "- 1\n- 2", "just text", "nic_bw: 2.0e10\nnic_bw: 4.0e10",
]
CLUSTER_FILES = ([SMALL_PLAN + ["--cluster-file", "{cluster:" + t + "}"] for t in CLUSTER_TEXTS]
                 + [PLACE + ["--cluster-file", "{cluster:" + t + "}"] for t in CLUSTER_TEXTS[:12]]
                 + [SMALL_PLAN + ["--cluster-file", "{cluster.json:{\"nic_bw\": NaN}}"],
                    SMALL_PLAN + ["--cluster-file", "{cluster.json:{\"nic_bw\": -1}}"],
                    SMALL_PLAN + ["--cluster-file", "{cluster.json:[1, 2]}"],
                    SMALL_PLAN + ["--cluster-file", "{cluster.json:{\"nic_bw\": 2e10, \"nic_bw\": 4e10}}"],
                    SMALL_PLAN + ["--cluster-file", "{out}"], PLACE + ["--cluster-file", "/nonexistent-zepp.yaml"],
                    SMALL_PLAN + ["--cluster-file", "{cluster:nodes: 8}"],  # the file and --nodes 2 disagree
                    PLACE + ["--cluster-file", "{cluster:gpus_per_node: 8}"],
                    PLACE + ["--cluster-file", "{cluster:base: h100-8\nnodes: 3}"]])

HISTORIES = [PLACE_H + [h] for h in (
    "{hist:zero}", "{hist:nosteps}", "{hist:overflow}", "{hist:uint64}", "{hist:negative}", "{hist:zero_layer}",
    "{hist:empty.txt}", "{hist:comments.txt}", "{hist:float.npz}", "{hist:nan.npz}",
)] + [GEN_CK + ["--history", "{genhist:" + bad + "}"] for bad in ("0 9", "", "0 1 2", "3 3", "x y")] + [
    PLAN_FILE[:-1] + ["{hist:empty.txt}"], PLAN_FILE[:-2] + ["--history", "{hist:empty.txt}", "--trace",
                                                                  "{trace64}"]]

RESUME = [BENCH + ["--json", "{resume:" + k + "}", "--resume"] for k in (
    "missing_key", "string_latency", "null_latency", "nan_latency", "negative_latency", "inf_bound",
    "bool_nodes", "string_nodes", "run_missing", "run_bad_iters", "systems_missing", "not_json", "rows_not_list",
    "row_not_dict", "bad_budget", "detail_bad",
)]

CATEGORIES = {"click usage": USAGE, "numbers": NUMBERS, "output paths": OUTPUTS, "checkpoints": CHECKPOINTS,
              "generation limits": LIMITS, "cluster files": CLUSTER_FILES, "histories": HISTORIES,
              "resume files": RESUME}
CASES = [(cat, argv) for cat, rows in CATEGORIES.items() for argv in rows]


def test_the_table_holds_150_cases_over_every_command():
    commands = {argv[0] for _, argv in CASES}
    assert len(CASES) >= 150, len(CASES)
    assert {"bench", "plan", "timeline", "run", "generate", "place", "cluster", "systems", "ablation"} <= commands


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_ck(tmp_path_factory) -> Path:
    """A tiny qwen3_moe checkpoint (2 MoE layers, 8 experts, 512 positions), made once."""
    from zepp.serve.tiny import make_checkpoint

    folder = tmp_path_factory.mktemp("ck") / "tiny"
    make_checkpoint(folder, "qwen3_moe")
    return folder


def _trace(path: Path, experts: int, k: int = 2) -> str:
    rows = np.argsort(np.random.default_rng(0).random((400, experts)), axis=1)[:, :k]
    path.write_text("".join(" ".join(map(str, r)) + "\n" for r in rows))
    return str(path)


def _safetensors_parts(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_safetensors(path: Path, head: dict, data: bytes) -> None:
    h = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _break_weights(d: Path, how: str) -> None:
    st = d / "model.safetensors"
    head, data = _safetensors_parts(st)
    name = next(k for k in head if k != "__metadata__" and "experts" in k)
    if how == "empty":
        st.write_bytes(b"")
    elif how == "truncated":
        st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    elif how == "short":
        st.write_bytes(b"\x01\x02\x03")
    elif how == "header_length":
        st.write_bytes(struct.pack("<Q", 1 << 40) + st.read_bytes()[8:])
    elif how == "header_garbage":
        st.write_bytes(struct.pack("<Q", 12) + b"not json!!!!" + data)
    elif how == "header_list":
        st.write_bytes(struct.pack("<Q", 2) + b"[]" + data)
    elif how == "bad_offsets":
        head[name]["data_offsets"] = [0, 3]
        _write_safetensors(st, head, data)
    elif how == "bad_dtype":
        head[name]["dtype"] = "Q7"
        _write_safetensors(st, head, data)
    elif how == "missing_tensor":
        del head[name]
        _write_safetensors(st, head, data)


def _break_index(d: Path, how: str) -> None:
    head, _ = _safetensors_parts(d / "model.safetensors")
    wm = {k: "model.safetensors" for k in head if k != "__metadata__"}
    first = next(iter(wm))
    if how == "index_garbage":
        text = "{weight_map: nope"
    else:
        target = {"index_missing_file": "model-2.safetensors", "index_wrong_file": "other.safetensors",
                  "index_escape": "../tiny/model.safetensors"}[how]
        wm[first] = target
        if how == "index_wrong_file":
            shutil.copy(d / "model.safetensors", d / "other.safetensors")
            head2, data2 = _safetensors_parts(d / "other.safetensors")
            del head2[first]
            _write_safetensors(d / "other.safetensors", head2, data2)
        text = json.dumps({"weight_map": wm})
    (d / "model.safetensors.index.json").write_text(text)


def _checkpoint(spec: str, tiny: Path, tmp: Path) -> str:
    """A copy of the tiny checkpoint broken as ``spec`` says (``config=KEY:JSON``, ``config_text=TEXT``
    or one of the ways in ``_break_weights`` / ``_break_index``)."""
    d = tmp / "ck"
    shutil.copytree(tiny, d)
    if spec.startswith("config="):
        key, value = spec[len("config="):].split(":", 1)
        cfg = json.loads((d / "config.json").read_text())
        try:
            cfg[key] = json.loads(value)
        except ValueError:
            cfg[key] = value  # a plain string
        (d / "config.json").write_text(json.dumps(cfg))
    elif spec.startswith("config_text="):
        (d / "config.json").write_text(spec[len("config_text="):])
    elif spec == "no_config":
        (d / "config.json").unlink()
    elif spec == "no_weights":
        (d / "model.safetensors").unlink()
    elif spec.startswith("index_"):
        _break_index(d, spec)
    elif spec:
        _break_weights(d, spec)
    return str(d)


def _prompts(spec: str, tmp: Path) -> str:
    p = tmp / "prompts.json"
    if spec == "bad_token":
        obj = {"input_ids": [[1, 2, 128]]}
    elif spec == "empty":
        obj = {"input_ids": []}
    elif spec.endswith(":per"):
        n = int(spec.split(":")[0])
        obj = {"input_ids": [[1] * 4, [1] * n], "max_new_tokens": [3, 4]}
    else:
        obj = {"input_ids": [[1] * (int(spec) if spec else 3), [4, 5]]}
    p.write_text(json.dumps(obj))
    return str(p)


def _history(spec: str, tmp: Path) -> str:
    """olmoe histories (16 MoE layers, 64 experts) with no signal, or counts that overflow."""
    if spec.endswith(".txt"):
        p = tmp / spec
        p.write_text("" if spec == "empty.txt" else "# only comments\n# here\n")
        return str(p)
    p = tmp / (spec if spec.endswith(".npz") else spec + ".npz")
    m = np.tile(np.arange(64), (16, 1))
    w = np.ones((4, 16, 64), np.int64)
    if spec == "zero":
        w[:] = 0
    elif spec == "nosteps":
        w = w[:0]
    elif spec == "overflow":
        w[:] = 2**61
    elif spec == "uint64":
        w = np.full((4, 16, 64), 2**63 + 5, np.uint64)
    elif spec == "negative":
        w[0, 0, 0] = -3
    elif spec == "zero_layer":
        w[:, 5] = 0
    elif spec == "float.npz":
        w = w * 0.5
    elif spec == "nan.npz":
        w = w.astype(float)
        w[1, 1, 1] = np.nan
    np.savez(p, expert_load_window=w, physical_to_logical_map=m)
    return str(p)


_GOOD_ROW = {"cluster": "a100", "nodes": 1, "gpus_per_node": 4, "model": "k2", "budget_mb": 1.0,
             "latency_ms": {"a2av": 1.5}, "lower_bound_ms": 0.1, "measured_ms": None, "variant": {},
             "run": {"systems": ["a2av"], "iters": 1, "warmup": 0, "seed": 0, "traces": None}}


def _resume(spec: str, tmp: Path) -> str:
    """A ``zepp bench --json`` file whose row 1 is broken as ``spec`` says (row 0 is good)."""
    p = tmp / "bench.json"
    bad = json.loads(json.dumps(_GOOD_ROW))
    text = None
    if spec == "missing_key":
        del bad["latency_ms"]
    elif spec == "string_latency":
        bad["latency_ms"]["a2av"] = "fast"
    elif spec == "null_latency":
        bad["latency_ms"]["a2av"] = None
    elif spec == "nan_latency":
        bad["latency_ms"]["a2av"] = float("nan")  # json writes NaN, and reads it back
    elif spec == "negative_latency":
        bad["latency_ms"]["a2av"] = -2.0
    elif spec == "inf_bound":
        bad["lower_bound_ms"] = 1e400
    elif spec == "bool_nodes":
        bad["nodes"] = True
    elif spec == "string_nodes":
        bad["nodes"] = "1"
    elif spec == "run_missing":
        del bad["run"]["seed"]
    elif spec == "run_bad_iters":
        bad["run"]["iters"] = "2"
    elif spec == "systems_missing":
        bad["run"]["systems"] = ["a2av", "fast"]
    elif spec == "not_json":
        text = "{rows: ["
    elif spec == "rows_not_list":
        text = json.dumps({"rows": {"a": 1}})
    elif spec == "row_not_dict":
        bad = [1, 2]
    elif spec == "bad_budget":
        bad["budget_mb"] = 0
    elif spec == "detail_bad":
        (tmp / "bench.detail.json").write_text(json.dumps([_GOOD_ROW, {**_GOOD_ROW, "latency_ms": {"a2av": -1}}]))
    p.write_text(text if text is not None else json.dumps({"rows": [_GOOD_ROW, bad]}))
    return str(p)


def _materialise(argv: list[str], tmp: Path, tiny: Path | None) -> list[str]:
    """``argv`` with every ``{...}`` placeholder replaced by the fixture it names, made in ``tmp``."""
    out = []
    for a in argv:
        a = a.replace("{out}", str(tmp))
        if a.startswith("{afile}/"):  # a path below a file
            a = _fixture("afile", "", tmp, tiny) + a[len("{afile}"):]
        elif a.startswith("{") and a.endswith("}"):
            kind, _, spec = a[1:-1].partition(":")
            a = _fixture(kind, spec, tmp, tiny)
        out.append(a)
    return out


def _fixture(kind: str, spec: str, tmp: Path, tiny: Path | None) -> str:
    if kind == "trace":
        return _trace(tmp / "trace.txt", 16)
    if kind == "trace64":
        return _trace(tmp / "trace64.txt", 64, 8)
    if kind == "afile":
        (tmp / "a-file").write_text("x")
        return str(tmp / "a-file")
    if kind == "ck":
        return _checkpoint(spec, tiny, tmp)
    if kind == "prompts":
        return _prompts(spec, tmp)
    if kind.startswith("cluster"):
        p = tmp / ("c" + (kind[len("cluster"):] or ".yaml"))
        p.write_text(spec + "\n")
        return str(p)
    if kind == "hist":
        return _history(spec, tmp)
    if kind == "resume":
        return _resume(spec, tmp)
    if kind == "genhist":  # a --record folder of the tiny checkpoint (8 experts, top-2) whose layer 1 is bad
        d = tmp / "rec"
        d.mkdir()
        (d / "layer_000.txt").write_text("0 1\n2 3\n")
        (d / "layer_001.txt").write_text(spec + "\n" if spec else "")
        return str(d)
    raise AssertionError(f"unknown fixture {kind}")


def _children() -> set[int]:
    """The pids of this process's live children (from /proc)."""
    me, kids = os.getpid(), set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                kids.add(int(pid))
    return kids


# ----------------------------------------------------------------------------- the probe


@pytest.mark.parametrize("category,argv", CASES, ids=[f"{c}: {' '.join(a)}" for c, a in CASES])
def test_bad_input_is_one_line_exit_2_nothing_left(category, argv, tmp_path, capsys, monkeypatch, request):
    needs_ck = any("{ck" in a or "{prompts" in a for a in argv)
    tiny = request.getfixturevalue("tiny_ck") if needs_ck else None
    work, tmpdir = tmp_path / "work", tmp_path / "tmpdir"
    work.mkdir()
    tmpdir.mkdir()
    args = _materialise(argv, work, tiny)
    before = {p for p in work.rglob("*")}
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
    kids = _children()
    capsys.readouterr()  # what making the fixtures printed (the checkpoint writer's progress bar)
    code, out, err = run_cli(args, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (args, code, out, err)
    assert len(lines) == 1 and lines[0].startswith("zepp: error: "), (args, err)
    assert "Traceback" not in err and "generate rank" not in err and "worker rank" not in err, err
    assert out.strip() == "", (args, out)
    assert not list(tmpdir.iterdir()), f"left in TMPDIR: {list(tmpdir.iterdir())}"
    assert _children() <= kids, "a process was left behind"
    made = {p for p in work.rglob("*")} - before
    assert not made, f"written before refusing: {made}"
