"""One reading layer for every input file (``zepp.files``): regular files only, within the
limits of ``zepp.files.limits`` (the README's "Reading limits" table), every refusal one
:class:`~zepp.errors.ZeppInputError` naming the file (and the field, as
:class:`~zepp.errors.ZeppFileError`).

- ``paths``: :func:`input_file` / :func:`open_regular` / :func:`read_bytes` (no named pipe,
  device or folder is ever opened for reading), memory checks;
- ``structured``: JSON and YAML (:func:`read_json`, :func:`read_yaml`, :func:`read_structured`;
  depth, size, duplicate keys, integers, YAML aliases and 1.1 surprises);
- ``tensors``: ``.pt`` (:func:`read_torch`), ``.npz`` (:func:`read_npz`) and safetensors
  headers (:func:`read_safetensors_header`);
- ``limits``: the numbers, and the README table made from them.
"""

from zepp.files.limits import LIMITS, limits_markdown
from zepp.files.paths import available_memory, check_fits, describe_keys, input_file, open_regular, read_bytes
from zepp.files.structured import DuplicateKey, parse_json, parse_yaml, read_json, read_structured, read_yaml
from zepp.files.tensors import read_npz, read_safetensors_header, read_torch

__all__ = ["LIMITS", "limits_markdown", "available_memory", "check_fits", "describe_keys", "input_file",
           "open_regular", "read_bytes", "DuplicateKey", "parse_json", "parse_yaml", "read_json", "read_structured",
           "read_yaml", "read_npz", "read_safetensors_header", "read_torch"]
