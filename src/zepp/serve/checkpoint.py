"""Read a Hugging Face checkpoint folder tensor by tensor (``config.json`` + safetensors).

``Checkpoint(folder)`` indexes the tensor names of every ``*.safetensors`` file (headers only,
via ``model.safetensors.index.json`` when present) and reads single tensors, or single rows of a
stacked tensor, with ``safetensors.safe_open``: a rank never loads the whole checkpoint, only
the tensors it asks for. ``bytes_read`` counts what was read.

Expert weights come in two layouts, both handled by ``expert_weights``:

- per expert (what ``save_pretrained`` writes and the Hub ships): ``{P}.experts.{e}.gate_proj.weight
  [F, H]``, ``up_proj [F, H]``, ``down_proj [H, F]`` (Qwen3-MoE, DeepSeek), or Mixtral's
  ``{P}.experts.{e}.w1`` (gate), ``w3`` (up), ``w2`` (down);
- stacked (transformers 5's in-memory layout): ``{P}.experts.gate_up_proj [E, 2F, H]`` and
  ``{P}.experts.down_proj [E, H, F]``, of which only row ``e`` is read.

Module names of transformers 5 may differ from the checkpoint's (Mixtral's ``mlp`` is
``block_sparse_moe`` on disk); ``resolve`` tries the known aliases.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zepp.errors import ZeppInputError
from zepp.files import read_json
from zepp.files.tensors import SAFETENSORS_DTYPES as _DTYPE_BYTES
from zepp.serve.ckpt_check import check_folder

# (name in the transformers 5 module tree, name in checkpoints written by older layouts)
ALIASES = ((".mlp.", ".block_sparse_moe."),)
_PER_EXPERT = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


class Checkpoint:
    """Tensor-by-tensor reader of a checkpoint folder (see module docstring)."""

    def __init__(self, folder):
        from safetensors import safe_open

        self.folder = check_folder(folder)
        self._open = safe_open
        self.file_of: dict[str, Path] = {}
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            for name, fn in read_json(index, "safetensors index")["weight_map"].items():
                self.file_of[name] = self.folder / fn
        else:
            for fn in sorted(self.folder.glob("*.safetensors")):
                with safe_open(str(fn), "pt") as f:
                    for name in f.keys():
                        self.file_of[name] = fn
        self.bytes_read = 0

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def resolve(self, name: str) -> str | None:
        """The checkpoint's name for module tensor ``name`` (itself or an alias), else None."""
        if name in self.file_of:
            return name
        for new, old in ALIASES:
            alt = name.replace(new, old)
            if alt in self.file_of:
                return alt
        return None

    def read(self, name: str) -> torch.Tensor:
        """One whole tensor (CPU); NaN or infinite values are refused naming the tensor."""
        with self._open(str(self.file_of[name]), "pt") as f:
            t = f.get_tensor(name)
        self.bytes_read += t.numel() * t.element_size()
        return self._finite(t, name)

    def read_row(self, name: str, i: int) -> torch.Tensor:
        """Row ``i`` of a stacked tensor, without reading the others (NaN or Inf refused)."""
        with self._open(str(self.file_of[name]), "pt") as f:
            t = f.get_slice(name)[i]
        self.bytes_read += t.numel() * t.element_size()
        return self._finite(t, f"{name}[{i}]")

    def _finite(self, t: torch.Tensor, name: str) -> torch.Tensor:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ZeppInputError(f"{self.file_of[name.split('[')[0]]}: tensor {name} holds NaN or Inf weights; "
                                 f"this checkpoint cannot be served: fix or re-export it")
        return t

    def expert_weights(self, prefix: str, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gate_up [2F, H], down [H, F])`` of expert ``expert`` of the MoE block at module path
        ``prefix`` (e.g. ``model.layers.3.mlp``), from either layout (module docstring)."""
        for p in [prefix] + [prefix.replace(new.strip("."), old.strip("."), 1) for new, old in ALIASES]:
            stacked = f"{p}.experts.gate_up_proj"
            if stacked in self.file_of and f"{p}.experts.down_proj" in self.file_of:
                return self.read_row(stacked, expert), self.read_row(f"{p}.experts.down_proj", expert)
            for g, u, dn in _PER_EXPERT:
                base = f"{p}.experts.{expert}."
                if f"{base}{g}.weight" in self.file_of:
                    gate, up = self.read(f"{base}{g}.weight"), self.read(f"{base}{u}.weight")
                    return torch.cat([gate, up], dim=0), self.read(f"{base}{dn}.weight")
        raise ZeppInputError(f"{self.folder}: no weights of expert {expert} of {prefix} (looked for "
                             f"{prefix}.experts.{expert}.gate_proj/w1 and {prefix}.experts.gate_up_proj)")

    def total_bytes(self) -> int:
        """Bytes of every tensor in the checkpoint (from the headers)."""
        total = 0
        for fn in sorted(set(self.file_of.values())):
            with self._open(str(fn), "pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    n = 1
                    for d in sl.get_shape():
                        n *= d
                    total += n * _DTYPE_BYTES.get(sl.get_dtype(), 4)
        return total

