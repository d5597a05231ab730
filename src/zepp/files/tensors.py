"""Binary array files read under the limits of ``zepp.files.limits``.

- ``.pt`` (:func:`read_torch`): ``torch.load`` with ``weights_only=True`` (tensors, numbers,
  strings, lists and dicts; never a pickled object), CPU, at most ``MAX_TENSOR_FILE_BYTES``;
- ``.npz`` (:func:`read_npz`): ``allow_pickle=False``; every member's ``.npy`` header read
  first, its dtype plain numeric (no objects, no structured records) and its declared shape no
  larger than ``MAX_ARRAY_BYTES``, before a byte is decompressed (a zip bomb is refused unread);
- ``.safetensors`` (:func:`read_safetensors_header`): the 8-byte length (at most
  ``MAX_HEADER_BYTES`` and within the file) and the header JSON under the JSON rules of
  ``zepp.files.structured``, every entry's dtype, shape and byte range checked against the
  file's size (a shape whose bytes overflow is refused, never multiplied out in int64).
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from pathlib import Path

import numpy as np

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files.limits import MAX_ARRAY_BYTES, MAX_HEADER_BYTES, MAX_TENSOR_FILE_BYTES
from zepp.files.paths import check_fits, open_regular
from zepp.files.structured import parse_json

__all__ = ["read_torch", "read_npz", "read_safetensors_header", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def read_torch(path, what: str = "torch.save file"):
    """The object of a ``torch.save`` file (weights only, CPU); every failure one clear line."""
    import torch  # deferred: reading text traces must not pay for importing torch

    with open_regular(path, what, ".pt", MAX_TENSOR_FILE_BYTES) as f:
        size = Path(path).stat().st_size
        check_fits(Path(path), size, 2.0, None)
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for corrupt or unsafe files
            first = (str(exc).splitlines() or [""])[0][:200]
            raise ZeppInputError(f"{path}: cannot read it as a torch.save file ({type(exc).__name__}: {first})") \
                from None


def _npy_header(z: zipfile.ZipFile, info: zipfile.ZipInfo, p) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape an ``.npy`` member declares (its header only is decompressed)."""
    name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
    try:
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
    except Exception as exc:
        raise ZeppFileError(f"array {name!r} is not a .npy array ({type(exc).__name__})", p, name,
                            "save plain numeric arrays with np.savez") from None
    if dtype.hasobject or dtype.kind not in "biufcUSV" or dtype.fields is not None:
        raise ZeppFileError(f"array {name!r} holds {'Python objects (pickled)' if dtype.hasobject else dtype}", p,
                            name, "save plain numeric arrays")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_ARRAY_BYTES:
        raise ZeppFileError(f"array {name!r} declares shape {shape}, {nbytes:,} bytes, beyond the "
                            f"{MAX_ARRAY_BYTES:,} an array may hold", p, name, "check that this is the right file")
    return dtype, shape


def read_npz(path, what: str = ".npz archive") -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` archive, each header checked before it is read (module docstring)."""
    p = Path(path)
    with open_regular(p, what, ".npz", MAX_TENSOR_FILE_BYTES) as f:
        try:
            z = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            if f.seek(0) == 0 and f.read(6) == b"\x93NUMPY":
                raise ZeppInputError(f"{p}: is a single .npy array, not an .npz archive; save it with np.savez") \
                    from None
            raise ZeppInputError(f"{p}: cannot read it as an .npz archive ({type(exc).__name__})") from None
        with z:
            infos = z.infolist()
            declared = [(i, _npy_header(z, i, p)) for i in infos]
            total = sum(math.prod(s) * d.itemsize for _, (d, s) in declared)
            check_fits(p, total, 1.0, None)
            out = {}
            for info, _ in declared:
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                try:
                    with z.open(info) as m:
                        out[name] = np.lib.format.read_array(m, allow_pickle=False)
                except Exception as exc:
                    raise ZeppFileError(f"array {name!r} cannot be read ({type(exc).__name__})", p, name,
                                        "save the archive again") from None
    return out


def _entry(p, name: str, entry, data_bytes: int) -> tuple[str, tuple[int, ...]]:
    """One header entry's ``(dtype, shape)``, its byte range checked against the data section."""
    ok = isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and entry["dtype"] in SAFETENSORS_DTYPES \
        and isinstance(entry.get("shape"), list) \
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry["shape"]) \
        and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2 \
        and all(isinstance(o, int) and not isinstance(o, bool) for o in entry["data_offsets"])
    if not ok:
        raise ZeppInputError(f"{p}: header entry of tensor {name!r} is malformed (dtype, shape, data_offsets); "
                             f"re-export the checkpoint")
    a, b = entry["data_offsets"]
    want = math.prod(entry["shape"]) * SAFETENSORS_DTYPES[entry["dtype"]]  # Python ints: no overflow
    if not 0 <= a <= b or b - a != want:
        raise ZeppInputError(f"{p}: tensor {name!r} has data_offsets {a}..{b} for {want} bytes of "
                             f"{entry['dtype']} {tuple(entry['shape'])} (corrupt header); re-export the checkpoint")
    if b > data_bytes:
        raise ZeppInputError(f"{p}: tensor {name!r} ends at byte {b} of the data, the file holds {data_bytes} "
                             f"(truncated); re-export or copy the file again")
    return entry["dtype"], tuple(entry["shape"])


def read_safetensors_header(path, what: str = "safetensors file",
                            max_bytes: int | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (dtype, shape)}`` from a safetensors file's header (never the tensors),
    every entry checked against the file's size (a truncated file is named here; ``what`` names the
    file in ``open_regular``'s messages, ``max_bytes`` caps its size). ``__metadata__``, when
    present, must map strings to strings."""
    p = Path(path)
    with open_regular(p, what, ".safetensors", max_bytes) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ZeppInputError(f"{p}: {'empty' if size == 0 else 'truncated'} safetensors file ({size} bytes); "
                                 f"re-export the checkpoint")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise ZeppInputError(f"{p}: safetensors header length {n} exceeds the file ({size} bytes) or the "
                                 f"{MAX_HEADER_BYTES:,}-byte limit: truncated or not a safetensors file; re-export it")
        raw = f.read(n)
    try:
        head = parse_json(raw, f"{p} (safetensors header)")
    except ZeppInputError as exc:
        raise ZeppInputError(f"{exc} (corrupt file); re-export the checkpoint") from None
    if not isinstance(head, dict):
        raise ZeppInputError(f"{p}: safetensors header is not a mapping (corrupt file); re-export the checkpoint")
    meta = head.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise ZeppFileError("safetensors metadata must map text to text", p, "__metadata__", "re-export the file")
    out = {name: _entry(p, name, entry, size - 8 - n) for name, entry in head.items() if name != "__metadata__"}
    spans = sorted((head[k]["data_offsets"][0], head[k]["data_offsets"][1], k) for k in out)
    for (a0, b0, k0), (a1, _, k1) in zip(spans, spans[1:]):
        if a1 < b0:
            raise ZeppFileError(f"tensors {k0!r} and {k1!r} overlap in the data (bytes {a1}..{b0})", p, k1,
                                "re-export the checkpoint")
    return out
