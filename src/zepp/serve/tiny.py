"""Small random-init MoE checkpoints for tests, examples and benchmarks (nothing is downloaded).

``make_checkpoint(folder, arch, ...)`` builds a ``transformers`` model of architecture ``arch``
(``qwen3_moe``, ``mixtral``, ``deepseek_v3``) from a config sized by the arguments, seeds its
weights (``torch.manual_seed(seed)`` before construction: the model's own init) and writes it with
``save_pretrained`` (safetensors). ``router_bias`` optionally adds a per-expert bias to every
router (see ``fit_router_skew``): random routers are nearly uniform, real ones are skewed.
"""

from __future__ import annotations

import numpy as np
import torch

ARCHS = ("qwen3_moe", "mixtral", "deepseek_v3", "qwen2_moe")


def tiny_config(arch: str, hidden: int = 32, ffn: int = 16, experts: int = 8, top_k: int = 2, layers: int = 2,
                vocab: int = 128, heads: int = 4, kv_heads: int = 2, eos: int | None = None):
    """A transformers config of ``arch`` with these sizes (``ffn``: each expert's intermediate size)."""
    from transformers import DeepseekV3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  max_position_embeddings=512, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
                  tie_word_embeddings=False)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(intermediate_size=2 * ffn, moe_intermediate_size=ffn, num_key_value_heads=kv_heads,
                              head_dim=hidden // heads, num_experts=experts, num_experts_per_tok=top_k,
                              norm_topk_prob=True, **common)
    if arch == "mixtral":
        return MixtralConfig(intermediate_size=ffn, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                             num_local_experts=experts, num_experts_per_tok=top_k, **common)
    if arch == "deepseek_v3":
        hd = max(4, hidden // heads)
        return DeepseekV3Config(intermediate_size=2 * ffn, moe_intermediate_size=ffn, num_key_value_heads=heads,
                                n_routed_experts=experts, num_experts_per_tok=top_k, n_group=2, topk_group=1,
                                n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=hidden // 2,
                                kv_lora_rank=hidden // 2, qk_rope_head_dim=hd, qk_nope_head_dim=hd, v_head_dim=hd,
                                routed_scaling_factor=1.5, norm_topk_prob=True, **common)
    if arch == "qwen2_moe":
        return Qwen2MoeConfig(intermediate_size=2 * ffn, moe_intermediate_size=ffn, num_key_value_heads=kv_heads,
                              num_experts=experts, num_experts_per_tok=top_k, shared_expert_intermediate_size=ffn,
                              norm_topk_prob=False, **common)
    raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")


@torch.no_grad()
def make_checkpoint(folder, arch: str = "qwen3_moe", seed: int = 0, router_bias: np.ndarray | None = None,
                    **sizes) -> str:
    """Write a random-init checkpoint of ``arch`` to ``folder``; returns the folder.

    ``router_bias [E]``: added to every router's logits through its weight (the router has no
    bias): a fixed direction ``u`` of the hidden space gets ``weight += bias[:, None] * u``; with RMS-
    normed inputs this shifts expert popularity (``fit_router_skew`` finds a bias)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, **sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    for m in model.modules():  # the model's init leaves some routers at zero: give them random rows
        if hasattr(m, "top_k") and isinstance(getattr(m, "weight", None), torch.nn.Parameter) \
                and m.weight.dim() == 2 and m.weight.shape[0] == getattr(m, "num_experts", -1):
            if float(m.weight.abs().sum()) == 0.0:
                m.weight.normal_(0.0, 0.5 / m.weight.shape[1] ** 0.5)
            if router_bias is not None:
                g = torch.Generator().manual_seed(seed + 1)
                u = torch.randn(m.weight.shape[1], generator=g)
                m.weight += torch.as_tensor(router_bias, dtype=torch.float32)[:, None] * (u / u.norm())[None, :]
    model.save_pretrained(str(folder))
    return str(folder)
