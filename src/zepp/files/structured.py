"""JSON and YAML read under one set of rules (``zepp.files.limits``).

- size: a file over ``MAX_JSON_BYTES`` / ``MAX_YAML_BYTES`` is refused before it is parsed;
- depth: a value nested deeper than ``MAX_DEPTH`` is refused before it is parsed (JSON: a scan
  of the bytes; YAML: of the parser's events), so no reader meets a ``RecursionError``;
- duplicate keys: a mapping that names a key twice is refused (parsers keep the last silently);
- integers beyond ``MAX_INT`` (2**63 - 1) are refused, and floats beyond the float range
  (``1e400`` would read as infinity); ``NaN`` / ``Infinity`` only where the caller allows them;
- YAML: the safe loader (no Python objects), aliases expanding to at most ``YAML_ALIAS_NODES``
  values (the billion-laughs pattern is refused after a few hundred events, never expanded),
  and no YAML 1.1 reading a user would not expect: an integer written with a leading zero
  (``010``: YAML 1.1 reads 8, YAML 1.2 and every person 10) or in base 60 (``1:30``: 90) is
  refused, naming the line, rather than read either way.

Every refusal is a :class:`~zepp.errors.ZeppFileError` naming the file.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files.limits import MAX_DEPTH, MAX_INT, MAX_JSON_BYTES, MAX_YAML_BYTES, YAML_ALIAS_NODES
from zepp.files.paths import read_bytes

__all__ = ["DuplicateKey", "parse_json", "read_json", "parse_yaml", "read_yaml", "read_structured"]


class DuplicateKey(ValueError):
    """A mapping in a JSON or YAML text names one key twice (``args[0]``: the key)."""


class _Refused(ValueError):
    """A value the rules refuse, raised inside a parser hook: ``(what, field, fix)``."""


def _unique_pairs(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INT:
        raise _Refused(f"integer of {len(text.lstrip('-'))} digits beyond 2**63 - 1", None,
                       "no count, size or id is that large: check the file")
    return int(text)


def _float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise _Refused(f"number {text[:30]!r} beyond the float range", None, "check the file")
    return v


def _no_constant(name: str):
    raise _Refused(f"{name} where a number goes", None, "write a finite number")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_CHUNK = 1 << 22


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text ``raw`` (UTF-8), brackets in strings not counted."""
    b = np.frombuffer(_STRING.sub(b"", raw), np.uint8)
    depth, top = 0, 0
    for i in range(0, b.size, _CHUNK):
        c = b[i:i + _CHUNK]
        step = (c == 91).astype(np.int8) + (c == 123) - (c == 93).astype(np.int8) - (c == 125)
        run = np.cumsum(step, dtype=np.int64) + depth
        top, depth = max(top, int(run.max())), int(run[-1])
    return top


def parse_json(raw: bytes | str, source, allow_nan: bool = False):
    """The value of JSON text ``raw`` (from ``source``, named in refusals) under the module's rules."""
    try:
        text = raw.decode(json.detect_encoding(raw)) if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ZeppFileError(f"not valid JSON (not UTF-8 text: {exc.reason} at byte {exc.start})", source,
                            fix="save it as UTF-8") from None
    utf8 = text.encode("utf-8", "surrogatepass")
    if json_depth(utf8) > MAX_DEPTH:
        raise ZeppFileError(f"values nested more than {MAX_DEPTH} deep", source,
                            fix="no zepp input nests that deep: check that this is the right file")
    hooks = dict(object_pairs_hook=_unique_pairs, parse_int=_int, parse_float=_float)
    if not allow_nan:
        hooks["parse_constant"] = _no_constant
    try:
        return json.loads(text, **hooks)
    except DuplicateKey as exc:
        raise ZeppFileError("a key given twice", source, repr(exc.args[0])[:80], "keep one of them") from None
    except _Refused as exc:
        raise ZeppFileError(exc.args[0], source, exc.args[1], exc.args[2]) from None
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError
        raise ZeppInputError(f"{source}: not valid JSON ({str(exc)[:200]})") from None


def read_json(path, what: str = "JSON file", expect: str = ".json", allow_nan: bool = False,
              max_bytes: int = MAX_JSON_BYTES):
    """The value of the JSON file ``path`` (a regular file of at most ``max_bytes``), under the
    module's rules; ``what`` / ``expect`` name it in messages."""
    p = Path(path)
    return parse_json(read_bytes(p, what, max_bytes, expect), p, allow_nan)


