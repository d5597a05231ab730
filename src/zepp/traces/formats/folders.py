"""Recorded trace folders: ``<dir>/<model>/{pool,eval}.txt``, the layout of ``../shared/traces``."""

from __future__ import annotations

from pathlib import Path

from zepp.errors import ZeppInputError
from zepp.model import model_preset, trace_dirs
from zepp.traces.formats.trace_files import read_trace
from zepp.traces.trace import Trace

__all__ = ["load_model_traces"]


def load_model_traces(trace_dir, model_name: str) -> tuple[Trace, Trace]:
    """``(pool, eval)`` traces of preset ``model_name`` from ``<trace_dir>/<name>/{pool,eval}.txt``.

    Every model preset is accepted; the folder is the preset's name, and for ``qwen`` also
    ``qwen3/`` (the name in ``../shared/traces``; ``TRACE_DIR_ALIASES``). The layout is that of
    ``../shared/traces``: ``pool.txt`` is the history window a placement is planned from,
    ``eval.txt`` the window evaluation batches are sampled from. Errors name the folders and
    files looked for.
    """
    spec = model_preset(model_name)
    root = Path(trace_dir)
    if not root.is_dir():
        raise ZeppInputError(
            f"trace directory {str(root)!r} does not exist; give the folder holding <model>/pool.txt and "
            f"<model>/eval.txt (for example ../shared/traces)")
    names = trace_dirs(model_name)
    tried = [root / n for n in names]
    sub = next((d for d in tried if d.is_dir()), None)
    if sub is None:
        raise ZeppInputError(
            f"{root}: no folder for model {model_name!r}: looked for "
            f"{' and '.join(str(d) + '/' for d in tried)} holding pool.txt and eval.txt")
    out = []
    for window in ("pool", "eval"):
        f = sub / f"{window}.txt"
        if not f.is_file():
            raise ZeppInputError(
                f"{f}: missing; a trace folder for model {model_name!r} needs {sub}/pool.txt and {sub}/eval.txt")
        out.append(read_trace(f, num_experts=spec.num_experts, top_k=spec.top_k))
    return out[0], out[1]
