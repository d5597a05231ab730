"""CPU -> GPU scale of planner-like array work, measured (the GPU op mix of ``zepp.sim.planning_cost``).

    python benchmarks/fit/calibrate_planner_gpu.py cpu OUT.json   # here: numpy, one core
    python benchmarks/fit/calibrate_planner_gpu.py gpu OUT.json   # on a GPU machine: torch CUDA (+ CuPy drop-in try)
    python benchmarks/fit/calibrate_planner_gpu.py gpu-pipelined OUT.json   # the same mix queued without host syncs

``gpu-pipelined`` on an H200 wrote ``benchmarks/results/calibration_planner_gpu_pipelined.json``,
the ``gpu_opmix`` that ``benchmarks/fit/planner_cost.py`` copies into ``src/zepp/data/planner_cost.json``.

The planner (``route`` + ``build_flows``) is a sequence of whole-array passes over the batch's
entries: sorts, histograms, gathers, prefix sums, binary searches, element-wise masks. The
same op mix is timed at the entry counts of the benchmark (about 9k to 600k entries) with
numpy here and with torch on the GPU; the ratio of the summed times is the speed-up a GPU
port of the planner gets at that size. ``gpu`` times each op with a host
synchronisation after it (a planner that feeds host logic after every pass); ``gpu-pipelined``
queues ``REPEATS`` mixes back to back and synchronises once (a planner whose passes run as a
stream of kernels, as a GPU port would issue them), and separately times one host
synchronisation (a data-dependent size read back to the host, ``torch.nonzero``).
``gpu`` mode also tries to run zepp's own numpy planner unchanged on CuPy (``np`` swapped for
``cupy`` in the planner modules) on a random skewed K2 batch at 16 nodes, 16 MB.
"""

from __future__ import annotations

import argparse
import json
import time
import sys

import numpy as np

SIZES = (9_216, 37_888, 149_504, 598_016)  # K2 entries at 4 nodes 1 MB ... 16 nodes 16 MB
REPEATS = 20


def _ops_numpy(n: int, rng) -> dict:
    key = rng.integers(0, n * 8, n)
    small = rng.integers(0, 4096, n)
    idx = rng.permutation(n)
    srt = np.sort(key)
    out = {}
    ops = {
        "argsort": lambda: np.argsort(key, kind="stable"),
        "bincount": lambda: np.bincount(small, minlength=4096),
        "gather": lambda: key[idx],
        "cumsum": lambda: np.cumsum(small),
        "searchsorted": lambda: np.searchsorted(srt, key),
        "where": lambda: np.where(key > n, key, small),
    }
    for name, f in ops.items():
        best = np.inf
        for _ in range(REPEATS):
            t = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t)
        out[name] = best
    return out


def _ops_torch(n: int, rng) -> dict:
    import torch

    dev = "cuda"
    key = torch.as_tensor(rng.integers(0, n * 8, n), device=dev)
    small = torch.as_tensor(rng.integers(0, 4096, n), device=dev)
    idx = torch.as_tensor(rng.permutation(n), device=dev)
    srt = torch.sort(key).values
    ops = {
        "argsort": lambda: torch.argsort(key, stable=True),
        "bincount": lambda: torch.bincount(small, minlength=4096),
        "gather": lambda: key[idx],
        "cumsum": lambda: torch.cumsum(small, 0),
        "searchsorted": lambda: torch.searchsorted(srt, key),
        "where": lambda: torch.where(key > n, key, small),
    }
    out = {}
    for name, f in ops.items():
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        best = np.inf
        for _ in range(REPEATS):
            t = time.perf_counter()
            f()
            torch.cuda.synchronize()  # a planner pass that feeds host logic waits for its result
            best = min(best, time.perf_counter() - t)
        out[name] = best
    return out


