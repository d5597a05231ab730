"""Check files written by ``zepp place`` with the engines' own functions, where a wheel is at hand.

SGLang and vLLM cannot be installed into zepp's environment (their dependencies), but their
Python files can be read: ``pip download --no-deps sglang vllm -d DIR`` and unzip. This script
takes those unpacked folders, lifts the pure functions that consume a placement out of their
source (``ast``, no import of the engine packages) and runs them on zepp's output:

- SGLang (``sglang/srt/eplb/expert_location.py``): ``_compute_logical_to_all_physical_map`` on the
  ``physical_to_logical_map`` of a ``--format sglang`` file (every logical expert must get a
  physical copy in every layer), plus the shape rules of ``init_by_mapping``;
- vLLM (``vllm/distributed/eplb/eplb_state.py``): ``compute_logical_maps`` on the
  ``physical_to_logical_map`` of a ``--format vllm`` ``.pt``; its ``logical_to_physical_map`` and
  ``logical_replica_count`` must equal the ones zepp wrote (zepp pads to ``redundant + 1``).

    python benchmarks/place_check_engines.py --sglang-src DIR --vllm-src DIR [--model k2 --nodes 4]
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def lift(path: Path, names: tuple[str, ...], ns: dict) -> dict:
    src = path.read_text()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(ast.get_source_segment(src, node), ns)
    missing = [n for n in names if n not in ns]
    if missing:
        raise SystemExit(f"{path}: functions {missing} not found (another engine version?)")
    return ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-src", required=True, help="folder holding sglang/srt/eplb/expert_location.py")
    ap.add_argument("--vllm-src", required=True, help="folder holding vllm/distributed/eplb/eplb_state.py")
    ap.add_argument("--model", default="k2")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--redundant", type=int, default=32)
    args = ap.parse_args()
    from zepp.model import model_preset

    spec = model_preset(args.model)
    ranks = args.nodes * 8
    tmp = Path(tempfile.mkdtemp(prefix="zepp-check-"))
    for fmt, name in (("sglang", "p.json"), ("vllm", "v.pt")):
        subprocess.run([sys.executable, "-m", "zepp.cli", "place", "--history", "synthetic", "--model", args.model,
                        "--nodes", str(args.nodes), "--gpus-per-node", "8", "--redundant", str(args.redundant),
                        "--format", fmt, "--out", str(tmp / name), "--no-report"], check=True, capture_output=True)
    ns = lift(Path(args.sglang_src) / "sglang/srt/eplb/expert_location.py",
              ("_compute_logical_to_all_physical_map", "_pad_nested_array"), {"torch": torch, "get_exec": None})
    d = json.loads((tmp / "p.json").read_text())
    assert list(d) == ["physical_to_logical_map"], "SGLang splats the dict: exactly one key"
    m = torch.tensor(d["physical_to_logical_map"])
    assert m.shape == (spec.num_layers, spec.num_experts + args.redundant) and m.shape[1] % ranks == 0
    l2p = ns["_compute_logical_to_all_physical_map"](m, num_logical_experts=spec.num_experts, ep_size=ranks,
                                                     moe_ep_rank=None)
    copies = (l2p != -1).sum(-1)
    assert copies.min() >= 1, "a logical expert without a physical copy"
    print(f"SGLang: {tuple(m.shape)} map accepted; copies per (layer, expert) {copies.min().item()}-"
          f"{copies.max().item()}")
    ns = lift(Path(args.vllm_src) / "vllm/distributed/eplb/eplb_state.py", ("compute_logical_maps",), {"torch": torch})
    v = torch.load(tmp / "v.pt")
    lp, cnt = ns["compute_logical_maps"](v["physical_to_logical_map"], spec.num_experts)
    w = v["logical_to_physical_map"]
    assert torch.equal(cnt, v["logical_replica_count"]), "replica counts differ"
    assert torch.equal(lp, w[..., :lp.shape[-1]]) and bool((w[..., lp.shape[-1]:] == -1).all()), "maps differ"
    print(f"vLLM: compute_logical_maps gives zepp's logical_to_physical_map {tuple(w.shape)} (padded from "
          f"{tuple(lp.shape)}) and logical_replica_count")
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()


if __name__ == "__main__":
    main()
