"""Module surgery: each sparse MoE block of a transformers model becomes an expert-parallel block.

A sparse MoE block, as transformers 5 writes them (Qwen3-MoE, Mixtral, DeepSeek-V3, OLMoE, ...),
is a module with a router ``gate`` (``gate(x [T, H]) -> (logits, weights [T, k], ids [T, k])``),
``experts`` holding stacked ``gate_up_proj [E, 2F, H]`` / ``down_proj [E, H, F]`` and an
``act_fn``, and optionally ``shared_experts`` (a dense MLP added to every token's output;
DeepSeek-V2/V3) or ``shared_expert`` with a sigmoid ``shared_expert_gate`` (Qwen2-MoE). A block
with any other part is refused (``UnsupportedBlock``) rather than served without it.
``find_moe_blocks`` finds them; ``ExpertParallelMoE`` replaces one (``model.set_submodule``; no
transformers class is changed or patched): it keeps the model's own router and shared experts,
holds the weights of this rank's slots only, ``gate_up [S, 2F, H]`` / ``down [S, H, F]`` (a
replica is a copy; empty slots are zeros), and hands the rows to the process-wide
``ExpertParallel`` (``zepp.serve.comm``), which moves them with a zepp system.

Rows of the hidden states that are not real tokens of this step (left padding, finished
requests) never enter the block's routing or the wire: the engine tells ``ExpertParallel`` which
rows are live (``rows [T_r]``); their outputs stay zero (plus the shared experts, whose output
on dead rows is never read).
"""

from __future__ import annotations

import torch
from torch import nn


KNOWN_PARTS = {"gate", "experts", "shared_experts", "shared_expert", "shared_expert_gate"}


class UnsupportedBlock(ValueError):
    """A sparse MoE block with parts zepp does not know how to serve."""


def is_moe_block(m: nn.Module) -> bool:
    """A transformers 5 sparse MoE block (see module docstring)."""
    ex, gate = getattr(m, "experts", None), getattr(m, "gate", None)
    if not isinstance(ex, nn.Module) or not isinstance(gate, nn.Module):
        return False
    gu, dn = getattr(ex, "gate_up_proj", None), getattr(ex, "down_proj", None)
    return (isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == 3 and dn.dim() == 3
            and hasattr(ex, "act_fn") and hasattr(gate, "top_k"))


def find_moe_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(module path, block)]`` of every sparse MoE block, in layer order."""
    out = [(n, m) for n, m in model.named_modules() if is_moe_block(m)]
    for n, m in out:
        extra = {c for c, _ in m.named_children()} - KNOWN_PARTS
        if extra or (hasattr(m, "shared_expert") != hasattr(m, "shared_expert_gate")):
            raise UnsupportedBlock(f"MoE block {n} ({type(m).__name__}) has parts zepp cannot serve: "
                                   f"{sorted(extra) or ['shared_expert without shared_expert_gate']}")
    return out


class ExpertParallelMoE(nn.Module):
    """The expert-parallel replacement of one sparse MoE block (see module docstring).

    ``forward(hidden_states [B, L, H]) -> [B, L, H]``, as the block it replaces. ``layer``: index
    among the model's MoE blocks (selects this layer's placement); ``slots``: local slot count.
    """

    def __init__(self, block: nn.Module, layer: int, comm, slots: int):
        super().__init__()
        E, F2, H = block.experts.gate_up_proj.shape
        self.layer, self.comm = layer, comm
        self.num_experts, self.hidden, self.ffn = int(E), int(H), int(F2) // 2
        self.top_k = int(block.gate.top_k)
        self.gate = block.gate
        self.act_fn = block.experts.act_fn
        self.shared_experts = getattr(block, "shared_experts", None)
        self.shared_expert = getattr(block, "shared_expert", None)
        self.shared_expert_gate = getattr(block, "shared_expert_gate", None)
        dt, dev = block.experts.gate_up_proj.dtype, block.experts.gate_up_proj.device
        self.register_buffer("gate_up", torch.zeros(slots, int(F2), self.hidden, dtype=dt, device=dev))
        self.register_buffer("down", torch.zeros(slots, self.hidden, self.ffn, dtype=dt, device=dev))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own router on ``x [T, H]``: ``(ids [T, k] int64, weights [T, k])``."""
        if x.shape[0] == 0:  # some routers reshape by group and cannot take zero rows
            return (torch.zeros(0, self.top_k, dtype=torch.int64, device=x.device),
                    torch.zeros(0, self.top_k, dtype=torch.float32, device=x.device))
        _, w, ids = self.gate(x)
        return ids.to(torch.int64), w

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        rows = self.comm.rows
        x = flat if rows is None else flat.index_select(0, rows)
        ids, w = self.route(x)
        y = self.comm.moe(self.layer, x, ids, w, self)
        if rows is None:
            out = y.to(flat.dtype)
        else:
            out = torch.zeros_like(flat)
            out.index_copy_(0, rows, y.to(flat.dtype))
        out = out.view(shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        if self.shared_expert is not None:  # Qwen2-MoE: sigmoid-gated shared expert on every row
            out = out + (torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)).view(shape)
        return out

    def idle(self) -> None:
        """Take part in this layer with zero rows (a rank with no live tokens this step)."""
        x = torch.zeros(0, self.hidden, dtype=self.gate_up.dtype, device=self.gate_up.device)
        ids, w = self.route(x)
        self.comm.moe(self.layer, x, ids, w, self)
