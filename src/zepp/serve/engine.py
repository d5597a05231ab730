"""Generation on one rank: data-parallel attention, expert-parallel MoE, greedy decoding.

``deal(lengths, ranks)`` deals requests to ranks (longest first, to the rank with the fewest
prompt tokens so far). Each rank batches its own requests (left padding, an attention mask and
position ids as ``generate`` builds them, the model's own ``DynamicCache``) and runs:

- step 0, prefill: every prompt token of its requests;
- then decode steps: one token per unfinished request, until each has its ``max_new_tokens``
  or emitted an end-of-sequence id (that token is kept, as ``generate`` keeps it).

Only live rows enter the MoE layers: padding and finished requests never reach routing or the
wire, so every rank holds its own ragged ``T_r`` per step. A rank with no live rows (no requests,
or all finished) still takes part in every MoE layer of every step with zero rows
(``ExpertParallelMoE.idle``), until the count all-gather of ``begin_step`` shows every rank done.

Between steps, systems that swap experts (``System.swaps``, the adaptation record's flag) plan
intra-node swaps per layer from that layer's recent slot loads
(``zepp.planner.adaptation.swaps.plan_swaps``) and post the weight copies inside the node
(``zepp.runtime.swap_copies``); they run beside the next step, whose layer waits only where a
swapped slot's GEMM needs its weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from zepp.serve.loader import ep_blocks


def deal(lengths: list[int], ranks: int) -> list[list[int]]:
    """Request indices per rank: longest prompt first, to the least-loaded rank (ties: lowest rank);
    each rank's list in input order."""
    load = [0] * ranks
    out: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(ranks), key=lambda q: (load[q], len(out[q]), q))
        out[r].append(i)
        load[r] += lengths[i]
    return [sorted(o) for o in out]


@dataclass
class StepLog:
    """What one rank saw: per step wall time, live rows and swap activity."""

    seconds: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    all_rows: list[int] = field(default_factory=list)  # live rows over all ranks
    swapped_slots: list[int] = field(default_factory=list)
    swap_bytes: list[int] = field(default_factory=list)
    swap_seconds: list[float] = field(default_factory=list)  # planning + posting, between steps
    swap_wait_seconds: list[float] = field(default_factory=list)  # waiting for copies inside the step
    bytes_after_prefill: dict | None = None
    probes: list = field(default_factory=list)


def _eos_set(config) -> set[int]:
    gc = getattr(config, "eos_token_id", None)
    if gc is None:
        return set()
    return {int(gc)} if isinstance(gc, int) else {int(x) for x in gc}


class RankBatch:
    """This rank's requests as one batch: left-padded ids, attention mask and position ids as
    ``generate`` builds them, the model's ``DynamicCache``, and per request the new tokens, the
    kept logits and whether it is done (``max_new`` tokens, or an end-of-sequence id)."""

    def __init__(self, model, prompts: list[list[int]], max_new: list[int], device, keep_logits: bool):
        from transformers import DynamicCache

        n = len(prompts)
        self.n, self.max_new, self.device, self.keep_logits = n, max_new, device, keep_logits
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.logits_out: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.done = np.array([m <= 0 for m in max_new], bool)
        if not n:
            return
        Lmax = max(len(p) for p in prompts)
        ids = torch.zeros(n, Lmax, dtype=torch.int64)
        mask = torch.zeros(n, Lmax, dtype=torch.int64)
        for i, p in enumerate(prompts):
            ids[i, Lmax - len(p):] = torch.as_tensor(p, dtype=torch.int64)
            mask[i, Lmax - len(p):] = 1
        self.ids, self.mask = ids.to(device), mask.to(device)
        self.pos = (self.mask.cumsum(-1) - 1).clamp_min(0)
        self.cache = DynamicCache(config=model.config)
        self.live = self.mask.reshape(-1).bool()

    def rows(self, step: int) -> torch.Tensor:
        """``[T_r]`` live rows of the flattened hidden states: every prompt token at step 0, then
        one per unfinished request."""
        if step == 0 and self.n:
            return torch.nonzero(self.live).squeeze(1)
        if self.n:
            return torch.nonzero(torch.as_tensor(~self.done, device=self.device)).squeeze(1)
        return torch.zeros(0, dtype=torch.int64, device=self.device)

    def advance(self, model, eos: set[int]) -> None:
        """One forward over the batch; the greedy next token of every unfinished request."""
        res = model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos, cache=self.cache,
                    use_cache=True)
        last = res.logits[:, -1, :].float()
        nxt = last.argmax(-1)
        for i in np.flatnonzero(~self.done).tolist():
            tok = int(nxt[i])
            self.out[i].append(tok)
            if self.keep_logits:
                self.logits_out[i].append(last[i].cpu())
            if tok in eos or len(self.out[i]) >= self.max_new[i]:
                self.done[i] = True
        self.ids = nxt[:, None]
        self.mask = torch.cat([self.mask, torch.ones(self.n, 1, dtype=self.mask.dtype, device=self.device)], dim=1)
        self.pos = self.pos[:, -1:] + 1

    def logits(self) -> list[torch.Tensor] | None:
        """``[n][steps, V]`` logits of every request (``None`` unless ``keep_logits``)."""
        if not self.keep_logits:
            return None
        return [torch.stack(x) if x else torch.zeros(0) for x in self.logits_out]


