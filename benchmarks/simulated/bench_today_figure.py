"""The bar chart of ``bench_today.py``'s results: each system's layer time over SGLang + DeepEP's
per configuration, with the configuration's floor."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows)), 4.5))
    x = np.arange(len(rows))
    series = [("sglang-deepep", "tab:blue"), ("vllm-eplb", "tab:orange"), ("sglang-lp", "tab:green"),
              ("zepp-deepep", "gold")]
    series = [(n, c) for n, c in series if all(n in r["systems"] for r in rows)]
    w = 0.8 / len(series)
    for j, (name, color) in enumerate(series):
        vals = [r["systems"][name]["median_ms"] / r["systems"]["sglang-deepep"]["median_ms"] for r in rows]
        ax.bar(x + (j - (len(series) - 1) / 2) * w, vals, w, label=name, color=color,
               edgecolor="black" if name == "zepp-deepep" else "none")
    floors = [r["floor_ms"] / r["systems"]["sglang-deepep"]["median_ms"] for r in rows]
    ax.scatter(x, floors, marker="_", s=120, color="black", label="configuration floor", zorder=3)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['model'][:4]} {r['nodes']}x{r['gpus_per_node']}\n{r['tokens_per_gpu']}" for r in rows],
                       fontsize=7, rotation=90)
    ax.set_ylabel("latency / sglang-deepep")
    ax.set_title("today's clusters (h200-8, gb200-nvl72): simulated MoE layer, DeepEP's published figures")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
