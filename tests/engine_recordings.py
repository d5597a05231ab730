"""Engine recordings made in the tests (SGLang dumps, TensorRT-LLM statistics, vLLM load
windows, zepp recorder folders) for a small model, shared by ``tests/interop`` (what is read
from them) and ``tests/cli/test_cli_place.py`` (what ``zepp place`` writes from them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zepp.model import model_preset

MODEL = "deepseek-v2-lite"  # 27 layers, the first dense, 64 experts, top-6
SPEC = model_preset(MODEL)
E, K = SPEC.num_experts, SPEC.top_k


def skewed_counts(rng, steps, layers, e, dense=(0,)):
    """``[steps, layers, e]`` Poisson counts around Pareto popularities; ``dense`` rows zero."""
    pop = rng.pareto(1.2, size=(layers, e)) + 0.05
    c = rng.poisson(pop[None] * 40, size=(steps, layers, e)).astype(np.int64)
    c[:, list(dense)] = 0
    return c


def copies_per_node(row, nodes):
    """``[nodes, E]`` copies of each expert on each node of one layer's physical map ``row [P]``."""
    node = np.arange(row.size) // (row.size // nodes)
    return np.bincount(node * E + row, minlength=nodes * E).reshape(nodes, E)


def trtllm_stats(d: Path, rng, raw=False):
    """TensorRT-LLM expert statistics in folder ``d``: 4 ranks, 3 iterations, every MoE layer;
    bincounts, or the selected ids (``raw``)."""
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "meta_info.json").write_text(json.dumps({"num_experts": E, "num_experts_per_token": K}))
    for r in range(4):
        data = {}
        for it in range(3):
            for layer in SPEC.moe_layers:
                ids = np.argsort(rng.random((6, E)) ** (1 + (np.arange(E) < 4) * 5), axis=1)[:, :K]
                data[f"{it}_{layer}"] = ids.astype(np.int32) if raw else np.bincount(ids.ravel(), minlength=E).astype(
                    np.int32)
        save_file(data, str(d / (f"rank{r}_raw.safetensors" if raw else f"rank{r}.safetensors")))


def sglang_stat_dump(path: Path, rng) -> np.ndarray:
    """An SGLang stat-mode dump at ``path``; returns its ``logical_count [4, layers, E]``."""
    import torch

    lc = skewed_counts(rng, 4, SPEC.num_layers, E)
    torch.save({"rank": 0, "logical_count": torch.from_numpy(lc), "average_utilization_rate_over_window": 0.5}, path)
    return lc


def vllm_window(rng) -> tuple[np.ndarray, np.ndarray]:
    """``(expert_load_window [12, L, E + 8], physical_to_logical_map [L, E + 8])`` over the MoE layers."""
    m = len(SPEC.moe_layers)
    p2l = np.tile(np.concatenate([np.arange(E), np.arange(8)]), (m, 1))
    window = rng.integers(0, 9, size=(12, m, E + 8)).astype(np.int32)
    return window, p2l


def recorder_folder(d: Path, rng, layers=3, rows=200) -> None:
    """zepp's recorder folder: ``layer_{i:03d}.txt`` for the first ``layers`` MoE layers."""
    d.mkdir()
    for i in range(layers):  # MoE layer ordinals, as zepp.serve's recorder writes them
        ids = np.argsort(rng.random((rows, E)), axis=1)[:, :K]
        (d / f"layer_{i:03d}.txt").write_text("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
