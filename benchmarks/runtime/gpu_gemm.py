"""Grouped expert-GEMM time per rows-per-expert on a real GPU (for the simulator's cost model).

Runs one MoE expert MLP (``x @ w1 -> GELU -> @ w2``, BF16) over ``G`` local experts with the
same number of rows each, two ways: ``torch._grouped_mm`` (one grouped kernel per GEMM, where
this torch has it) and a loop of per-expert matmuls (the "unfused" way). Times are CUDA-event
medians over repeats after warm-up. Writes JSON with the time, TFLOP/s and the fraction of the
given peak per (model, rows per expert, method).

    python benchmarks/runtime/gpu_gemm.py OUT.json [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {"k2": (7168, 2048, 8), "qwen": (4096, 1536, 34)}  # hidden, ffn, local experts (E/R + 2)
ROWS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _time(fn, repeats: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def run(peak_tflops: float) -> dict:
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "peak_tflops": peak_tflops,
           "has_grouped_mm": hasattr(torch, "_grouped_mm"), "results": []}
    for model, (H, FF, G) in SHAPES.items():
        w1 = torch.randn(G, H, FF, device=dev, dtype=torch.bfloat16) / H**0.5
        w2 = torch.randn(G, FF, H, device=dev, dtype=torch.bfloat16) / FF**0.5
        for rows in ROWS:
            n = rows * G
            x = torch.randn(n, H, device=dev, dtype=torch.bfloat16)
            offs = torch.arange(1, G + 1, device=dev, dtype=torch.int32) * rows
            flops = 4.0 * n * H * FF

            def loop():
                for g in range(G):
                    xs = x[g * rows:(g + 1) * rows]
                    F.gelu(xs @ w1[g]) @ w2[g]

            methods = {"loop": loop}
            if out["has_grouped_mm"]:
                def grouped():
                    h = torch._grouped_mm(x, w1, offs=offs)
                    torch._grouped_mm(F.gelu(h), w2, offs=offs)
                try:
                    grouped()
                    torch.cuda.synchronize()
                    methods["grouped_mm"] = grouped
                except Exception as exc:  # alignment or dtype limits of this build
                    out.setdefault("grouped_mm_errors", []).append(f"{model} rows={rows}: {exc}"[:200])
            for name, fn in methods.items():
                t = _time(fn)
                out["results"].append(dict(model=model, hidden=H, ffn=FF, experts=G, rows_per_expert=rows,
                                           method=name, seconds=t, tflops=flops / t / 1e12,
                                           fraction_of_peak=flops / t / 1e12 / peak_tflops,
                                           weight_bytes=2 * G * H * FF * 2))
            del x
        del w1, w2
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    t0 = time.time()
    result = run(args.peak_tflops)
    result["wall_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for r in result["results"]:
        print(f"{r['model']:5s} rows/expert {r['rows_per_expert']:5d} {r['method']:10s} "
              f"{r['seconds'] * 1e3:8.3f} ms {r['tflops']:7.1f} TFLOP/s ({r['fraction_of_peak']:.2f} of peak)")


if __name__ == "__main__":
    main()
