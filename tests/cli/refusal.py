"""The runner and the fixtures of the bad-input table (``tests/cli/test_cli_bad_inputs.py``).

``refusal_line`` runs ``zepp ARGV`` in-process (``clirun.run_cli``) inside a folder of the test's
own, with ``TMPDIR`` pointed at another, and checks the refusal every case must give: exit code 2,
exactly one line on stderr and it starts ``zepp: error:``, no traceback, nothing on stdout (no work
started), the ``TMPDIR`` empty afterwards, no child process left and no file written beside the
fixtures. ``materialise`` makes the fixtures a case names in braces (traces, a named pipe, tiny
and broken checkpoints, prompts, cluster files, histories, resume files, hard and symbolic links).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

import hostile_files
from clirun import run_cli


def make_tiny_checkpoint(folder: Path) -> Path:
    """A tiny qwen3_moe checkpoint (2 MoE layers, 8 experts, 512 positions) in ``folder``."""
    from zepp.serve.tiny import make_checkpoint

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


def materialise(argv: list[str], tmp: Path, tiny: Path | None) -> list[str]:
    """``argv`` with every ``{kind...}`` placeholder replaced by the fixture it names, made in ``tmp``
    (a JSON object, ``{"rank": 1}``, is a value, not a placeholder)."""
    out = []
    for a in argv:
        a = a.replace("{out}", str(tmp))
        if a.startswith("{afile}/"):  # a path below a file
            a = _fixture("afile", "", tmp, tiny) + a[len("{afile}"):]
        elif a.startswith("{") and a.endswith("}") and a[1:2].isalpha():
            kind, _, spec = a[1:-1].partition(":")
            a = _fixture(kind, spec, tmp, tiny)
        out.append(a)
    return out


def _fixture(kind: str, spec: str, tmp: Path, tiny: Path | None) -> str:
    if kind == "trace":
        return _trace(tmp / "trace.txt", 16)
    if kind == "trace64":
        return _trace(tmp / "trace64.txt", 64, 8)
    if kind == "garbage":  # a file that is not a trace
        (tmp / "garbage.txt").write_text("hello world\nnot ids\n")
        return str(tmp / "garbage.txt")
    if kind == "fifo":  # a named pipe: reading it would block
        os.mkfifo(tmp / "fifo.txt")
        return str(tmp / "fifo.txt")
    if kind == "tabledir":  # --out p.json whose table file's name (p.zepp-table.json) is a folder
        (tmp / "p.zepp-table.json").mkdir()
        return str(tmp / "p.json")
    if kind == "afile":
        (tmp / "a-file").write_text("x")
        return str(tmp / "a-file")
    if kind == "ck":
        return _checkpoint(spec, tiny, tmp)
    if kind == "prompts":
        return _prompts(spec, tmp)
    if kind.startswith("file"):  # a file of the given suffix holding the text after the colon
        p = tmp / ("f" + kind[len("file"):])
        p.write_text(spec)
        return str(p)
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
    if kind in hostile_files.KINDS:  # the reading section's fixtures (issue 29)
        return hostile_files.make(kind, spec, tmp, tiny)
    if kind in ("hardlink", "symlink"):  # a second name for a fixture made before it in the argv (or a device)
        link = tmp / f"{kind}-{spec.replace('/', '_')}"
        (os.link if kind == "hardlink" else os.symlink)(tmp / spec, link)
        return str(link)
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


def refusal_line(argv: list[str], work: Path, tmpdir: Path, capfd) -> str:
    """The one line ``zepp ARGV`` prints when run in ``work`` with ``TMPDIR=tmpdir`` (both exist;
    the caller has pointed the process there), after checking the refusal (module docstring)."""
    before = set(work.rglob("*"))
    kids = _children()
    capfd.readouterr()  # what making the fixtures printed (the checkpoint writer's progress bar)
    code, out, err = run_cli(argv, capfd)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (argv, code, out, err)
    assert len(lines) == 1 and lines[0].startswith("zepp: error: "), (argv, err)
    assert "Traceback" not in err and "generate rank" not in err and "worker rank" not in err, err
    assert out.strip() == "", (argv, out)  # no work started: nothing read, planned or reported
    assert not list(tmpdir.iterdir()), f"left in TMPDIR: {list(tmpdir.iterdir())}"
    assert _children() <= kids, "a process was left behind"
    made = set(work.rglob("*")) - before
    assert not made, f"written before refusing: {made}"
    return lines[0]


def in_own_folders(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """``(work, tmpdir)`` below ``tmp_path``: the process runs in ``work`` and its temp folders go
    to ``tmpdir``, so ``refusal_line`` sees exactly what a case leaves behind."""
    work, tmpdir = tmp_path / "work", tmp_path / "tmpdir"
    work.mkdir()
    tmpdir.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
    return work, tmpdir
