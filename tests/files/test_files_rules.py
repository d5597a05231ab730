"""The reading layer's rules (``zepp.files``), each on the smallest file that breaks it, and the
README's table of limits against the constants the code applies."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import (LIMITS, limits_markdown, parse_json, parse_yaml, read_json, read_npz,
                        read_safetensors_header, read_torch, read_yaml)
from zepp.files.limits import MAX_DEPTH, YAML_ALIAS_NODES

README = Path(__file__).resolve().parents[2] / "README.md"
LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "nodes: *i\n"


def test_readme_states_the_limits_the_code_applies():
    assert limits_markdown() in README.read_text(), "README's reading-limits table differs from zepp.files.LIMITS"
    assert len({name for name, *_ in LIMITS}) == len(LIMITS)


@pytest.mark.parametrize("text, needle", [
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested more than"),
    ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested more than"),
    ('{"a": 1, "a": 2}', "x.json field 'a'"),
    ("[" + "9" * 20 + "]", "beyond 2**63 - 1"),
    ("[" + "9" * 5000 + "]", "beyond 2**63 - 1"),
    ("[1e400]", "beyond the float range"),
    ("[NaN]", "NaN where a number goes"),
    ('{"a": [1, 2}', "not valid JSON"),
])
def test_json_rules(text, needle):
    with pytest.raises(ZeppInputError, match=None) as exc:
        parse_json(text.encode(), "x.json")
    assert needle in str(exc.value) and "x.json" in str(exc.value)


def test_json_depth_ignores_brackets_in_strings_and_reads_what_is_fine():
    assert parse_json(json.dumps({"a": "[" * 100, "b": [[1]]}).encode(), "x") == {"a": "[" * 100, "b": [[1]]}
    assert parse_json("[1.5, -3]".encode("utf-16"), "x") == [1.5, -3]
    assert parse_json(b"[NaN]", "x", allow_nan=True)[0] != 0


@pytest.mark.parametrize("text, needle", [
    (LAUGHS, f"more than {YAML_ALIAS_NODES:,} values"),
    ("gpus_per_node: 010", "leading zero at line 1"),
    ("nodes: 1:30", "base-60"),
    ("nic_bw: " + "9" * 400, "beyond 2**63 - 1"),
    ("a: 1\nb: 2\na: 3", "x.yaml field 'a'"),
    ("a: " + "[" * 40 + "]" * 40, "nested more than"),
    ("a: [1", "not valid YAML"),
    ("a: !!python/object/apply:os.system ['true']", "not valid YAML"),
])
def test_yaml_rules(text, needle):
    with pytest.raises(ZeppInputError) as exc:
        parse_yaml(text, "x.yaml")
    assert needle in str(exc.value) and "x.yaml" in str(exc.value)


def test_yaml_reads_plain_files_and_small_aliases():
    assert parse_yaml("a: &x [1, 2]\nb: *x\nc: 0x10\nd: 0\ne: '010'\nf: 2.5e10", "x") == {
        "a": [1, 2], "b": [1, 2], "c": 16, "d": 0, "e": "010", "f": "2.5e10"}  # YAML 1.1: no exponent sign, a string


@pytest.mark.parametrize("reader", [read_json, read_yaml, read_torch, read_npz, read_safetensors_header])
def test_a_named_pipe_is_refused_not_waited_on(tmp_path, reader):
    os.mkfifo(tmp_path / "f")
    with pytest.raises(ZeppInputError, match="named pipe"):
        reader(tmp_path / "f")


def test_a_folder_and_a_device_are_refused(tmp_path):
    with pytest.raises(ZeppInputError, match="is a directory"):
        read_json(tmp_path)
    with pytest.raises(ZeppInputError, match="character device"):
        read_json("/dev/zero")


def test_a_file_over_its_size_limit_is_refused_unread(tmp_path):
    p = tmp_path / "big.json"
    with open(p, "wb") as f:
        f.truncate(2 << 20)
    with pytest.raises(ZeppInputError, match="more than a JSON file may hold"):
        read_json(p, max_bytes=1 << 20)


def _npy(shape: tuple, descr: str = "<i8") -> bytes:
    hdr = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    hdr += " " * (118 - len(hdr)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode()


def test_npz_claiming_more_than_an_array_may_hold_is_refused_before_decompressing(tmp_path):
    p = tmp_path / "bomb.npz"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("w.npy", _npy((10**11,)) + b"\0" * 64)
    with pytest.raises(ZeppFileError, match=r"declares shape \(100000000000,\)"):
        read_npz(p)


def test_npz_object_and_structured_arrays_are_refused(tmp_path):
    np.savez(tmp_path / "o.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ZeppFileError, match="Python objects"):
        read_npz(tmp_path / "o.npz")
    np.savez(tmp_path / "s.npz", a=np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]))
    with pytest.raises(ZeppFileError, match="field a"):
        read_npz(tmp_path / "s.npz")


def test_pt_holding_a_pickled_object_is_refused(tmp_path):
    import torch

    torch.save({"a": Path("/x")}, tmp_path / "o.pt")  # a pickled class: weights_only refuses it
    with pytest.raises(ZeppInputError, match="cannot read it as a torch.save file"):
        read_torch(tmp_path / "o.pt")


def _safetensors(tmp_path, head: dict, data: bytes = b"\0" * 8) -> Path:
    p = tmp_path / "m.safetensors"
    text = json.dumps(head).encode()
    p.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return p


@pytest.mark.parametrize("head, needle", [
    ({"a": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}, "corrupt header"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, "overlap"),
    ({"__metadata__": [1, 2]}, "field __metadata__"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, "truncated"),
])
def test_safetensors_header_rules(tmp_path, head, needle):
    with pytest.raises(ZeppInputError, match=needle):
        read_safetensors_header(_safetensors(tmp_path, head))


def test_safetensors_header_nested_or_duplicated_is_refused(tmp_path):
    p = tmp_path / "m.safetensors"
    for text, needle in ((b'{"a": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nested"),
                         (b'{"__metadata__": {}, "__metadata__": {}}', "given twice")):
        p.write_bytes(struct.pack("<Q", len(text)) + text)
        with pytest.raises(ZeppInputError, match=needle):
            read_safetensors_header(p)
