"""Figures: grouped latency bars of a benchmark and a per-resource Gantt chart of a Timeline."""

from __future__ import annotations

import numpy as np

from zepp.simulate import Timeline

COLORS = {"gemm": "tab:green", "dispatch": "tab:blue", "combine": "tab:orange", "copy": "tab:purple",
          "plan": "tab:gray", "barrier": "black", "reduce": "tab:olive", "allgather": "tab:gray",
          "proxy": "tab:cyan", "other": "tab:brown"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(rows: list[dict], systems: list[str], path: str, title: str = "") -> None:
    """Grouped bars: one group per row (``nodes/model/MB``), one bar per system (ms, log scale)."""
    plt = _plt()
    n, m = len(rows), len(systems)
    fig, ax = plt.subplots(figsize=(min(20.0, max(8.0, 0.12 * n * (m + 1))), 5))
    width = 0.8 / m
    x = np.arange(n)
    cmap = plt.get_cmap("tab10" if m <= 10 else "tab20")
    for j, s in enumerate(systems):
        vals = [r["latency_ms"].get(s) or np.nan for r in rows]
        ax.bar(x + (j - (m - 1) / 2) * width, vals, width, label=s, color=cmap(j % cmap.N),
               edgecolor="black" if s == "zepp" else None)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['nodes']}n {r['model']}\n{r['budget_mb']:g} MB" for r in rows], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("simulated latency per MoE layer (ms)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=min(m, 6))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def gantt(tl: Timeline, path: str, title: str = "", ranks: list[int] | None = None, max_rows: int = 48) -> None:
    """Per-resource Gantt chart of ``tl`` (tasks of ``ranks`` only when given: their streams,
    their NIC sends and their NVLink sends). Pure delays (``-``) are left out."""
    plt = _plt()
    keep = []
    for i, res in enumerate(tl.resource):
        if res == "-" or tl.end[i] <= tl.start[i]:
            continue
        if ranks is not None:
            if res.startswith("gpu"):
                r = int(res[3:].split(".")[0])
            elif res.startswith("nic"):
                r = int(res[3:].split(".")[0])
            else:
                r = int(res[3:].split(">")[0])
            if r not in ranks:
                continue
        keep.append(i)

    def sort_key(res):
        kind = 0 if res.startswith("gpu") else (1 if res.startswith("nic") else 2)
        num = int("".join(ch for ch in res.split(".")[0].split(">")[0] if ch.isdigit()) or 0)
        return (num, kind, res)

    names = sorted({tl.resource[i] for i in keep}, key=sort_key)[:max_rows]
    row = {n: j for j, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, max(3, 0.28 * len(names) + 1)))
    for i in keep:
        if tl.resource[i] not in row:
            continue
        ax.barh(row[tl.resource[i]], (tl.end[i] - tl.start[i]) * 1e3, left=tl.start[i] * 1e3, height=0.8,
                color=COLORS.get(tl.kind[i], "gray"), linewidth=0)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"latency {tl.latency * 1e3:.2f} ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), fontsize=7, ncol=5, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
