"""Runtime checks on one CUDA GPU (for the lead; < 2 minutes). Writes a JSON report.

    python benchmarks/runtime/gpu_runtime_check.py OUT.json

One GPU cannot host two NCCL ranks, so the multi-rank checks are split:

1. ``local``: every rank's compiled program executed in one process on CUDA tensors
   (``zepp.runtime.reference.execute_local``: same index arrays and summation order as the
   Dispatcher), 2 nodes x 4 ranks, Qwen3-30B-A3B shapes (H 2048, FFN 768), fp32 and bf16,
   every transport, ids from the built-in synthetic Qwen traces (the recorded ones do not travel to
   a GPU machine): error against the single-GPU reference, bytes against the planner,
   wave/plain bit-identity, and the wall time of the in-process executor.
2. ``gloo_cuda``: the real Dispatcher + MoELayer in 4 local processes (2 nodes x 2 ranks), gloo
   backend, CUDA tensors, all on this GPU; collective systems first, then the overlapped
   ``zepp`` (async all-to-alls), ``zepp-swap`` and ``zepp-p2p`` (gloo send/recv take host memory:
   staged via the CPU).
3. ``nccl_1``: the real Dispatcher + MoELayer on NCCL with world size 1 (every system; all
   transfers are to itself, but the NCCL code path and CUDA indexing run for real).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch


def part_local(device: str = "cuda", small: bool = False) -> dict:
    from zepp.planner.flows import build_flows
    from zepp.planner.placement import make_placement
    from zepp.planner.types import COMBINE, DISPATCH
    from zepp.planner.routing import route
    from zepp.runtime.reference import execute_local, reference_moe
    from zepp.runtime.inputs import load_traces
    from zepp.model import model_preset
    from zepp.traces import node_demand, sample_batches

    dev = torch.device(device)
    spec = model_preset("qwen3-30b", hidden=64 if small else None, ffn=32 if small else None)  # small: CPU dry run
    nodes, L = 2, 4
    R = nodes * L
    T = spec.tokens_for_budget(1.0)
    cfg = {"model": "qwen", "seed": 0, "trace": None, "history": None}
    pool, ev = load_traces(cfg, model_preset("qwen"))  # 128 experts, top-8 ids
    hist = node_demand(pool, nodes, L)
    ids = sample_batches(ev, R, T, 1, seed=1)[0]
    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(R, T, spec.hidden, generator=g).to(dev)
    w = torch.softmax(torch.randn(R, T, spec.top_k, generator=g), dim=2).to(dev)
    out = {"shape": f"{nodes}x{L}, T={T}, H={spec.hidden}, FFN={spec.ffn}, E={spec.num_experts}, k={spec.top_k}",
           "traces": ev.source, "runs": []}
    cross = (np.arange(R)[:, None] // L) != (np.arange(R)[None, :] // L)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        cache: dict = {}
        x = x32.to(dtype)
        ref = torch.stack([reference_moe(x[r], ids[r], w[r], 0, spec.ffn, cache=cache) for r in range(R)]).float()
        for pl, rt, tr in (("home", "home", "a2av"), ("eplb", "replica-rr", "a2av"), ("home", "home", "relay"),
                           ("zepp", "zepp", "zepp"), ("zepp", "zepp", "a2av")):
            plan = build_flows(route(rt, ids, make_placement(pl, hist, spec.num_experts, R, L)), tr,
                               spec.hidden * x.element_size())
            res = {}
            for waves in (False, True):
                _sync(dev)
                t0 = time.perf_counter()
                y, sd, sc = execute_local(plan, x, w, 0, spec.ffn, waves=waves, cache=cache)
                _sync(dev)
                res[waves] = (y, time.perf_counter() - t0, sd, sc)
            y, secs, sd, sc = res[False]
            err = ((y.float() - ref).norm() / ref.norm()).item()
            bytes_ok = all(
                np.array_equal((s * cross).sum(1), plan.stats(ph).nic_send)
                and np.array_equal(s * ~cross, plan.stats(ph).nvlink)
                for s, ph in ((sd, DISPATCH), (sc, COMBINE)))
            out["runs"].append({
                "dtype": str(dtype), "system": f"{pl}+{rt}+{tr}", "rel_err": err, "tol": tol, "ok": err <= tol,
                "bytes_ok": bool(bytes_ok), "waves_bit_identical": bool(torch.equal(res[False][0], res[True][0])),
                "executor_s": secs, "nic_MB": float(plan.stats().nic_send.sum() / 2**20),
            })
            print(out["runs"][-1], flush=True)
    return out


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def part_spawn(systems: list[str], nodes: int, L: int, device: str, backend: str, **over) -> dict:
    from zepp.errors import RankFailure
    from zepp.launch.ranks import spawn_local
    from zepp.runtime.worker import default_config

    cfg = default_config()
    cfg.update(nodes=nodes, gpus_per_node=L, model="qwen", hidden=512, ffn=256, tokens=256, systems=systems, iters=3,
               warmup=1, check=True, device=device, backend=backend, timeout=60, interleave=True, relaxation=0.1)
    cfg.update(over)
    t0 = time.time()
    try:
        rep = spawn_local("zepp.runtime.worker", cfg, grace=20)
    except RankFailure as exc:
        return {"systems": systems, "ok": False, "error": str(exc)[-3000:], "wall_s": time.time() - t0}
    res = {n: {k: s[k] for k in ("correct", "max_rel_err", "bytes_match", "inputs_ok", "median_layer_ms",
                                 "swapped_slots")}
           for n, s in rep["systems"].items()}
    ok = all(s["correct"] and s["bytes_match"] for s in rep["systems"].values())
    return {"systems": res, "ok": ok, "wall_s": time.time() - t0}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python benchmarks/runtime/gpu_runtime_check.py OUT.json")
    report = {"cuda": torch.cuda.is_available(), "torch": torch.__version__}
    if not torch.cuda.is_available():
        Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
        sys.exit("no CUDA device")
    report["device"] = torch.cuda.get_device_name(0)
    t0 = time.time()
    overlap = ["zepp", "zepp-swap", "zepp-p2p"]
    every = ["a2av", "eplb", "relay", "zepp", "zepp-sync", "zepp-a2av", "zepp-swap", "zepp-p2p"]
    for name, fn in (
        ("local", part_local),
        ("gloo_cuda_collective", lambda: part_spawn(["a2av", "eplb", "relay", "zepp-sync", "zepp-a2av"], 2, 2,
                                                   "cuda:0", "gloo")),
        ("gloo_cuda_overlap", lambda: part_spawn(overlap, 2, 2, "cuda:0", "gloo", model="olmoe", experts=16, topk=4,
                                                tokens=24)),
        ("nccl_1", lambda: part_spawn(every, 1, 1, "cuda", "nccl")),
    ):
        t = time.time()
        try:
            report[name] = fn()
        except Exception as exc:  # report and carry on with the other parts
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        report[name]["seconds"] = time.time() - t
        print(name, json.dumps(report[name])[:1500], flush=True)
        Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
    report["total_s"] = time.time() - t0
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
