"""One layer's trace files and load histograms: what each format gives, and every bad input
(issue 11 items 3-4: each probe below was once accepted, changed a value, hung or ended in a
traceback) refused with one clear error naming the file, row and field."""

from __future__ import annotations

import builtins
import io
import json
import os
import threading

import numpy as np
import pytest

from zepp.errors import ZeppInputError
from zepp.traces import read_load_histogram, read_trace


def txt(tmp_path, text, name="t.txt"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- text format


def test_text_round_trip(tmp_path):
    p = txt(tmp_path, "0 1 2\n3 4 5\r\n\n  6\t7 8  \n")
    t = read_trace(p, num_experts=9, top_k=3)
    assert t.topk_ids.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert t.topk_ids.dtype == np.int32 and t.top_k == 3 and len(t) == 3 and t.num_experts == 9
    assert t.source == str(p)


def test_text_infers_experts_and_k(tmp_path):
    t = read_trace(txt(tmp_path, "5 1\n2 3"))  # no trailing newline
    assert t.topk_ids.tolist() == [[5, 1], [2, 3]] and t.num_experts == 6 and t.top_k == 2


def test_text_matches_loadtxt_on_random_file(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, size=(500, 8))
    p = tmp_path / "r.txt"
    np.savetxt(p, ids, fmt="%d")
    assert np.array_equal(read_trace(p, num_experts=1000, top_k=8, allow_duplicates=True).topk_ids, ids)


@pytest.mark.parametrize(
    "text, kwargs, needles",
    [
        ("0 1 2\n3 4 500\n", dict(num_experts=384), ["line 2", "500", "[0, 384)", "--experts"]),
        ("0 1 2\n3 4\n5 6 7\n", {}, ["line 2", "has 2 expert ids", "expected 3", "ragged"]),
        ("0 1 2\n\n3 4 5 6\n", {}, ["line 3", "has 4 expert ids", "expected 3"]),
        ("0 1 2\n3 4 5\n", dict(top_k=8), ["3 expert ids", "top-8", "--topk 3"]),
        ("", {}, ["empty"]),
        ("\n \n\n", {}, ["no expert ids"]),
        ("0 1 2\n3 x 5\n", {}, ["line 2", "'x'", "not an integer"]),
        ("0 1 2\n3 4.0 5\n", {}, ["line 2", "'4.0'", "not an integer"]),
        ("0 1 2\n3 - 5\n", {}, ["line 2", "'-'", "not an integer"]),
        ("0 1 2\n3 -4 5\n", dict(num_experts=8), ["line 2", "negative expert id -4"]),
        ("0 1 2\n3 -4 5\n", {}, ["line 2", "negative expert id -4"]),
        ("0 1 2\n3 4 99999999999999\n", dict(num_experts=8), ["line 2", "99999999999999", "out of range"]),
    ],
)
def test_bad_text_inputs(tmp_path, text, kwargs, needles):
    p = txt(tmp_path, text)
    with pytest.raises(ZeppInputError) as exc:
        read_trace(p, **kwargs)
    msg = str(exc.value)
    assert str(p) in msg or "empty" in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_ragged_row_with_wrong_k_everywhere_else(tmp_path):
    with pytest.raises(ZeppInputError, match=r"line 1 has 3 expert ids, expected 8 \(top-8\)"):
        read_trace(txt(tmp_path, "0 1 2\n3 4\n"), top_k=8)


@pytest.mark.parametrize("value", ["4294967296", "2147483648"])
def test_ids_beyond_int32_never_wrap(tmp_path, value):
    p = txt(tmp_path, f"0 1\n2 {value}\n")
    with pytest.raises(ZeppInputError, match=rf"line 2: expert id {value} .*int32"):
        read_trace(p)
    np.savez(tmp_path / "u.npz", topk_ids=np.array([[0, int(value)]], dtype=np.uint64))
    with pytest.raises(ZeppInputError, match=rf"value {value} at index \[0, 1\] exceeds the int32 range"):
        read_trace(tmp_path / "u.npz")


def test_no_absurd_inferred_expert_count(tmp_path):
    with pytest.raises(ZeppInputError, match=r"line 1: expert id 999999999 would mean 1000000000 experts"):
        read_trace(txt(tmp_path, "999999999 1\n"))
    with pytest.raises(ZeppInputError, match=r"more than 10 digits"):
        read_trace(txt(tmp_path, "10000000000 1\n", "b.txt"))
    assert read_trace(txt(tmp_path, "5 1\n", "ok.txt")).num_experts == 6


@pytest.mark.parametrize("token, needle", [("nan", "'nan' is not an integer"), ("inf", "'inf' is not an integer"),
                                           ("99999999999", "more than 10 digits")])
def test_nan_and_huge_text_ids_named_as_they_are(tmp_path, token, needle):
    with pytest.raises(ZeppInputError) as exc:
        read_trace(txt(tmp_path, f"0 1\n3 {token}\n"), num_experts=8)
    assert needle in str(exc.value) and "negative" not in str(exc.value) and "line 2" in str(exc.value)


def test_duplicate_ids_in_one_token_refused_by_default(tmp_path):
    p = txt(tmp_path, "0 1 2 3\n1 1 1 1\n")
    with pytest.raises(ZeppInputError, match=r"line 2: expert id 1 appears twice .*allow_duplicates=True"):
        read_trace(p, num_experts=4)
    assert read_trace(p, num_experts=4, allow_duplicates=True).topk_ids.tolist()[1] == [1, 1, 1, 1]
    np.savez(tmp_path / "d.npz", topk_ids=np.array([[0, 1], [2, 2]]))
    with pytest.raises(ZeppInputError, match=r"row \(0-based\) 1: expert id 2 appears twice"):
        read_trace(tmp_path / "d.npz", num_experts=4)


def test_streaming_chunks_give_the_same_ids(tmp_path):
    from zepp.traces.formats.text import read_text_ids

    rng = np.random.default_rng(0)
    ids = np.argsort(rng.random((3000, 64)), axis=1)[:, :8]
    p = tmp_path / "r.txt"
    lines = [" ".join(map(str, r)) for r in ids]
    lines[5] = "  " + lines[5] + " \r"  # odd whitespace
    p.write_text("\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:]))  # a blank line, no final newline
    for chunk in (7, 64, 1000, 1 << 20):
        got, e = read_text_ids(p, 8, 64, chunk_bytes=chunk)
        assert np.array_equal(got, ids) and e == 64
    with pytest.raises(ZeppInputError, match="line 102 has 7 expert ids"):
        q = tmp_path / "bad.txt"
        q.write_text("\n".join(lines[:100]) + "\n\n" + "1 2 3 4 5 6 7\n")
        read_text_ids(q, 8, 64, chunk_bytes=16)


# ---------------------------------------------------------------- npz and SGLang dumps


def test_npz_named_and_single_array(tmp_path):
    ids = np.array([[0, 3], [2, 1]], dtype=np.int64)
    w = np.array([[0.7, 0.3], [0.5, 0.5]], dtype=np.float32)
    np.savez(tmp_path / "a.npz", topk_ids=ids, topk_weights=w, other=np.zeros(3))
    t = read_trace(tmp_path / "a.npz", num_experts=4, top_k=2)
    assert t.topk_ids.tolist() == ids.tolist() and np.allclose(t.topk_weights, w)
    np.savez(tmp_path / "b.npz", ids)
    assert read_trace(tmp_path / "b.npz").topk_ids.tolist() == ids.tolist()


def test_npz_bad_inputs(tmp_path):
    np.savez(tmp_path / "r.npz", topk_ids=np.array([[0, 1], [2, 9]]))
    with pytest.raises(ZeppInputError, match=r"row \(0-based\) 1: expert id 9 .*\[0, 4\)"):
        read_trace(tmp_path / "r.npz", num_experts=4)
    np.savez(tmp_path / "m.npz", x=np.zeros((2, 2), int), y=np.zeros((2, 2), int))
    with pytest.raises(ZeppInputError, match="no array named 'topk_ids'"):
        read_trace(tmp_path / "m.npz")
    np.savez(tmp_path / "e.npz", topk_ids=np.zeros((0, 8), int))
    with pytest.raises(ZeppInputError, match="empty"):
        read_trace(tmp_path / "e.npz")
    np.savez(tmp_path / "k.npz", topk_ids=np.zeros((3, 6), int))
    with pytest.raises(ZeppInputError, match="top-8"):
        read_trace(tmp_path / "k.npz", top_k=8)


def test_float_ids_in_npz_refused(tmp_path):
    np.savez(tmp_path / "f.npz", topk_ids=np.array([[0, 7.5]]))
    with pytest.raises(ZeppInputError, match=r"found .*7\.5 at index \[0, 1\].*refused rather than truncated"):
        read_trace(tmp_path / "f.npz", num_experts=8)
    np.savez(tmp_path / "f.npz", topk_ids=np.array([[0.5, 1.0]]))
    with pytest.raises(ZeppInputError, match=r"must be integers, found .*0\.5.*refused rather than truncated"):
        read_trace(tmp_path / "f.npz")


@pytest.mark.parametrize("arr, needle", [(np.array([[True, False]]), "booleans"),
                                         (np.array([[1 + 0j, 2 + 0j]]), "complex"),
                                         (np.array([["1", "2"]]), "strings")])
def test_bool_complex_string_ids_refused(tmp_path, arr, needle):
    np.savez(tmp_path / "b.npz", topk_ids=arr)
    with pytest.raises(ZeppInputError, match=needle):
        read_trace(tmp_path / "b.npz", num_experts=4)


def test_nan_gate_weights_refused(tmp_path):
    np.savez(tmp_path / "w.npz", topk_ids=np.array([[0, 1], [2, 3]]), topk_weights=np.array([[0.5, 0.5], [np.nan, 1]]))
    with pytest.raises(ZeppInputError, match=r"topk_weights holds nan at row 1, position 1"):
        read_trace(tmp_path / "w.npz", num_experts=4)
    np.savez(tmp_path / "c.npz", topk_ids=np.array([[0, 1]]), topk_weights=np.array([[0.5j, 1]]))
    with pytest.raises(ZeppInputError, match="must be real numbers"):
        read_trace(tmp_path / "c.npz", num_experts=4)


def test_npz_with_object_array(tmp_path):
    arr = np.empty((1, 2), dtype=object)
    arr[0, 0], arr[0, 1] = 1, "x"
    np.savez(tmp_path / "o.npz", topk_ids=arr)
    with pytest.raises(ZeppInputError, match=r"array 'topk_ids' holds Python objects \(pickled\), .*o\.npz field topk_ids"):
        read_trace(tmp_path / "o.npz")


def test_sglang_per_token_dump(tmp_path):
    torch = pytest.importorskip("torch")
    layer0 = torch.tensor([[1, 2], [3, 4], [-1, -1]])  # last row: SGLang padding, dropped
    layer1 = torch.tensor([[5, 6], [7, 0], [1, 3]])
    rec = {"forward_pass_id": 0, "rank": 0, "topk_ids_of_layer": torch.stack([layer0, layer1])}
    rec2 = {"forward_pass_id": 1, "rank": 0, "topk_ids_of_layer": torch.stack([layer1, layer0])}
    torch.save({"records": [rec, rec2]}, tmp_path / "d.pt")
    t = read_trace(tmp_path / "d.pt", num_experts=8, top_k=2)
    assert t.topk_ids.tolist() == [[1, 2], [3, 4], [5, 6], [7, 0], [1, 3]]
    t1 = read_trace(tmp_path / "d.pt", num_experts=8, top_k=2, layer=1)
    assert t1.topk_ids.tolist() == [[5, 6], [7, 0], [1, 3], [1, 2], [3, 4]]
    with pytest.raises(ZeppInputError, match="layer=5 is out of range"):
        read_trace(tmp_path / "d.pt", layer=5)
    torch.save({"logical_count": torch.zeros(2, 3)}, tmp_path / "s.pt")
    with pytest.raises(ZeppInputError, match="per_token"):
        read_trace(tmp_path / "s.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(ZeppInputError, match="cannot read"):
        read_trace(tmp_path / "bad.pt")


def test_float_ids_in_pt_refused_not_truncated(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"topk_ids_of_layer": torch.tensor([[[0.0, 1.5], [2.0, 3.0]]])}, tmp_path / "f.pt")
    with pytest.raises(ZeppInputError, match=r"f\.pt: topk_ids_of_layer: expert ids must be integers, found .*1\.5"):
        read_trace(tmp_path / "f.pt", num_experts=4)
    torch.save({"topk_ids_of_layer": torch.tensor([[[0.0, 1.0], [2.0, 3.0]]])}, tmp_path / "w.pt")
    with pytest.raises(ZeppInputError, match="stored as floating point"):
        read_trace(tmp_path / "w.pt", num_experts=4)


def test_nan_and_huge_array_ids_named_as_they_are(tmp_path):
    torch = pytest.importorskip("torch")
    np.savez(tmp_path / "n.npz", topk_ids=np.array([[0, np.nan]]))
    torch.save({"topk_ids_of_layer": torch.tensor([[[0.0, float("nan")]]])}, tmp_path / "n.pt")
    for f in ("n.npz", "n.pt"):
        with pytest.raises(ZeppInputError) as exc:
            read_trace(tmp_path / f, num_experts=8)
        assert "found nan at index" in str(exc.value) and "negative" not in str(exc.value)
    np.savez(tmp_path / "h.npz", topk_ids=np.array([[0, 10**12]], dtype=np.int64))
    with pytest.raises(ZeppInputError) as exc:
        read_trace(tmp_path / "h.npz", num_experts=8)
    assert "1000000000000" in str(exc.value) and "negative" not in str(exc.value)


def test_pt_with_mixed_key_types(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({0: torch.zeros(2), "a": torch.zeros(2)}, tmp_path / "m.pt")
    with pytest.raises(ZeppInputError, match=r"m\.pt: no 'topk_ids_of_layer' found \(got \['a', 0\]\)"):
        read_trace(tmp_path / "m.pt")


def test_load_histogram_formats(tmp_path):
    torch = pytest.importorskip("torch")
    count = torch.tensor([[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [0, 0, 9]]])  # [steps, layers, E]
    torch.save({"rank": 0, "logical_count": count}, tmp_path / "c.pt")
    assert read_load_histogram(tmp_path / "c.pt").tolist() == [2, 3, 4]
    assert read_load_histogram(tmp_path / "c.pt", layer=1).tolist() == [4, 5, 15]
    (tmp_path / "c.json").write_text(json.dumps({"logical_count": [[7, 8], [9, 10]]}))
    assert read_load_histogram(tmp_path / "c.json", layer=1).tolist() == [9, 10]
    np.savez(tmp_path / "c.npz", np.array([3, 0, 1]))
    assert read_load_histogram(tmp_path / "c.npz").tolist() == [3, 0, 1]
    (tmp_path / "n.json").write_text(json.dumps({"logical_count": [1, -2]}))
    with pytest.raises(ZeppInputError, match="negative"):
        read_load_histogram(tmp_path / "n.json")
    (tmp_path / "k.json").write_text(json.dumps({"physical_to_logical_map": [[0]]}))
    with pytest.raises(ZeppInputError, match="no 'logical_count'"):
        read_load_histogram(tmp_path / "k.json")


def test_fractional_load_histogram_refused(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"logical_count": [[1.5, 2.0]]}))
    with pytest.raises(ZeppInputError, match=r"logical_count: loads must be integers, found 1\.5"):
        read_load_histogram(tmp_path / "c.json")
    (tmp_path / "w.json").write_text(json.dumps({"logical_count": [[1.0, 2.0]]}))
    assert read_load_histogram(tmp_path / "w.json").tolist() == [1, 2]


# ---------------------------------------------------------------- files that are not plain files


def test_missing_file_directory_and_unknown_suffix(tmp_path):
    with pytest.raises(ZeppInputError, match="does not exist"):
        read_trace(tmp_path / "nope.txt")
    with pytest.raises(ZeppInputError, match="unknown trace format"):
        read_trace(txt(tmp_path, "1 2\n", "t.csv"))
    with pytest.raises(ZeppInputError, match="is a directory"):
        read_trace(tmp_path)


def test_named_pipe_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    result = {}

    def go():
        try:
            read_trace(fifo, num_experts=8)
        except ZeppInputError as exc:
            result["msg"] = str(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # the old reader blocks in open() until a writer appears: unblock it and fail
        with open(fifo, "w"):
            pass
        t.join(5)
        pytest.fail("read_trace blocked on a named pipe")
    assert "is a named pipe, not a regular file" in result["msg"]


def _deny(monkeypatch, target, exc):
    real = builtins.open

    def fake_open(file, *a, **kw):
        if str(file) == str(target):
            raise exc
        return real(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    real_os_open = os.open

    def fake_os_open(file, *a, **kw):  # zepp.files.open_regular opens with os.open
        if str(file) == str(target):
            raise exc
        return real_os_open(file, *a, **kw)

    monkeypatch.setattr(os, "open", fake_os_open)


@pytest.mark.parametrize("exc, needle", [(PermissionError(13, "Permission denied"), "permission denied"),
                                         (OSError(5, "Input/output error"), r"cannot read it \(Input/output error\)")])
def test_unreadable_file_is_one_line(tmp_path, monkeypatch, exc, needle):
    p = txt(tmp_path, "0 1\n")
    _deny(monkeypatch, p, exc)
    with pytest.raises(ZeppInputError, match=needle):
        read_trace(p, num_experts=4)


def test_memory_limit_message(tmp_path):
    p = txt(tmp_path, "0 1\n" * 1000)
    with pytest.raises(ZeppInputError, match=r"reading it needs about .* MiB, more than the limit given .*split the file"):
        read_trace(p, num_experts=4, max_bytes=1000)