def _yaml():
    import yaml

    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scan_events(yaml, loader, text: str, source) -> None:
    """Refuse nesting beyond ``MAX_DEPTH`` and aliases reaching more than ``YAML_ALIAS_NODES``
    values, from the parser's events (nothing is built or expanded)."""
    sizes: dict[str, int] = {}
    stack: list[list] = []  # per open collection: [values in it, its anchor]
    through_aliases = 0

    def add(n: int) -> None:
        if stack:
            stack[-1][0] += n

    for ev in yaml.parse(text, Loader=loader):
        if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([1, ev.anchor])
            if len(stack) > MAX_DEPTH:
                raise ZeppFileError(f"values nested more than {MAX_DEPTH} deep (line {ev.start_mark.line + 1})",
                                    source, fix="no zepp input nests that deep: check that this is the right file")
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            n, anchor = stack.pop()
            if anchor is not None:
                sizes[anchor] = n
            add(n)
        elif isinstance(ev, yaml.ScalarEvent):
            if ev.anchor is not None:
                sizes[ev.anchor] = 1
            add(1)
        elif isinstance(ev, yaml.AliasEvent):
            n = sizes.get(ev.anchor, 1)
            through_aliases += n
            if through_aliases > YAML_ALIAS_NODES:
                raise ZeppFileError(f"aliases (*{ev.anchor}, line {ev.start_mark.line + 1}) expanding to more than "
                                    f"{YAML_ALIAS_NODES:,} values", source, fix="write the values out, without nested aliases")
            add(n)


def _check_int_text(node) -> None:
    """Refuse the YAML 1.1 integer forms that read as other than a person means."""
    body = node.value.replace("_", "").lstrip("+-")
    line = node.start_mark.line + 1
    if ":" in body:
        raise _Refused(f"base-60 number {node.value!r} (YAML 1.1 reads 1:30 as 90) at line {line}", None,
                       "write the number in decimal, or quote it if it is text")
    if len(body) > 1 and body[0] == "0" and body[1] in "0123456789":
        raise _Refused(f"number {node.value!r} with a leading zero at line {line} (YAML 1.1 reads it as octal, YAML "
                       f"1.2 as decimal)", None, "write it without the leading zero")


def _loader_class():
    yaml, base = _yaml()

    class Loader(base):
        """The safe loader, strict about integers (``_check_int_text``, ``MAX_INT``)."""

    def construct_int(loader, node):
        _check_int_text(node)
        v = yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
        if abs(v) > MAX_INT:
            raise _Refused(f"integer beyond 2**63 - 1 at line {node.start_mark.line + 1}", None,
                           "no count, size or id is that large: check the file")
        return v

    def construct_float(loader, node):
        if ":" in node.value:
            _check_int_text(node)
        return yaml.constructor.SafeConstructor.construct_yaml_float(loader, node)

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_constructor("tag:yaml.org,2002:float", construct_float)
    return yaml, Loader


def _duplicate_key(yaml, root) -> str | None:
    """The first key a mapping of the node graph ``root`` names twice (each node visited once)."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            if len(set(keys)) != len(keys):
                return next(k for i, k in enumerate(keys) if k in keys[:i])
            todo.extend(v for pair in node.value for v in pair)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
    return None


def parse_yaml(raw: bytes | str, source):
    """The value of YAML text ``raw`` (from ``source``, named in refusals) under the module's rules."""
    yaml, Loader = _loader_class()
    try:
        utf16 = isinstance(raw, bytes) and raw[:2] in (b"\xff\xfe", b"\xfe\xff")  # YAML allows UTF-16 with a BOM
        text = raw.decode("utf-16" if utf16 else "utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ZeppFileError(f"not valid YAML (not UTF-8 or UTF-16 text: {exc.reason} at byte {exc.start})", source,
                            fix="save it as UTF-8") from None
    try:
        _scan_events(yaml, Loader, text, source)
        root = yaml.compose(text, Loader=Loader)
        dup = _duplicate_key(yaml, root)
        if dup is not None:
            raise ZeppFileError("a key given twice", source, repr(dup)[:80], "keep one of them")
        loader = Loader("")
        return None if root is None else loader.construct_document(root)
    except _Refused as exc:
        raise ZeppFileError(exc.args[0], source, exc.args[1], exc.args[2]) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, ZeppInputError):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise ZeppInputError(f"{source}: not valid YAML ({first})") from None


def read_yaml(path, what: str = "YAML file", expect: str = ".yaml or .yml", max_bytes: int = MAX_YAML_BYTES):
    """The value of the YAML file ``path`` (a regular file of at most ``max_bytes``), under the module's rules."""
    p = Path(path)
    return parse_yaml(read_bytes(p, what, max_bytes, expect), p)


def read_structured(path, what: str, expect: str):
    """A JSON (by its ``.json`` suffix) or YAML file's value, under the module's rules."""
    if Path(path).suffix.lower() == ".json":
        return read_json(path, what, expect)
    return read_yaml(path, what, expect)
