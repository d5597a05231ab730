"""The single-process ground truth: plain ``transformers`` greedy ``generate``, one request at a
time (no padding), with the logits of every generated token."""

from __future__ import annotations

import torch


@torch.no_grad()
def reference_generate(folder, requests: list[list[int]], max_new: list[int], eos: list[int] | None = None,
                       device="cpu"):
    """``(new_tokens [n][...], logits [n] of [steps, V] fp32)`` from ``AutoModelForCausalLM.generate``."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(device).eval()
    eos_ids = eos if eos is not None else model.generation_config.eos_token_id
    outs, logits = [], []
    for p, m in zip(requests, max_new):
        ids = torch.as_tensor([p], dtype=torch.int64, device=device)
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(m), do_sample=False,
                           eos_token_id=eos_ids, pad_token_id=0, return_dict_in_generate=True, output_logits=True,
                           min_new_tokens=0)
        outs.append(g.sequences[0, len(p):].tolist())
        logits.append(torch.stack([x[0].float().cpu() for x in g.logits]))
    return outs, logits
