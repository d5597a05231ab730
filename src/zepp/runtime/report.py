"""Rank 0's report of a ``zepp run`` case, folded from every rank's records (``zepp.runtime.case``)."""

from __future__ import annotations

import hashlib

import numpy as np


def summarize(cfg: dict, spec, T: int, per_rank: list[dict]) -> dict:
    """Per system: median over iterations of the slowest rank's layer time, bytes per link class
    summed over ranks (per iteration, measured and planned), worst error.

    ``per_rank[r]``: rank ``r``'s ``{"systems": {name: record}, "traces": {"history", "eval"}}``."""
    tol = 1e-5 if cfg["dtype"] == "float32" else 2e-2
    report = {"config": {k: v for k, v in cfg.items() if k not in ("out", "cases")}, "tokens_per_rank": T,
              "traces": per_rank[0].get("traces"),
              "model": {"name": spec.name, "experts": spec.num_experts, "topk": spec.top_k, "hidden": spec.hidden,
                        "ffn": spec.ffn}, "tolerance": tol, "systems": {}}
    for name in cfg["systems"]:
        report["systems"][name] = _system(cfg, [pr["systems"][name] for pr in per_rank], tol)
    return report


def _link_bytes(recs: list[dict]) -> dict:
    """``{"{measured|planned}_{dispatch|combine}_{nic|nvlink}": [bytes per iteration, all ranks]}``."""
    iters = len(recs[0]["bytes"])
    byt = {}
    for kind in ("measured", "planned"):
        for phase in ("dispatch", "combine"):
            for link in ("nic", "nvlink"):
                v = [sum(r["bytes"][i][kind][phase][link] for r in recs) for i in range(iters)]
                byt[f"{kind}_{phase}_{link}"] = v
    return byt


def _system(cfg: dict, recs: list[dict], tol: float) -> dict:
    """One system's entry of the report from every rank's record ``recs``."""
    times = np.max(np.array([r["times"] for r in recs]), axis=0)
    plan_t = np.max(np.array([r["plan_times"] for r in recs]), axis=0)
    err = max(r["max_rel_err"] for r in recs)
    meta = {k: sum(r["metadata_bytes"].get(k, 0) for r in recs) for k in ("nic", "nvlink")}
    out = {
        "median_layer_ms": float(np.median(times) * 1e3), "layer_ms": (times * 1e3).tolist(),
        "median_plan_ms": float(np.median(plan_t) * 1e3),
        "max_rel_err": err if cfg["check"] else None,
        "correct": (err <= tol and all(r["weights_ok"] and r.get("inputs_ok", True) for r in recs))
        if cfg["check"] else None,
        "inputs_ok": all(r.get("inputs_ok", True) for r in recs),
        # sha1 of every rank's outputs, all iterations: equal digests = bit-identical outputs
        "output_digest": hashlib.sha1("".join(r["digest"] for r in recs).encode()).hexdigest(),
        "bytes_match": all(r["bytes_ok"] for r in recs),
        "bytes_per_iter": _link_bytes(recs), "metadata_bytes_per_iter": meta,
        # swapped slots: every rank holds the whole plan's count, so rank 0's; bytes: summed over senders
        "swapped_slots": recs[0]["swapped_slots"], "swap_bytes": sum(r["swap_bytes"] for r in recs),
        # an overlap chosen per batch: (groups, waves) per timed iteration, and whether every rank chose the same
        "granularity": recs[0]["granularity"],
        "breakdown_ms": breakdown_ms([r.get("breakdown", []) for r in recs]),
        "granularity_same_on_all_ranks": all(r["granularity"] == recs[0]["granularity"] for r in recs),
    }
    if "swaps" in recs[0]:  # a swapping system: per step swaps, bytes, time (zepp.runtime.swap_steps)
        from zepp.runtime.swap_steps import fold_swaps

        out["swaps"] = dict(fold_swaps(recs), mode=cfg.get("swap_copies") or "hidden")
    return out


def breakdown_ms(per_rank: list[list[dict]]) -> dict:
    """Per part of a layer (``zepp.runtime.dispatcher.HOST_PARTS``, the stages ``d<s>`` / ``c<s>``,
    ``compute``, and ``cpu``: the rank process's CPU time in the layer call, every thread, user and
    system): the median over iterations of the slowest rank's milliseconds (a part a rank
    did not run counts 0 there)."""
    if not per_rank or not per_rank[0]:
        return {}
    keys = sorted({k for rank in per_rank for it in rank for k in it})
    iters = min(len(rank) for rank in per_rank)
    return {k: float(np.median([max(rank[i].get(k, 0.0) for rank in per_rank) for i in range(iters)]) * 1e3)
            for k in keys}
