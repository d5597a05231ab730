"""Build one rank's expert-parallel model from a checkpoint folder, reading only what it needs.

Steps (``load_expert_parallel``):

1. the config (``AutoConfig``) and the model skeleton on the ``meta`` device (no memory);
2. module surgery: every sparse MoE block (``zepp.serve.moe_blocks.find_moe_blocks``) is replaced by
   an ``ExpertParallelMoE`` sized for this rank's slots (``model.set_submodule``);
3. ``to_empty`` on the target device, then every remaining parameter and persistent buffer is
   read from the checkpoint by name (non-expert weights: attention, norms, embeddings, routers,
   shared experts), and each local slot's expert weights by expert id
   (``Checkpoint.expert_weights``: only those tensors, or those rows of a stacked tensor);
4. non-persistent buffers (rotary frequencies) are recomputed by building their module afresh
   from the config; tied embeddings are tied again.

The result runs with the model's own forward, KV cache and attention; only the MoE blocks are
ours.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from zepp.errors import ZeppInputError
from zepp.serve.moe_blocks import ExpertParallelMoE, UnsupportedBlock, find_moe_blocks
from zepp.serve.checkpoint import Checkpoint


def read_config(folder):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder))
    except Exception as exc:  # transformers' validators raise their own types (StrictDataclassFieldValidationError)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ZeppInputError(f"--checkpoint {str(folder)!r}: cannot read config.json ({first}); fix config.json") \
            from None


def skeleton(config, dtype=torch.float32) -> nn.Module:
    """The causal LM of ``config`` on the meta device (no weights allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
        except Exception as exc:  # any failure to build the model from its config is the config's
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ZeppInputError(f"model type {config.model_type!r}: transformers cannot build it as a causal LM "
                                 f"({first}); zepp serves MoE causal LMs such as qwen3_moe, mixtral, deepseek_v3") \
                from None


def persistent_shapes(config) -> dict[str, tuple[int, ...]]:
    """``{checkpoint name: shape}`` of every parameter and persistent buffer of ``config``'s
    model (the meta skeleton: nothing allocated), the stacked expert tensors included."""
    return {name: tuple(t.shape) for name, t in _persistent_tensors(skeleton(config)).items()}


def moe_shape(config) -> dict:
    """``{"layers", "experts", "top_k", "hidden", "ffn", "paths"}`` of the model's sparse MoE blocks."""
    m = skeleton(config)
    try:
        blocks = find_moe_blocks(m)
    except UnsupportedBlock as exc:
        raise ZeppInputError(str(exc)) from None
    if not blocks:
        raise ZeppInputError(f"model type {config.model_type!r} has no sparse MoE blocks zepp can serve (a block "
                             f"with a router 'gate' and stacked 'experts.gate_up_proj'/'down_proj')")
    E, F2, H = blocks[0][1].experts.gate_up_proj.shape
    return {"layers": len(blocks), "experts": int(E), "top_k": int(blocks[0][1].gate.top_k), "hidden": int(H),
            "ffn": int(F2) // 2, "paths": [n for n, _ in blocks]}


def _rebuild_nonpersistent(model: nn.Module, device) -> None:
    """Recompute non-persistent buffers (left uninitialised by ``to_empty``)."""
    for name, m in list(model.named_modules()):
        if not getattr(m, "_non_persistent_buffers_set", None):
            continue
        if hasattr(m, "inv_freq") and hasattr(m, "config"):  # rotary embedding: rebuild from the config
            with torch.device(device):
                fresh = type(m)(config=m.config)
            if name:
                model.set_submodule(name, fresh)
            continue
        raise ZeppInputError(f"module {name!r} ({type(m).__name__}) has non-persistent buffers "
                             f"{sorted(m._non_persistent_buffers_set)} zepp cannot rebuild")


@torch.no_grad()
def load_expert_parallel(folder, comm, rank: int, device=None, dtype=torch.float32) -> nn.Module:
    """This rank's model: non-expert weights in full, expert weights of its slots only.

    ``comm``: the process's ``ExpertParallel`` (its placements give each layer's slots).
    Returns the model in eval mode; ``model.zepp_bytes_read`` holds the checkpoint bytes read.
    """
    device = torch.device(device or "cpu")
    ckpt = Checkpoint(folder)
    config = read_config(folder)
    # 1. the skeleton on the meta device; 2. every sparse MoE block replaced
    model = skeleton(config, dtype)
    blocks = find_moe_blocks(model)
    if len(blocks) != comm.layers:
        raise ZeppInputError(f"{len(blocks)} MoE layers in the model, {comm.layers} placements")
    S = comm.placements[0].slots_per_rank
    for i, (path, blk) in enumerate(blocks):
        model.set_submodule(path, ExpertParallelMoE(blk, i, comm, S))
    # 3. memory on the device, non-expert tensors by name; 4. rotary buffers rebuilt, embeddings tied
    model.to_empty(device=device)
    _rebuild_nonpersistent(model, device)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    _load_dense(model, ckpt, folder, tied)
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    for i, (path, _) in enumerate(blocks):
        _load_slots(model.get_submodule(path), ckpt, path, comm.placements[i].slot_expert[rank])
    model.eval()
    model.zepp_bytes_read = ckpt.bytes_read
    model.zepp_checkpoint_bytes = ckpt.total_bytes()
    return model


def _persistent_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer by its checkpoint name."""
    persistent = dict(model.named_parameters())
    for mname, m in model.named_modules():
        for bname, b in m.named_buffers(recurse=False):
            if b is not None and bname not in m._non_persistent_buffers_set:
                persistent[f"{mname}.{bname}" if mname else bname] = b
    return persistent


def _load_dense(model: nn.Module, ckpt: Checkpoint, folder, tied: bool) -> None:
    """Read every tensor but the expert-parallel blocks' slot weights from the checkpoint, by name
    (a tied output embedding is tied afterwards)."""
    for name, t in _persistent_tensors(model).items():
        if name.endswith(".gate_up") or name.endswith(".down"):
            owner = model.get_submodule(name.rsplit(".", 1)[0])
            if isinstance(owner, ExpertParallelMoE):
                continue
        key = ckpt.resolve(name)
        if key is None:
            if tied and name.endswith("lm_head.weight"):
                continue
            raise ZeppInputError(f"{folder}: no tensor for {name} in the checkpoint")
        src = ckpt.read(key)
        if tuple(src.shape) != tuple(t.shape):
            raise ZeppInputError(f"{folder}: {key} has shape {tuple(src.shape)}, the model wants {tuple(t.shape)}")
        t.copy_(src.to(t.dtype))


def _load_slots(blk: ExpertParallelMoE, ckpt: Checkpoint, path: str, slot_expert) -> None:
    """The weights of each local slot's expert (``slot_expert [S]``, -1 = empty: zeros) from the
    checkpoint's block at ``path``."""
    blk.gate_up.zero_()
    blk.down.zero_()
    for s, e in enumerate(np.asarray(slot_expert).tolist()):
        if e >= 0:
            gu, dn = ckpt.expert_weights(path, e)
            blk.gate_up[s].copy_(gu.to(blk.gate_up.dtype))
            blk.down[s].copy_(dn.to(blk.down.dtype))


def ep_blocks(model: nn.Module) -> list[ExpertParallelMoE]:
    """The model's expert-parallel blocks in layer order."""
    return sorted((m for m in model.modules() if isinstance(m, ExpertParallelMoE)), key=lambda b: b.layer)
