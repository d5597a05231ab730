"""Figures: the benchmark's bars (one panel per model, normalised to each row's fastest
baseline) and per-resource Gantt charts of simulated layers."""

from __future__ import annotations

import numpy as np

from zepp.sim.engine import Timeline

# one colour per kind of work; planning and the all-gather apart
COLORS = {"gemm": "tab:green", "dispatch": "tab:blue", "combine": "tab:orange", "copy": "tab:purple",
          "plan": "tab:gray", "allgather": "tab:pink", "barrier": "black", "reduce": "tab:olive",
          "proxy": "tab:cyan", "other": "tab:brown"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str) -> None:
    """The figure at ``path``, written whole or not at all (``zepp.outputs.replacing``)."""
    from zepp.outputs import replacing

    try:
        with replacing(path, "the figure") as tmp:
            fig.savefig(tmp, dpi=110)  # the temporary name keeps the suffix: the format
    finally:
        plt.close(fig)


def bars(rows: list[dict], systems: list[str], path: str, title: str = "") -> None:
    """One panel per model; per configuration a group of bars, each system's latency divided by
    the row's fastest baseline (1.0 = that baseline; lower is faster), Zepp's bar outlined and
    labelled with its speedup. Every row needs a latency of at least one of ``systems`` other
    than ``zepp`` (its baselines); ``ValueError`` otherwise, and for no rows."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    base_names = [s for s in systems if s != "zepp"]
    if not rows:
        raise ValueError("bars: no rows to draw")
    lacking = [i for i, r in enumerate(rows) if not any(b in r["latency_ms"] for b in base_names)]
    if lacking:
        raise ValueError(f"bars: row(s) {lacking} hold no latency of a baseline "
                         f"({', '.join(base_names) or 'none given'})")
    plt = _plt()
    fig, axes = plt.subplots(len(models), 1, figsize=(max(9.0, 0.9 * max(
        sum(r["model"] == m for r in rows) for m in models) * (len(systems) + 1) / 4), 4.2 * len(models)),
        squeeze=False)
    cmap = plt.get_cmap("tab10" if len(systems) <= 10 else "tab20")
    width = 0.8 / len(systems)
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in rows if r["model"] == model]
        x = np.arange(len(mine))
        for j, s in enumerate(systems):
            vals = []
            for r in mine:
                base = min(r["latency_ms"][b] for b in base_names if b in r["latency_ms"])
                vals.append(r["latency_ms"].get(s, np.nan) / base)
            pos = x + (j - (len(systems) - 1) / 2) * width
            is_zepp = s == "zepp"
            ax.bar(pos, vals, width, label=s, color="gold" if is_zepp else cmap(j % cmap.N),
                   edgecolor="black" if is_zepp else "none", linewidth=1.2)
            if is_zepp:
                for p, v in zip(pos, vals):
                    if np.isfinite(v) and v > 0:
                        ax.text(p, v * 1.03, f"{1 / v:.2f}x", ha="center", va="bottom", fontsize=8, rotation=90)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['nodes']} nodes\n{r['budget_mb']:g} MB" for r in mine], fontsize=9)
        ax.set_yscale("log")
        ax.set_ylabel("latency / fastest baseline", fontsize=10)
        ax.set_title(f"{model}" + (f": {title}" if title else ""), fontsize=11)
        ax.legend(fontsize=8, ncol=min(len(systems), 8), loc="upper left")
    fig.tight_layout()
    _save(plt, fig, path)


def ablation_bars(result: dict, path: str, title: str = "") -> None:
    """``zepp ablation``'s figure: per schedule a group of bars, one per arm, the mean layer time
    (ms), each labelled with its speedup over COMET."""
    plt = _plt()
    table = result["schedules"]
    scheds = list(table)
    arms = list(next(iter(table.values())))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(arms) * len(scheds)), 4.4))
    cmap = plt.get_cmap("tab10")
    width = 0.8 / len(arms)
    x = np.arange(len(scheds))
    for j, a in enumerate(arms):
        vals = [table[s][a] for s in scheds]
        pos = x + (j - (len(arms) - 1) / 2) * width
        ax.bar(pos, vals, width, label=a, color=cmap(j % cmap.N))
        for p, s, v in zip(pos, scheds, vals):
            ax.text(p, v * 1.01, f"{result['speedup_over_comet'][s][a]:.2f}x", ha="center", va="bottom", fontsize=8,
                    rotation=90)
    ax.set_xticks(x)
    ax.set_xticklabels(scheds)
    ax.set_ylabel("mean layer time over the schedule (ms)")
    ax.set_ylim(0, max(v for row in table.values() for v in row.values()) * 1.25)
    ax.set_title("ablation" + (f": {title}" if title else "") + " (labels: speedup over comet)", fontsize=11)
    ax.legend(fontsize=8, ncol=len(arms), loc="upper center")
    fig.tight_layout()
    _save(plt, fig, path)


def rank_of(resource: str) -> int:
    """The rank a resource belongs to: a GPU stream's or NIC's rank, an NVLink link's sender."""
    if resource.startswith("gpu") or resource.startswith("nic"):
        return int(resource[3:].split(".")[0])
    return int(resource[3:].split(">")[0])


def _sort_key(res: str):
    kind = 0 if res.startswith("gpu") else (1 if res.startswith("nic") else 2)
    return (rank_of(res), kind, res)


def gantt(timelines, path: str, title: str = "", ranks: list[int] | None = None, max_rows: int = 48) -> list[list[str]]:
    """Per-resource Gantt chart of one ``Timeline`` or of several ``(label, Timeline)`` drawn
    one above the other on a shared time axis (tasks of ``ranks`` only when given: their
    streams, their NIC sends and their NVLink sends; at most ``max_rows`` resources a panel).
    Every task is its own bar, so each dispatch group and combine wave shows apart (GEMM tasks
    alternate shades); one colour per kind of work; only the kinds that occur are in the
    legend. Returns the resources drawn, top to bottom, per panel."""
    plt = _plt()
    if isinstance(timelines, Timeline):
        timelines = [("", timelines)]
    panels = []
    for label, tl in timelines:
        keep = [i for i, res in enumerate(tl.resource)
                if res != "-" and tl.end[i] > tl.start[i] and (ranks is None or rank_of(res) in ranks)]
        names = sorted({tl.resource[i] for i in keep}, key=_sort_key)[:max_rows]
        panels.append((label, tl, keep, names))
    heights = [max(2.0, 0.26 * len(p[3]) + 0.8) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, sum(heights) + 0.8), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    seen = set()
    for ax, (label, tl, keep, names) in zip(axes[:, 0], panels):
        row = {n: j for j, n in enumerate(names)}
        shade: dict[str, int] = {}
        for i in keep:
            res = tl.resource[i]
            if res not in row:
                continue
            kind = tl.kind[i]
            seen.add(kind)
            alpha = 1.0
            if kind == "gemm":  # alternate shades per GEMM task on a stream: groups and waves apart
                shade[res] = shade.get(res, 0) + 1
                alpha = 1.0 if shade[res] % 2 else 0.55
            ax.barh(row[res], (tl.end[i] - tl.start[i]) * 1e3, left=tl.start[i] * 1e3, height=0.8,
                    color=COLORS.get(kind, "gray"), alpha=alpha, edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title((f"{label}: " if label else "") + f"{tl.latency * 1e3:.2f} ms", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("time (ms)")
    kinds = [k for k in COLORS if k in seen]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    fig.legend(handles, kinds, fontsize=8, ncol=len(kinds), loc="lower center")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _save(plt, fig, path)
    return [p[3] for p in panels]
