"""Built-in synthetic expert-routing traces, fitted to the real ones.

So ``zepp bench`` runs on a machine without ``../shared/traces``, each model with recorded
traces (K2, Qwen3-235B) has a small parameter file ``zepp/data/synth_<model>.json`` and
:func:`synthetic_traces` draws a history (``pool``) and an evaluation (``eval``) window
from it, with the row counts of the real windows. Every other model preset draws from one of
these two *skew profiles* adapted to its expert count and top-k (:func:`adapt_params`; the
profile is chosen by the user or by :func:`default_profile` and named in the traces' source),
and :func:`synthetic_history` makes a multi-layer history from them.

The model (fitted by ``zepp.traces.synthetic_fit.fit_synth``, refitted by ``benchmarks/fit/fit_synth.py``):

- Tokens come in ``C`` latent *types* (mixture components). A type ``z`` has expert logits
  ``L[z, :]`` shared by both windows; it carries *which experts a token picks together*.
- Each window ``w`` has its own type weights ``pi[w, :]`` and a per-expert popularity tilt
  ``delta[w, :]``; the pair (pool, eval) carries the *drift* between history and evaluation.
- Experts with nearby ids are picked together less often than their popularity predicts
  (measured on both models: 5-15% fewer pairs at id distance below ~32). A kernel
  ``J[d]``, ``d = |i - j| <= D``, carries this: a token draws a type ``z ~ pi[w]``, one
  Gumbel noise ``g[e]`` per expert, and picks ``k`` distinct experts one after another, each
  the argmax of ``L[z] + delta[w] + g + sum over picked j of J[|e - j|]``. With ``J = 0``
  this is Plackett-Luce sampling (Gumbel top-k).

The fit matches each window's per-expert popularity and the pair rate by id distance
(``zepp.traces.synthetic_fit``); what the traces are judged on is ``zepp.traces.trace_stats``.
The real traces' rows are ordered by prompt; synthetic rows are independent draws (the
benchmark samples rows with replacement, so the order never reaches a result).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import read_json
from zepp.traces.trace import Trace

__all__ = ["SynthParams", "synthetic_traces", "load_params", "save_params", "sample_window",
           "PROFILES", "default_profile", "adapt_params", "synthetic_history", "synthetic_prompts",
           "preset_params"]

# Skew profiles: the generators fitted to recorded traces (zepp/data/synth_<profile>.json).
PROFILES = ("k2", "qwen")

WINDOWS = ("pool", "eval")
NEG_LOGIT = -30.0  # logit of an expert a window never selects (exp(-30) ~ 1e-13)


@dataclass(frozen=True)
class SynthParams:
    """Fitted generator of one model.

    ``logits [C, E]`` per-type expert logits; ``weights [2, C]`` type weights of the pool and
    eval windows; ``tilt [2, E]`` per-window popularity tilt; ``kernel [D + 1]`` co-selection
    score added per already-picked expert at id distance ``d`` (``kernel[0] = 0``);
    ``rows [2]`` rows per window.
    """

    model: str
    num_experts: int
    top_k: int
    logits: np.ndarray
    weights: np.ndarray
    tilt: np.ndarray
    kernel: np.ndarray
    rows: tuple[int, int]
    fit_seed: int = 0

    def count(self) -> int:
        """How many fitted numbers the generator holds."""
        return self.logits.size + self.weights.size + self.tilt.size + self.kernel.size - 1

    def to_json(self) -> dict:
        r = lambda a, d: np.round(np.asarray(a, dtype=np.float64), d).tolist()  # noqa: E731
        return {
            "model": self.model, "num_experts": self.num_experts, "top_k": self.top_k,
            "rows": {w: int(n) for w, n in zip(WINDOWS, self.rows)}, "fit_seed": self.fit_seed,
            "types": int(self.logits.shape[0]),
            "logits": r(self.logits, 3), "weights": {w: r(p, 5) for w, p in zip(WINDOWS, self.weights)},
            "tilt": {w: r(t, 3) for w, t in zip(WINDOWS, self.tilt)},
            "kernel": r(self.kernel, 4),
        }

    @staticmethod
    def from_json(d: dict, source: str = "<json>") -> "SynthParams":
        try:
            p = SynthParams(
                model=str(d["model"]), num_experts=int(d["num_experts"]), top_k=int(d["top_k"]),
                logits=np.asarray(d["logits"], dtype=np.float64),
                weights=np.asarray([d["weights"][w] for w in WINDOWS], dtype=np.float64),
                tilt=np.asarray([d["tilt"][w] for w in WINDOWS], dtype=np.float64),
                kernel=np.asarray(d["kernel"], dtype=np.float64),
                rows=tuple(int(d["rows"][w]) for w in WINDOWS), fit_seed=int(d.get("fit_seed", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ZeppInputError(f"{source}: not a synthetic-trace parameter file ({exc!r})") from None
        c, e = p.logits.shape if p.logits.ndim == 2 else (0, 0)
        if (e != p.num_experts or p.weights.shape != (2, c) or p.tilt.shape != (2, e)
                or p.kernel.ndim != 1 or not 1 <= p.kernel.size <= e):
            raise ZeppInputError(f"{source}: parameter shapes disagree (logits {p.logits.shape}, experts {e})")
        return p


def draw_picks(scores: np.ndarray, k: int, kernel: np.ndarray) -> np.ndarray:
    """Pick ``k`` distinct experts per row, greedily, from ``scores [n, E]`` (logits + Gumbel
    noise; modified in place); after each pick the others' scores gain ``kernel[|e - pick|]``.
    Returns ``[n, k]`` int32, sorted per row."""
    n, e = scores.shape
    d = kernel.size - 1
    # Padding by d columns each side lets the kernel window be added without clipping.
    pad = np.full((n, e + 2 * d), -np.inf, dtype=scores.dtype)
    pad[:, d:d + e] = scores
    offsets = np.arange(-d, d + 1)
    window = kernel[np.abs(offsets)].astype(scores.dtype)
    rows = np.arange(n)
    out = np.empty((n, k), dtype=np.int32)
    for s in range(k):  # loop over the k picks, vectorised over tokens
        c = np.argmax(pad, axis=1)
        out[:, s] = c - d
        pad[rows, c] = -np.inf
        if d and s < k - 1:
            pad[rows[:, None], c[:, None] + offsets[None, :]] += window
    return np.sort(out, axis=1)


def sample_window(params: SynthParams, window: str, rows: int, seed, chunk: int = 8192) -> np.ndarray:
    """``[rows, k]`` int32 synthetic rows of ``window`` (``pool`` or ``eval``)."""
    w = WINDOWS.index(window)
    rng = np.random.default_rng(seed)
    types = rng.choice(params.logits.shape[0], size=rows, p=params.weights[w] / params.weights[w].sum())
    out = np.empty((rows, params.top_k), dtype=np.int32)
    base = (params.logits + params.tilt[w]).astype(np.float32)
    for lo in range(0, rows, chunk):  # chunks bound the [n, E] score buffer
        z = types[lo:lo + chunk]
        scores = base[z] + rng.gumbel(size=(len(z), params.num_experts)).astype(np.float32)
        out[lo:lo + chunk] = draw_picks(scores, params.top_k, params.kernel)
    return out


def _data_file(model: str):
    return resources.files("zepp") / "data" / f"synth_{model}.json"


def load_params(model: str, path=None) -> SynthParams:
    """The shipped parameters of ``model`` (or those in ``path``)."""
    if path is None:
        f = _data_file(model)
        if not f.is_file():
            raise ZeppInputError(
                f"no fitted skew profile {model!r}; profiles: {', '.join(PROFILES)} (every model preset draws "
                f"its built-in traces from one of them: synthetic_traces(model, profile=...))"
            )
        text, source = f.read_text(), f"zepp/data/synth_{model}.json"
    else:
        return SynthParams.from_json(read_json(path, "skew profile"), str(path))
    return SynthParams.from_json(json.loads(text), source)


def save_params(params: SynthParams, path) -> None:
    Path(path).write_text(json.dumps(params.to_json(), separators=(",", ":")) + "\n")


def default_profile(model_name: str) -> str:
    """The skew profile a preset's built-in traces come from: its own fit where one exists
    (``k2``, ``qwen``), else ``k2`` for models with more than 128 experts and ``qwen`` otherwise
    (the fitted model closest in expert count)."""
    from zepp.model import model_preset

    if model_name in PROFILES:
        return model_name
    return "k2" if model_preset(model_name).num_experts > 128 else "qwen"


def _live_columns(p: SynthParams, n: int) -> np.ndarray:
    """``n`` evenly spaced expert ids among those both windows select (tilt above the floor)."""
    live = np.flatnonzero((p.tilt > NEG_LOGIT / 2).all(axis=0))
    if live.size < n:
        live = np.arange(p.num_experts)
    return live[(np.arange(n) * live.size) // n]


def adapt_params(src: SynthParams, num_experts: int, top_k: int, model: str) -> SynthParams:
    """A generator for ``num_experts`` / ``top_k`` with the skew of ``src``.

    Fewer experts: evenly spaced live experts of ``src`` keep their per-type logits and tilts
    (so popularity skew, drift between windows and token types carry over). More experts: each
    source expert is split into equal parts (logit minus ``log(parts)``: the group keeps its
    share). The co-selection kernel is rescaled in id distance (``d -> d * E_src / E``).
    """
    e_s, e_t = src.num_experts, int(num_experts)
    if e_t <= e_s:
        cols = _live_columns(src, e_t)
        logits, tilt = src.logits[:, cols], src.tilt[:, cols]
    else:
        cols = (np.arange(e_t) * e_s) // e_t
        parts = np.bincount(cols, minlength=e_s)[cols]
        logits, tilt = src.logits[:, cols] - np.log(parts), src.tilt[:, cols]
    d_s = src.kernel.size - 1
    d_t = max(1, min(e_t - 1, e_t // 4))
    idx = np.minimum(np.rint(np.arange(d_t + 1) * e_s / e_t).astype(int), d_s)
    kernel = src.kernel[idx].copy()
    kernel[0] = 0.0
    if top_k > e_t:
        raise ZeppInputError(f"model {model!r}: top-{top_k} exceeds its {e_t} experts")
    return SynthParams(model, e_t, int(top_k), logits, src.weights.copy(), tilt, kernel, src.rows, src.fit_seed)


def synthetic_traces(model_name: str, seed: int = 0, params: SynthParams | None = None,
                     profile: str | None = None) -> tuple[Trace, Trace]:
    """``(pool, eval)`` synthetic traces of ``model_name``, with the real windows' row counts.

    Every model preset has them: drawn from skew ``profile`` (``k2`` or ``qwen``, default
    :func:`default_profile`) adapted to the preset's experts and top-k (:func:`adapt_params`);
    the traces' ``source`` names the profile. The same ``seed`` gives the same rows.
    ``params`` overrides the generator. Shipped-profile draws are cached per
    ``(model, profile, seed)``; each call returns fresh copies.
    """
    if params is None:
        from zepp.model import model_preset

        spec = model_preset(model_name)
        prof = default_profile(model_name) if profile is None else profile
        if prof not in PROFILES:
            raise ZeppInputError(f"unknown skew profile {prof!r}; choose one of {', '.join(PROFILES)}")
        ids = _cached_windows(spec.name, prof, int(seed))
        e = spec.num_experts
        tag = f"synthetic:{spec.name}/{{w}}(seed={seed})" if prof == spec.name else \
            f"synthetic:{spec.name}/{{w}}(profile={prof},seed={seed})"
    else:
        ids = _windows(params, int(seed))
        e = params.num_experts
        tag = f"synthetic:{params.model}/{{w}}(seed={seed})"
    return tuple(  # type: ignore[return-value]
        Trace(a.copy(), e, tag.format(w=window)) for a, window in zip(ids, WINDOWS)
    )


def synthetic_history(model_name: str, profile: str | None = None, seed: int = 0, window: str = "pool",
                      layers: tuple[int, ...] | None = None):
    """A multi-layer :class:`~zepp.traces.layer_history.LayerHistory` of built-in synthetic traces: MoE layer
    ``j`` (of ``M``) is ``window``'s rows with expert ids rotated by ``j * E // M`` (the hot
    experts move from layer to layer, as in real models), each layer's rows in an order of its
    own (seeded). ``layers``: model layer indices (default every MoE layer of the preset)."""
    from zepp.traces.layer_history import history_from_traces
    from zepp.model import model_preset

    spec = model_preset(model_name)
    pool, ev = synthetic_traces(model_name, seed=seed, profile=profile)
    base = pool if window == "pool" else ev
    layers = tuple(spec.moe_layers if layers is None else layers)
    m = len(layers)
    e = spec.num_experts
    traces = []
    for j, layer in enumerate(layers):
        order = np.random.default_rng([seed, 7, j]).permutation(len(base))
        ids = (base.topk_ids[order] + (j * e) // m) % e
        traces.append(Trace(ids.astype(np.int32), e, f"{base.source}:layer{layer}"))
    return history_from_traces(traces, layers, base.source[:-1] + f",layers={m})", "synthetic")


def _windows(p: SynthParams, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Distinct seed-derived streams per window.
    return tuple(sample_window(p, window, p.rows[w], seed=[seed, w]) for w, window in enumerate(WINDOWS))


def preset_params(model_name: str, profile: str) -> SynthParams:
    """The generator of preset ``model_name`` drawn from skew ``profile`` (adapted when needed)."""
    from zepp.model import model_preset

    p = load_params(profile)
    spec = model_preset(model_name)
    if model_name != profile or (spec.num_experts, spec.top_k) != (p.num_experts, p.top_k):
        p = adapt_params(p, spec.num_experts, spec.top_k, model_name)
    return p


@functools.lru_cache(maxsize=8)
def _cached_windows(model_name: str, profile: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return _windows(preset_params(model_name, profile), seed)


def synthetic_prompts(model_name: str, seed: int = 0, rows_per_prompt: int = 32,
                      profile: str | None = None) -> tuple[Trace, Trace]:
    """``(pool, eval)`` prompt-ordered synthetic windows, for topics (``zepp.traces.topics``).

    The real windows' row counts, cut into prompts of ``rows_per_prompt`` rows; every prompt
    draws one latent type from the pool window's type weights and all its rows, in both
    windows, come from that type (a prompt keeps asking for the same kind of experts, as
    recorded prompts do). Other than that the generator is :func:`synthetic_traces`'s.
    """
    prof = default_profile(model_name) if profile is None else profile
    if prof not in PROFILES:
        raise ZeppInputError(f"unknown skew profile {prof!r}; choose one of {', '.join(PROFILES)}")
    p = preset_params(model_name, prof)
    prompts = p.rows[0] // rows_per_prompt
    rng = np.random.default_rng([seed, 31])
    kind = rng.choice(p.logits.shape[0], size=prompts, p=p.weights[0] / p.weights[0].sum())
    out = []
    for w, window in enumerate(WINDOWS):
        ids = np.empty((prompts, rows_per_prompt, p.top_k), dtype=np.int32)
        for z in np.unique(kind):  # one draw per latent type, vectorised over its prompts' rows
            one = np.zeros_like(p.weights)
            one[:, z] = 1.0
            pz = SynthParams(p.model, p.num_experts, p.top_k, p.logits, one, p.tilt, p.kernel, p.rows, p.fit_seed)
            n = int((kind == z).sum())
            ids[kind == z] = sample_window(pz, window, n * rows_per_prompt, [seed, 31, w, int(z)]).reshape(n, rows_per_prompt, -1)
        out.append(Trace(ids.reshape(-1, p.top_k), p.num_experts,
                         f"synthetic:{model_name}/{window}(profile={prof},seed={seed},prompts)"))
    return out[0], out[1]