@torch.no_grad()
def generate_rank(model, comm, prompts: list[list[int]], max_new: list[int], eos: set[int] | None = None,
                  keep_logits: bool = False, adapt=None, fault=None, probe=None):
    """Generate for this rank's ``prompts`` (token-id lists); every rank calls this together.

    ``max_new [n]`` new tokens per prompt; ``eos``: end-of-sequence ids (default: the config's);
    ``adapt``: called between steps (swaps), ``adapt.close()`` at the end; ``fault``: test hook ``{"step", "mode"}``;
    ``probe``: a function whose value is kept at the start, after prefill and at the end
    (``log.probes``; e.g. the emulated NIC counters).
    Returns ``(new_tokens [n][...], logits [n][steps, V] or None, StepLog)``.
    """
    eos = _eos_set(model.config) if eos is None else set(eos)
    blocks = ep_blocks(model)
    batch = RankBatch(model, prompts, max_new, comm.device, keep_logits)
    log = StepLog()
    if probe is not None:
        log.probes.append(probe())
    step = 0
    while True:
        t0 = time.perf_counter()
        if fault and fault.get("step") == step:
            _inject(fault)
        rows = batch.rows(step)
        counts = comm.begin_step(rows, int(rows.numel()))
        if int(counts.sum()) == 0:  # every rank is done
            break
        if rows.numel():
            batch.advance(model, eos)
        else:
            for b in blocks:
                b.idle()
        log.seconds.append(time.perf_counter() - t0)
        log.rows.append(int(rows.numel()))
        log.all_rows.append(int(counts.sum()))
        if step == 0:
            log.bytes_after_prefill = {p: v.copy() for p, v in comm.dispatcher.counter.by_dst.items()}
            if probe is not None:
                log.probes.append(probe())
        if adapt is not None:
            adapt(log)
        step += 1
    if adapt is not None:
        adapt.close()
    if probe is not None:
        log.probes.append(probe())
    return batch.out, batch.logits(), log


def _inject(fault: dict) -> None:
    import os

    if fault.get("mode", "die") == "die":
        os._exit(17)
    time.sleep(3600)


class Swapper:
    """Swaps between steps (``System.swaps``): per layer, plan intra-node swaps from its recent
    slot loads and post the weight copies (inside nodes only) on a channel of their own; the next
    step's layer waits for a slot's copy only where that slot's GEMM needs it, and finishes the
    rest (``zepp.serve.comm.ExpertParallel.moe``). ``swapper(log)`` appends per step the swaps, bytes
    and seconds (planning + posting) of the swaps it posts, and the seconds the step just run
    waited for copies. ``sent_to [R]``: swap weight bytes this rank sent, per rank. Every rank
    constructs its ``Swapper`` at the same point (the channel is a process group)."""

    def __init__(self, model, comm):
        from zepp.runtime.swap_copies import SwapChannel

        self.comm = comm
        self.blocks = ep_blocks(model)
        self.sent_to = np.zeros(comm.world, np.int64)
        self.channel = SwapChannel(comm.dispatcher.group, comm.device)

    def __call__(self, log: StepLog) -> None:
        from zepp.planner.adaptation.swaps import plan_swaps
        from zepp.runtime.swap_copies import post_copies

        comm = self.comm
        log.swap_wait_seconds.append(comm.swap_wait_s)
        comm.swap_wait_s = 0.0
        t0 = time.perf_counter()
        slots, sent = 0, 0
        for b in self.blocks:
            old = comm.placements[b.layer]
            sp = plan_swaps(old, comm.recent_loads(b.layer), comm.relaxation)
            if not sp.num_swapped_slots:
                continue
            pc = post_copies([b.gate_up, b.down], sp.copies, old.slot_expert, sp.placement.slot_expert,
                             self.channel, old.gpus_per_node, tag_base=b.layer << 20)
            comm.pending[b.layer] = pc
            self.sent_to += pc.stats.sent_to
            sent += pc.stats.sent
            comm.placements[b.layer] = sp.placement
            comm.recent[b.layer] = [np.asarray(sp.slot_load, np.int64)]
            slots += sp.num_swapped_slots
        log.swapped_slots.append(slots)
        log.swap_bytes.append(sent)
        log.swap_seconds.append(time.perf_counter() - t0)

    def close(self) -> None:
        """Finish copies posted after the last step (no layer will wait for them)."""
        for layer in list(self.comm.pending):
            self.comm.swap_wait_s += self.comm.pending.pop(layer).finish().wait_s
