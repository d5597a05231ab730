"""Issue 21's generate run: ``zepp generate --system a2av,eplb,relay,zepp --emulate --json``, repeated.

    python benchmarks/emulated/generate_bench.py [--reps 3] [--out benchmarks/results/generate_bench]

A random Qwen3-MoE (hidden 1024, 32 experts of FFN 64, top-8, 4 layers; ``zepp.serve.tiny``),
2 nodes x 2 ranks on the emulated cluster at 500 Mbit/s, 16 requests of 96-160 random tokens
(4 per rank), 8 new tokens each, no history (home placements). Each repetition is one
``zepp generate`` run (its systems one after another); the 1-minute load average is recorded
before each. Per repetition: prefill tokens/s and decode ms per step per system; Zepp = the best
of its variants; ratios against a2av, relay and the fastest other system. Writes
``<out>.json`` (every run's report) and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS  # noqa: E402

SYSTEMS = "a2av,eplb,relay,zepp"


def prepare(work: str) -> tuple[str, str]:
    from zepp.serve.tiny import make_checkpoint

    ckpt = os.path.join(work, "qwen3_h1024_e32")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        make_checkpoint(ckpt, "qwen3_moe", hidden=1024, ffn=64, experts=32, top_k=8, layers=4, vocab=128)
    rng = np.random.default_rng(21)
    reqs = [rng.integers(0, 128, int(n)).tolist() for n in rng.integers(96, 161, 16)]
    ids = os.path.join(work, "input_ids.json")
    with open(ids, "w") as f:
        json.dump({"input_ids": reqs}, f)
    return ckpt, ids


def run_once(ckpt: str, ids: str, out: str, prefix: str, rate: float) -> dict:
    cmd = [sys.executable, "-m", "zepp.cli", "generate", "--checkpoint", ckpt, "--nodes", "2", "--gpus-per-node", "2",
           "--system", SYSTEMS, "--input-ids", ids, "--max-new-tokens", "8", "--emulate", "--rate-mbit", str(rate),
           "--json", out, "--timeout", "300", "--emulate-prefix", prefix]
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)


def ratios(rep: dict) -> dict:
    s = rep["systems"]
    zepp = [n for n in s if n.startswith("zepp")]
    others = [n for n in s if n not in zepp]
    zp = max(zepp, key=lambda n: s[n]["prefill_tokens_per_s"])
    zd = min(zepp, key=lambda n: s[n]["decode_ms_per_step"])
    fast_d = min(others, key=lambda n: s[n]["decode_ms_per_step"])
    return {"zepp_prefill": zp, "zepp_decode": zd,
            "prefill_vs_a2av": s[zp]["prefill_tokens_per_s"] / s["a2av"]["prefill_tokens_per_s"],
            "prefill_vs_relay": s[zp]["prefill_tokens_per_s"] / s["relay"]["prefill_tokens_per_s"],
            "decode_vs_fastest_other": s[fast_d]["decode_ms_per_step"] / s[zd]["decode_ms_per_step"],
            "fastest_other_decode": fast_d}


def markdown(runs: list[dict]) -> str:
    from zepp.runtime.dispatcher import HOST_PARTS

    out = ["# zepp generate on the emulated cluster (benchmarks/emulated/generate_bench.py)", "",
           "2x2 ranks, NICs 500 Mbit/s; random Qwen3-MoE (hidden 1024, 32 experts of FFN 64, top-8, 4 layers), "
           "16 requests of 96-160 tokens (4 per rank), 8 new tokens, home placements (no history). "
           "One `zepp generate --system a2av,eplb,relay,zepp --emulate --json` run per repetition.", ""]
    for i, r in enumerate(runs):
        rep, q = r["report"], r["ratios"]
        s = rep["systems"]
        out += [f"## repetition {i + 1} (load average {r['loadavg']:.1f})", "",
                "| system | prefill tok/s | decode ms/step | NIC MB | paths (steps) | host ms per MoE layer, prefill / decode |",
                "| --- | --- | --- | --- | --- | --- |"]
        for n, x in s.items():
            b = x.get("breakdown_ms_per_layer") or {}
            host = [sum(b[p].get(k, 0.0) for k in HOST_PARTS) for p in ("prefill", "decode") if p in b]
            paths = ", ".join(f"{p} x{x['paths'].count(p)}" for p in sorted(set(x.get("paths", []))))
            out.append(f"| {n} | {x['prefill_tokens_per_s']:.0f} | {x['decode_ms_per_step']:.1f} | "
                       f"{x['nic_bytes'] / 2**20:.2f} | {paths} | {' / '.join(f'{h:.1f}' for h in host)} |")
        out += ["", f"Zepp (best variant) prefill {q['prefill_vs_a2av']:.2f}x a2av ({q['zepp_prefill']}), "
                    f"{q['prefill_vs_relay']:.2f}x relay; decode: the fastest other ({q['fastest_other_decode']}) "
                    f"takes {q['decode_vs_fastest_other']:.2f}x Zepp's best ({q['zepp_decode']}) time "
                    "(>= 1.00: Zepp no slower)", ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate-mbit", type=float, default=500.0)
    ap.add_argument("--work", default="/tmp/zepp-generate-bench")
    ap.add_argument("--prefix", default="zgb", help="emulated cluster name prefix (apart from other users')")
    ap.add_argument("--out", default=str(RESULTS / "generate_bench"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    ckpt, ids = prepare(a.work)
    runs = []
    for i in range(a.reps):
        load = os.getloadavg()[0]
        t0 = time.time()
        rep = run_once(ckpt, ids, os.path.join(a.work, f"rep{i}.json"), a.prefix, a.rate_mbit)
        runs.append({"report": rep, "ratios": ratios(rep), "loadavg": load, "wall_s": time.time() - t0})
        with open(a.out + ".json", "w") as f:
            json.dump({"args": vars(a), "runs": runs}, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(markdown(runs) + "\n")
        print(json.dumps(runs[-1]["ratios"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
