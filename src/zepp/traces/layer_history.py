"""Every MoE layer's expert history, in one internal form whatever engine recorded it.

:class:`LayerHistory` holds per MoE layer either

- **tokens**: ``topk_ids [N, k]`` per token (a :class:`~zepp.traces.trace.Trace`), in recorded
  order, optionally with the EP rank that held each token; or
- **counts**: a load histogram ``[B, S, E]`` per layer: ``B`` time bins (consecutive
  groups of the recorded steps, at most ``MAX_BINS``: :func:`bin_steps`), ``S`` sources (EP
  ranks that sent the entries, or ``S = 1`` when the engine summed over them), ``E`` logical
  experts.

What each form supports as placement input (:meth:`LayerHistory.node_demand`):

| form | node demand ``[N, E]`` (zepp placement) | total load ``[E]`` (EPLB) | batches for the report |
| --- | --- | --- | --- |
| tokens | rows dealt to the planned ranks (``zepp.traces.sampling.node_demand``, shuffled) | yes | sampled rows |
| counts, sources = ranks | recorded ranks grouped onto the planned nodes (``S = R``: rank ``r`` on node ``r // L``; ``S`` a multiple of ``N``: ``S/N`` consecutive ranks per node) | yes | drawn per source |
| counts, no sources | **assumed**: every node asks for each expert in equal share | yes | drawn from the total |

A histogram without source ranks cannot say which node asks for what: Zepp's placement then
spreads replicas by load only, and the report's locality gain is an estimate on tokens drawn
from that assumption. Batches drawn from a histogram pick ``k`` distinct experts per token in
proportion to load (Gumbel top-k); which experts are picked *together* is not recorded, so
drawn batches have no co-selection structure.

Engines' recordings are read into it by :func:`zepp.interop.history.read_history`; synthetic
traces by :func:`history_from_traces` (``zepp.traces.synthetic.synthetic_history``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from zepp.errors import ZeppInputError
from zepp.traces.sampling import node_demand, sample_batches
from zepp.traces.trace import Trace

__all__ = ["LayerHistory", "history_from_traces", "bin_steps", "MAX_BINS", "check_signal"]

MAX_BINS = 10


@dataclass(frozen=True)
class LayerHistory:
    """Every MoE layer's history (see the module docstring).

    ``layers``: model layer index of each entry; ``None`` means one history that stands for
    every MoE layer (a single-layer trace). ``tokens`` (form ``tokens``) or ``counts``
    (``[M, B, S, E]`` int64, form ``counts``); ``sources`` is ``"ranks"`` or ``"none"``;
    ``token_ranks``: per layer the recorded EP rank of each token row (or ``None``).
    """

    source: str
    format: str
    num_experts: int
    top_k: int | None
    layers: tuple[int, ...] | None
    tokens: tuple[Trace, ...] | None = None
    counts: np.ndarray | None = None
    sources: str = "none"
    token_ranks: tuple[np.ndarray | None, ...] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def form(self) -> str:
        return "tokens" if self.tokens is not None else "counts"

    @property
    def num_entries(self) -> int:
        return len(self.tokens) if self.tokens is not None else int(self.counts.shape[0])

    @property
    def num_sources(self) -> int:
        return 1 if self.counts is None else int(self.counts.shape[2])

    def describe(self) -> str:
        what = (f"{self.num_entries} layer(s)" if self.layers is not None else "one layer (used for every MoE layer)")
        if self.form == "tokens":
            rows = sum(len(t) for t in self.tokens)
            body = f"top-{self.top_k} ids of {rows} token rows"
        else:
            src = f"{self.num_sources} source ranks" if self.sources == "ranks" else "no source ranks"
            body = f"load histograms ({self.counts.shape[1]} time bins, {src})"
        return f"{self.source} [{self.format}]: {what}, {self.num_experts} experts, {body}"

    # ------------------------------------------------------------ held-out split

    def split(self, heldout: float) -> tuple["LayerHistory", "LayerHistory | None"]:
        """``(history, held-out)``: the last ``heldout`` fraction of each layer's rows (tokens)
        or time bins (counts) held out; ``None`` when nothing can be held out."""
        if not 0 <= heldout < 1:
            raise ZeppInputError(f"--heldout must lie in [0, 1), got {heldout!r}")
        if heldout == 0:
            return self, None
        return self._split_tokens(heldout) if self.form == "tokens" else self._split_counts(heldout)

    def _split_tokens(self, heldout: float) -> tuple["LayerHistory", "LayerHistory | None"]:
        head, tail, head_ranks, tail_ranks = [], [], [], []
        for i, t in enumerate(self.tokens):
            cut = int(round(len(t) * (1 - heldout)))
            if cut < 1 or cut >= len(t):
                return self, None
            head.append(Trace(t.topk_ids[:cut], t.num_experts, t.source + "[history]"))
            tail.append(Trace(t.topk_ids[cut:], t.num_experts, t.source + "[held-out]"))
            ranks = self.token_ranks[i] if self.token_ranks else None
            head_ranks.append(None if ranks is None else ranks[:cut])
            tail_ranks.append(None if ranks is None else ranks[cut:])
        return (dataclasses.replace(self, tokens=tuple(head), token_ranks=tuple(head_ranks)),
                dataclasses.replace(self, tokens=tuple(tail), token_ranks=tuple(tail_ranks)))

    def _split_counts(self, heldout: float) -> tuple["LayerHistory", "LayerHistory | None"]:
        b = self.counts.shape[1]
        cut = int(round(b * (1 - heldout)))
        if b < 2 or cut < 1 or cut >= b:
            return self, None
        return (dataclasses.replace(self, counts=self.counts[:, :cut], token_ranks=None),
                dataclasses.replace(self, counts=self.counts[:, cut:], token_ranks=None))

    # ------------------------------------------------------------ placement inputs

    def load(self, i: int) -> np.ndarray:
        """Total entries per expert ``[E]`` of entry ``i``."""
        if self.form == "tokens":
            return self.tokens[i].expert_load()
        return self.counts[i].sum(axis=(0, 1))

    def _source_node_weights(self, nodes: int) -> np.ndarray | None:
        """``[S, N]`` share of each recorded source that lands on each planned node, or ``None``
        when sources are unknown."""
        s = self.num_sources
        if self.sources != "ranks" or s < 2:
            return None
        if s % nodes == 0:
            w = np.zeros((s, nodes))
            w[np.arange(s), np.arange(s) * nodes // s] = 1.0
            return w
        return None

    def node_demand(self, i: int, nodes: int, gpus_per_node: int) -> tuple[np.ndarray, str]:
        """``(hist [N, E] int64, how)``: the demand each planned node puts on each expert, and a
        sentence saying how it was obtained (what was assumed)."""
        if self.form == "tokens":
            return self._token_node_demand(i, nodes, gpus_per_node)
        c = self.counts[i].sum(axis=0)  # [S, E]
        w = self._source_node_weights(nodes)
        if w is not None:
            return (w.T @ c).astype(np.int64), f"{self.num_sources} recorded source ranks grouped onto {nodes} nodes"
        total = c.sum(axis=0)
        base, rem = total // nodes, total % nodes
        h = np.broadcast_to(base, (nodes, self.num_experts)) + (np.arange(nodes)[:, None] < rem[None, :])
        why = ("no source ranks recorded" if self.sources != "ranks"
               else f"{self.num_sources} recorded ranks do not group onto {nodes} nodes")
        return h.astype(np.int64), f"{why}: every node assumed to ask for each expert in equal share"

    def _token_node_demand(self, i: int, nodes: int, gpus_per_node: int) -> tuple[np.ndarray, str]:
        t = self.tokens[i]
        ranks = self.token_ranks[i] if self.token_ranks else None
        r = nodes * gpus_per_node
        if ranks is not None and int(ranks.max(initial=-1)) + 1 == r:
            node = ranks // gpus_per_node
            key = node[:, None].astype(np.int64) * self.num_experts + t.topk_ids
            h = np.bincount(key.ravel(), minlength=nodes * self.num_experts).reshape(nodes, self.num_experts)
            return h.astype(np.int64), "token rows on their recorded ranks"
        return node_demand(t, nodes, gpus_per_node), "token rows dealt to the planned ranks (shuffled)"

    def batches(self, i: int, ranks: int, tokens_per_rank: int, iters: int, seed: int) -> np.ndarray:
        """``[iters, R, T, k]`` evaluation batches of entry ``i`` (sampled rows, or drawn from
        the histogram: ``k`` distinct experts per token in proportion to the source's load)."""
        if self.form == "tokens":
            return sample_batches(self.tokens[i], ranks, tokens_per_rank, iters, seed)
        if self.top_k is None:
            raise ZeppInputError(f"{self.source}: the histogram does not say top-k; pass --model or --topk")
        k = self.top_k
        c = self.counts[i].sum(axis=0).astype(np.float64)  # [S, E]
        s = c.shape[0]
        src_of_rank = np.arange(ranks) * s // ranks if s > 1 else np.zeros(ranks, dtype=np.int64)
        rng = np.random.default_rng(seed)
        with np.errstate(divide="ignore"):
            logp = np.log(c / np.maximum(c.sum(axis=1, keepdims=True), 1))
        out = np.empty((iters, ranks, tokens_per_rank, k), dtype=np.int32)
        for r in range(ranks):  # loop over ranks; vectorised over tokens
            g = rng.gumbel(size=(iters * tokens_per_rank, self.num_experts)) + logp[src_of_rank[r]]
            top = np.argpartition(-g, k - 1, axis=1)[:, :k]
            out[:, r] = np.sort(top, axis=1).reshape(iters, tokens_per_rank, k)
        return out


# the most entries one layer's counts may sum to: far beyond any recording, and far from int64's wrap
MAX_LAYER_ENTRIES = 1 << 60


def check_signal(hist: LayerHistory) -> LayerHistory:
    """``hist`` if every layer carries load to plan from: no steps (no token rows, no time bins),
    an all-zero load, negative counts (a wrapped int64) or a total beyond ``MAX_LAYER_ENTRIES``
    are refused naming the layer, since a placement planned from them would be uninformed."""
    names = hist.layers if hist.layers is not None else ("(every MoE layer)",)
    if hist.form == "tokens":
        for name, t in zip(names, hist.tokens):
            if len(t) == 0:
                raise ZeppInputError(f"{hist.source}: layer {name} has no token rows (no steps recorded); a placement "
                                     f"needs load to plan from: record more steps")
        return hist
    c = hist.counts
    if c.shape[1] == 0 or c.shape[2] == 0:
        raise ZeppInputError(f"{hist.source}: the counts hold no steps (shape {tuple(c.shape)}); a placement needs "
                             f"load to plan from: record more steps")
    for i, name in enumerate(names):
        li = c[i]
        if int(li.min()) < 0:
            raise ZeppInputError(f"{hist.source}: layer {name} holds negative counts (a count beyond int64 "
                                 f"wrapped, or a corrupt file); give the recorded counts")
        total = float(li.sum(dtype=np.float64))
        if total > MAX_LAYER_ENTRIES:
            raise ZeppInputError(f"{hist.source}: layer {name}'s counts sum to {total:.3g}, beyond "
                                 f"2**60 (int64 overflows); give the recorded counts")
        if total == 0:
            raise ZeppInputError(f"{hist.source}: layer {name} has no load at all (every count is 0); a placement "
                                 f"planned from it would be uninformed: record steps with traffic")
    return hist


def bin_steps(counts: np.ndarray, axis_steps: int = 0) -> np.ndarray:
    """``counts`` (int64) with its steps axis (``axis_steps``) grouped into at most ``MAX_BINS``
    consecutive bins, the form ``counts`` of a :class:`LayerHistory` keeps."""
    n = counts.shape[axis_steps]
    b = max(1, min(MAX_BINS, n))
    edges = np.arange(n) * b // n
    out = np.zeros((b,) + counts.shape[:axis_steps] + counts.shape[axis_steps + 1:], dtype=np.int64)
    np.add.at(out, edges, np.moveaxis(counts, axis_steps, 0).astype(np.int64))
    return np.moveaxis(out, 0, axis_steps)


def history_from_traces(traces: list[Trace], layers: tuple[int, ...], source: str,
                        fmt: str = "synthetic") -> LayerHistory:
    """A tokens-form history from in-memory traces (synthetic multi-layer traces)."""
    if not traces:
        raise ZeppInputError("history_from_traces: no traces")
    e = traces[0].num_experts
    return LayerHistory(source, fmt, e, traces[0].top_k, tuple(layers), tuple(traces),
                        token_ranks=tuple(None for _ in traces))
