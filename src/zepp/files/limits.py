"""The limits every structured input is read under, in one table (``LIMITS``).

The README's table of reading limits is generated from ``LIMITS`` (``limits_markdown``) and
checked against it by the tests, so the numbers a user reads are the ones the code applies.
Each limit sits far above what a real file of its kind holds and far below what would hang a
command or exhaust memory (a refusal is one line within seconds and under 1 GB).
"""

from __future__ import annotations

MIB = 1 << 20

MAX_DEPTH = 32
MAX_JSON_BYTES = 32 * MIB
MAX_YAML_BYTES = 4 * MIB
YAML_ALIAS_NODES = 10_000
MAX_INT = (1 << 63) - 1
MAX_HEADER_BYTES = 100 * MIB
MAX_TENSOR_FILE_BYTES = 2048 * MIB
MAX_ARRAY_BYTES = 2048 * MIB

# (constant, value, unit, what it bounds, why this value)
LIMITS: tuple[tuple[str, int, str, str, str], ...] = (
    ("MAX_DEPTH", MAX_DEPTH, "levels", "nesting of any JSON or YAML value",
     "the deepest real file (a bench --json row, a config.json's nested rope or quantization block) is under 8"),
    ("MAX_JSON_BYTES", MAX_JSON_BYTES, "bytes", "one JSON file (prompts, config.json, load.json, meta_info.json, "
     "placement files, bench --json for --resume)", "a prompt file of five million tokens; parsed, well under 1 GB"),
    ("MAX_YAML_BYTES", MAX_YAML_BYTES, "bytes", "one YAML file (cluster files, TensorRT-LLM load-balancer files)",
     "a load-balancer file of 61 layers x 1024 slots is under 1 MiB; YAML parses slowly"),
    ("YAML_ALIAS_NODES", YAML_ALIAS_NODES, "nodes", "values a YAML file reaches through its aliases (*name)",
     "aliases are a convenience in hand-written files; nested ones expand exponentially (billion laughs)"),
    ("MAX_INT", MAX_INT, "", "any integer in a JSON or YAML file",
     "no count, size or id zepp reads is larger; a larger one would overflow int64 or a float"),
    ("MAX_HEADER_BYTES", MAX_HEADER_BYTES, "bytes", "the JSON header of a .safetensors file",
     "the safetensors format's own limit"),
    ("MAX_TENSOR_FILE_BYTES", MAX_TENSOR_FILE_BYTES, "bytes", "one .pt, .npz or statistics .safetensors file read "
     "whole (engine histories, traces)", "a long per-token dump; checked against the memory available too"),
    ("MAX_ARRAY_BYTES", MAX_ARRAY_BYTES, "bytes", "one array of an .npz archive, as its header declares it "
     "(before it is decompressed)", "an archive cannot claim more memory than a file may hold (zip bombs)"),
)


def _shown(value: int, unit: str) -> str:
    if unit == "bytes" and value % MIB == 0:
        return f"{value // MIB} MiB"
    if value == MAX_INT:
        return "2**63 - 1"
    return f"{value:,} {unit}".strip()


def limits_markdown() -> str:
    """The README's table of reading limits (``LIMITS``)."""
    rows = ["| limit | value | bounds | why |", "| --- | --- | --- | --- |"]
    rows += [f"| `{name}` | {_shown(value, unit)} | {what} | {why} |" for name, value, unit, what, why in LIMITS]
    return "\n".join(rows) + "\n"
