"""DeepEP's normal kernels in the simulator against DeepEP's published internode figures.

    python benchmarks/simulated/deepep_normal_rate.py   # writes benchmarks/results/deepep_normal_rate.md

DeepEP's benchmark (``tests/test_internode.py`` of deepseek-ai/DeepEP): 4096 tokens per GPU,
hidden 7168, 256 experts, top-8 among the experts of the ``min(nodes, 4)`` nodes with the highest
expert score, expert ``e`` on rank ``e // (E / R)``, FP8 dispatch and BF16 combine. Its "RDMA
bandwidth" counts every (token, destination node) pair, the token's own node included, times
the row, over the kernel's time. Published (H800, CX7 400 Gb/s, DeepEP's README): dispatch
43 / 58 / 51 GB/s at EP 16 / 32 / 64 (TODAY.md). The simulator runs ``sglang-deepep-normal``'s
mechanics and transports over that layout on ``h200-8`` (DeepEP's published network figures,
``zepp.sim.mechanics.DEEPEP_NET``; GEMMs made almost free), with and without the chunked
pipelining (``zepp.sim.chunks``). Nothing here is fitted: the figures are what the model gives.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS  # noqa: E402
from zepp import registry  # noqa: E402
from zepp.model import model_preset  # noqa: E402
from zepp.sim.calibrate import calibrated  # noqa: E402
from zepp.sim.mechanics import DEEPEP_FP8, MECHANICS  # noqa: E402
from zepp.sim.run import Config, Shared, simulate_plan  # noqa: E402

PUBLISHED = {2: 43e9, 4: 58e9, 8: 51e9}  # dispatch, EP 16 / 32 / 64 (TODAY.md)
# combine, EP 16 / 32 / 64: DeepEP's README table beside the dispatch figures (an earlier revision
# of that README gave 43 / 44 / 46 dispatch and 43 / 47 / 45 combine)
PUBLISHED_COMBINE = {2: 43e9, 4: 57e9, 8: 50e9}


def benchmark_config(nodes: int, tokens: int = 4096, seed: int = 0) -> Config:
    cl, net = calibrated("h200-8", nodes, gpus_per_node=8)
    cl = cl.with_(peak_flops=1e21, hbm_bw=1e21)
    spec = model_preset("deepseek-v3")
    R, E, k = cl.ranks, spec.num_experts, spec.top_k
    rng = np.random.default_rng(seed)
    scores = np.abs(rng.standard_normal((R * tokens, E), dtype=np.float32)) + 1
    groups = min(nodes, 4)
    top_nodes = np.argpartition(-scores.reshape(R * tokens, nodes, -1).max(-1), groups - 1, axis=1)[:, :groups]
    keep = np.zeros((R * tokens, nodes), bool)
    np.put_along_axis(keep, top_nodes, True, 1)
    ids = np.argpartition(-np.where(np.repeat(keep, E // nodes, 1), scores, 0), k - 1, axis=1)[:, :k]
    return Config(cl, spec, net, np.ones((nodes, E)), ids.astype(np.int32).reshape(1, R, tokens, k), warmup=0)


def rates(nodes: int, chunked: bool) -> dict:
    """Dispatch and combine rates (DeepEP's count and NIC bytes only), bytes/s per rank."""
    cfg = benchmark_config(nodes)
    s = replace(registry.system("sglang-deepep-normal"), placement="home", routing="home")
    mech = replace(MECHANICS[s.mechanics], chunked=chunked)
    tl = simulate_plan(cfg, s, Shared().plan(s, cfg, 0), keep=True, mech=mech)[0]
    kind, res = np.array(tl.kind), np.array(tl.resource).astype(str)
    d, c = kind == "dispatch", kind == "combine"
    g2 = np.array([lab == "gemm2" for lab in tl.label])
    t_d = tl.end[d].max() - tl.start[d].min()
    t_c = tl.end[c].max() - tl.end[g2].max()
    node = cfg.batches[0].reshape(-1, cfg.spec.top_k) // (cfg.spec.num_experts // nodes)
    seen = np.zeros((node.shape[0], nodes), bool)
    np.put_along_axis(seen, node, True, 1)
    R, H = cfg.cluster.ranks, cfg.spec.hidden
    pairs = seen.sum() / R
    nic = np.char.startswith(res, "nic")
    return dict(dispatch=pairs * H * DEEPEP_FP8 / t_d, combine=pairs * H * cfg.spec.dtype_bytes / t_c,
                dispatch_nic=tl.bytes[d & nic].sum() / R / t_d, combine_nic=tl.bytes[c & nic].sum() / R / t_c,
                dispatch_ms=t_d * 1e3, combine_ms=t_c * 1e3)


def main() -> None:
    argparse.ArgumentParser(description="DeepEP's normal kernels, simulated vs published; writes "
                            "benchmarks/results/deepep_normal_rate.md").parse_args()
    lines = ["# DeepEP normal kernels: simulated vs published RDMA bandwidth", "",
             "Written by `python benchmarks/simulated/deepep_normal_rate.py` (see its docstring for the setting). GB/s per "
             "rank; `DeepEP count`: (token, node) pairs incl. the token's own node x row bytes / kernel time, as "
             "DeepEP's benchmark counts; `NIC`: bytes the rank's NIC sent (dispatch) or received (combine). "
             "Published: DeepEP README, H800 + CX7 400 Gb/s.", "",
             "| EP | chunked | dispatch ms | dispatch GB/s (DeepEP count) | published | dispatch NIC GB/s | "
             "combine ms | combine GB/s (DeepEP count) | published | combine NIC GB/s | CPU s |",
             "| --- " * 11 + "|"]
    for nodes in (2, 4, 8):
        for chunked in (True, False):
            t0 = time.process_time()
            r = rates(nodes, chunked)
            cpu = time.process_time() - t0
            lines.append(f"| {8 * nodes} | {'yes' if chunked else 'no'} | {r['dispatch_ms']:.3f} | "
                         f"{r['dispatch'] / 1e9:.1f} | {PUBLISHED[nodes] / 1e9:.0f} | {r['dispatch_nic'] / 1e9:.1f} | "
                         f"{r['combine_ms']:.3f} | {r['combine'] / 1e9:.1f} | {PUBLISHED_COMBINE[nodes] / 1e9:.0f} | "
                         f"{r['combine_nic'] / 1e9:.1f} | {cpu:.1f} |")
            print(lines[-1], flush=True)
    lines += ["", f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."]
    (RESULTS / "deepep_normal_rate.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'deepep_normal_rate.md'}")


if __name__ == "__main__":
    main()
