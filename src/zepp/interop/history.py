"""Every layer's expert history from what an engine recorded: :func:`read_history`.

The format is recognised from the path, and each engine's module reads its own recording
into a :class:`~zepp.traces.layer_history.LayerHistory` (its forms, and what each supports as
placement input, are described there):

- a folder: TensorRT-LLM expert statistics (``meta_info.json`` and ``rank{r}.safetensors``,
  :func:`zepp.interop.trtllm.read_statistics`); zepp's recorder (``layer_{i:03d}.txt`` files,
  :func:`zepp.interop.zepp_format.read_recorder`); SGLang per-rank dumps (``*.pt``,
  :func:`zepp.interop.sglang.read_dump_folder`); else zepp's recorder folder holding only
  ``load.json``;
- ``.txt`` (and no suffix, ``.trace``): the text format of ``../shared/traces``, one layer
  applied to every MoE layer (:func:`zepp.interop.zepp_format.read_text_trace`);
- ``.pt`` / ``.pth`` / ``.npz``: a vLLM load window (``expert_load_window``,
  :func:`zepp.interop.vllm.read_load_window`) or an SGLang dump (``logical_count`` or
  ``records``, :func:`zepp.interop.sglang.read_dump_file`).

Formats in ``../shared/INTEROP.md``. ``LayerHistory``, ``history_from_traces`` and ``MAX_BINS``
are re-exported from :mod:`zepp.traces.layer_history`.
"""

from __future__ import annotations

from pathlib import Path

from zepp.errors import ZeppInputError
from zepp.files import describe_keys, input_file
from zepp.interop import sglang, trtllm, vllm, zepp_format
from zepp.interop.base_history import HistoryRequest
from zepp.model import model_preset
from zepp.traces.formats.arrays import npz_load, torch_load
from zepp.traces.formats.trace_files import TEXT_SUFFIXES
from zepp.traces.layer_history import MAX_BINS, LayerHistory, check_signal, history_from_traces

__all__ = ["LayerHistory", "read_history", "history_from_traces", "MAX_BINS", "FORMATS", "FOLDER_READERS",
           "OBJECT_READERS"]

# The ``format`` a history read from each recording carries.
FORMATS = ("text", "zepp-recorder", "sglang-stat", "sglang-per-pass", "sglang-per-token", "trtllm",
           "trtllm-raw", "vllm")

# Folders: {engine: (recognises the folder, reads it)}, tried in this order; a folder none of
# them recognises is zepp's recorder folder with only load.json (or its error says what it lacks).
FOLDER_READERS = {
    "trtllm": (trtllm.is_statistics_folder, trtllm.read_statistics),
    "zepp": (zepp_format.has_layer_files, zepp_format.read_recorder),
    "sglang": (sglang.has_dumps, sglang.read_dump_folder),
}
FOLDER_FALLBACK = zepp_format.read_recorder

# Objects in a .pt / .pth / .npz file: {engine: (recognises the object, reads it)}, in this order.
OBJECT_READERS = {
    "vllm": (vllm.is_load_window, vllm.read_load_window),
    "sglang": (sglang.is_dump, sglang.read_dump_file),
}
OBJECT_SUFFIXES = (".pt", ".pth", ".npz")


def read_history(path, model: str | None = None, num_experts: int | None = None, top_k: int | None = None,
                 allow_duplicates: bool = False) -> LayerHistory:
    """Read an engine's expert history (every layer) into a :class:`LayerHistory`; the format
    is recognised from the path (see the module docstring). ``model``: the preset the history
    was recorded with (layer count, experts, top-k), strongly recommended."""
    spec = model_preset(model) if model is not None else None
    if spec is not None:
        spec = spec.with_(num_experts=num_experts, top_k=top_k)
    req = HistoryRequest(spec, num_experts, top_k, allow_duplicates)
    p = Path(path)
    if p.is_dir():
        return check_signal(_read_folder(p, req))
    p = input_file(p, "history file", ".txt, .pt, .npz, or a folder")
    suffix = p.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return check_signal(zepp_format.read_text_trace(p, req))
    if suffix in OBJECT_SUFFIXES:
        return check_signal(_read_object_file(p, suffix, req))
    raise ZeppInputError(f"{p}: unknown history format {suffix!r}; give a .txt trace, an SGLang .pt dump, a vLLM "
                         f".pt/.npz window, or a folder (TensorRT-LLM statistics, zepp recorder, SGLang per-rank dumps)")


def _read_folder(d: Path, req: HistoryRequest) -> LayerHistory:
    for recognises, read in FOLDER_READERS.values():
        if recognises(d):
            return read(d, req)
    return FOLDER_FALLBACK(d, req)


def _read_object_file(p: Path, suffix: str, req: HistoryRequest) -> LayerHistory:
    obj = npz_load(p) if suffix == ".npz" else torch_load(p)
    for recognises, read in OBJECT_READERS.values():
        if recognises(obj):
            return read(p, obj, req)
    raise ZeppInputError(f"{p}: not a known history (keys {describe_keys(obj)}); expected an SGLang dump "
                         f"('logical_count' or 'records') or a vLLM load window ('expert_load_window')")