def _ops_torch_pipelined(n: int, rng) -> dict:
    import torch

    dev = "cuda"
    key = torch.as_tensor(rng.integers(0, n * 8, n), device=dev)
    small = torch.as_tensor(rng.integers(0, 4096, n), device=dev)
    idx = torch.as_tensor(rng.permutation(n), device=dev)
    srt = torch.sort(key).values

    def mix():
        torch.argsort(key, stable=True)
        torch.bincount(small, minlength=4096)
        key[idx]
        torch.cumsum(small, 0)
        torch.searchsorted(srt, key)
        torch.where(key > n, key, small)

    for _ in range(3):
        mix()
    torch.cuda.synchronize()
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(REPEATS):
            mix()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / REPEATS)
    mask = key > n
    syncs = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        torch.nonzero(mask)
        syncs.append(time.perf_counter() - t)
    return {"mix": best, "nonzero_sync": float(np.median(syncs))}


PLANNER_CASES = ((16, 72, 384), (16, 1168, 384), (32, 296, 384), (64, 72, 384), (64, 1168, 384), (64, 2048, 128),
                 (16, 2048, 128))  # (ranks, tokens per rank, experts)


def _batch(rng, R, T, E, k=8):
    logits = rng.gumbel(size=E) * 1.5
    out = np.empty((R, T, k), np.int32)
    for r in range(R):  # per rank to bound memory
        g = logits[None, :] + rng.gumbel(size=(T, E)).astype(np.float32)
        out[r] = np.argpartition(-g, k, axis=-1)[:, :k]
    return out


def _cupy_planner() -> dict:
    """Run zepp's numpy planner on CuPy arrays (best effort), per case; numpy times beside."""
    import cupy

    import zepp.planner.flows
    import zepp.planner.types
    import zepp.planner.routing
    from zepp.planner.placement import make_placement

    rng = np.random.default_rng(0)
    cases = []
    # every numpy-planner module that holds ``np`` (the packages' submodules included, torch/ excluded)
    modules = [m for n, m in sorted(sys.modules.items())
               if n.startswith("zepp.planner.") and not n.startswith("zepp.planner.torch") and hasattr(m, "np")]
    saved = [m.np for m in modules]
    for R, T, E in PLANNER_CASES:
        topk = _batch(rng, R, T, E)
        N = R // 4
        hist = np.stack([np.bincount(topk[n * 4:(n + 1) * 4].ravel(), minlength=E) for n in range(N)])
        placement = make_placement("zepp", hist, E, R, 4)
        C = 0.5 if N >= 16 else 0.25
        case = dict(ranks=R, tokens=T, experts=E, entries=R * T * 8)
        t = time.perf_counter()
        r = zepp.planner.routing.route("zepp", topk, placement, C)
        zepp.planner.flows.build_flows(r, "zepp", 7168 * 2)
        case["numpy_s"] = time.perf_counter() - t
        try:
            for m in modules:
                m.np = cupy
            for f_ in ("slot_expert", "replicas", "replica_count"):
                object.__setattr__(placement, f_, cupy.asarray(getattr(placement, f_)))
            times = []
            for _ in range(3):
                cupy.cuda.Device().synchronize()
                t = time.perf_counter()
                r = zepp.planner.routing.route("zepp", cupy.asarray(topk), placement, C)
                zepp.planner.flows.build_flows(r, "zepp", 7168 * 2)
                cupy.cuda.Device().synchronize()
                times.append(time.perf_counter() - t)
            case["cupy_s"] = min(times)
        except Exception as e:  # report, do not fail: this is a best-effort extra
            case["cupy_error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            for m, old in zip(modules, saved):
                m.np = old
        print(case, flush=True)
        cases.append(case)
    return {"cases": cases}


def main(mode: str, path: str) -> None:
    rng = np.random.default_rng(0)
    res = {"mode": mode, "sizes": {}}
    for n in SIZES:
        res["sizes"][n] = (_ops_numpy(n, rng) if mode == "cpu" else _ops_torch_pipelined(n, rng)
                           if mode == "gpu-pipelined" else _ops_torch(n, rng))
    if mode.startswith("gpu"):
        import torch

        res["device"] = torch.cuda.get_device_name(0)
    if mode == "gpu":

        res["device"] = torch.cuda.get_device_name(0)
        try:
            res["planner"] = _cupy_planner()
        except Exception as e:
            res["planner"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("cpu", "gpu", "gpu-pipelined"))
    ap.add_argument("out", help="the JSON file to write")
    args = ap.parse_args()
    main(args.mode, args.out)
