"""Serving benchmark: a MoE checkpoint generating on the emulated cluster, per system.

    python benchmarks/emulated/serve_bench.py --shapes 2x2,4x2 --rate-mbit 500 --out benchmarks/results/serve_bench.json

1. Model (made once, cached in ``--work``): DeepSeek-V3 architecture (the one transformers MoE
   with a per-expert selection bias, ``e_score_correction_bias``), ``--hidden`` 1024, 128 experts,
   top-8 (the shape of the recorded ``qwen3`` traces), ``--layers`` MoE layers, tiny MLA attention,
   one small shared expert, random init.
2. Realistic skew: random routers are nearly uniform. For each layer the selection bias is fitted
   (multiplicative updates on captured router inputs, a few passes through the model so later
   layers see the biased earlier ones) until the model's expert popularity on *history* prompts
   matches the real Qwen3 trace's (``qwen3/pool.txt`` of ``--traces``, found by
   ``benchmarks/paths.py``) popularity, with a different expert permutation
   per layer. The router's own computation is unchanged: the bias is a checkpoint tensor the
   architecture already has. The model's selections on the history prompts are written as the
   per-layer history (``layer_{i:03d}.txt``), which plans EPLB's and Zepp's placements.
3. Evaluation prompts are other random prompts. Per cluster shape, one emulated cluster, one
   process group; every rank loads every system's model once (a2av, eplb, relay and Zepp's
   variants), then for each batch size and repetition the systems run one after another in a
   rotating order (interleaved): prefill (``--prefill`` tokens per rank: 4 requests of equal
   length, one step) and decode (``--decode`` requests per rank, ``--decode-steps`` steps).
   Times are the slowest rank's; tokens/s counts every rank's prompt tokens.

Reported: prefill tokens/s and decode ms/step per system and batch, NIC payload bytes, expert
max/mean load of the evaluation run beside the real traces', per-rank memory, and per MoE layer
the host parts (``zepp.runtime.dispatcher.HOST_PARTS``) with the metadata exchange split into the
wait for the last rank to enter it (skew between ranks sharing the cores) and the exchange after. Rank mode
(internal): ``python benchmarks/emulated/serve_bench.py --rank CONFIG``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paths helper
from paths import RESULTS, add_traces_option, find_traces  # noqa: E402

from zepp.runtime.dispatcher import HOST_PARTS  # noqa: E402


# ----------------------------------------------------------------------------- model and skew
def make_model(folder: str, hidden: int, ffn: int, layers: int, seed: int = 0) -> None:
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=256, hidden_size=hidden, intermediate_size=2 * ffn, moe_intermediate_size=ffn,
                           num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                           n_routed_experts=128, num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
                           first_k_dense_replace=0, q_lora_rank=64, kv_lora_rank=64, qk_rope_head_dim=16,
                           qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=1.0, norm_topk_prob=True,
                           max_position_embeddings=1024, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                           tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            g = layer.mlp.gate
            g.weight.normal_(0.0, 1.0 / hidden ** 0.5)
    model.save_pretrained(folder)


@torch.no_grad()
def fit_skew(folder: str, qwen3: str, prompts: list[list[int]], passes: int = 3, iters: int = 300,
             seed: int = 0) -> dict:
    """Fit each layer's selection bias to the real popularity (``qwen3``: the recorded Qwen3 traces'
    folder); write the history traces."""
    from transformers import AutoModelForCausalLM

    pool = np.loadtxt(os.path.join(qwen3, "pool.txt"), dtype=np.int64)
    target = np.bincount(pool.ravel(), minlength=128).astype(np.float64)
    target /= target.sum()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gates = [layer.mlp.gate for layer in model.model.layers]
    rng = np.random.default_rng(seed)
    targets = [target[rng.permutation(128)] for _ in gates]
    captured: list[list[torch.Tensor]] = [[] for _ in gates]
    hooks = [g.register_forward_pre_hook(lambda m, a, i=i: captured[i].append(a[0].reshape(-1, a[0].shape[-1])))
             for i, g in enumerate(gates)]
    ids = torch.as_tensor(prompts)
    k = gates[0].top_k
    for _ in range(passes):
        for c in captured:
            c.clear()
        model(input_ids=ids)
        for i, g in enumerate(gates):
            x = torch.cat(captured[i])
            scores = torch.sigmoid(x @ g.weight.T)
            b = g.e_score_correction_bias
            for _ in range(iters):
                sel = torch.topk(scores + b, k, dim=-1)[1]
                obs = np.bincount(sel.reshape(-1).numpy(), minlength=128) / sel.numel()
                b += torch.as_tensor(0.02 * (np.log(targets[i] + 1e-6) - np.log(obs + 1e-4)), dtype=torch.float32)
    for c in captured:
        c.clear()
    model(input_ids=ids)
    hist = os.path.join(folder, "history")
    os.makedirs(hist, exist_ok=True)
    stats = []
    for i, g in enumerate(gates):
        x = torch.cat(captured[i])
        _, _, sel = g(x)
        sel = sel.numpy()
        with open(os.path.join(hist, f"layer_{i:03d}.txt"), "w") as f:
            f.write("\n".join(" ".join(map(str, r)) for r in sel.tolist()) + "\n")
        c = np.bincount(sel.ravel(), minlength=128)
        stats.append({"history_max_over_mean": float(c.max() / c.mean()),
                      "target_max_over_mean": float(targets[i].max() / targets[i].mean())})
    for h in hooks:
        h.remove()
    model.save_pretrained(folder)
    return {"layers": stats}


# ----------------------------------------------------------------------------- rank
def rank_main(path: str) -> int:
    from zepp.runtime.rank_process import init_distributed, is_comm_error as _is_comm_error, leave_group

    with open(path) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    try:
        init_distributed(cfg)
        out = bench_rank(cfg)
        if out is not None:
            with open(cfg["out"], "w") as f:
                json.dump(out, f)
        leave_group()  # in order: no subgroup outlives the process group
        return 0
    except Exception as exc:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return 3 if _is_comm_error(exc) else 5


def bench_rank(cfg: dict) -> dict | None:
    import resource

    import torch.distributed as dist
    from transformers.utils import logging as hf_logging

    from zepp.model import MoESpec
    from zepp.registry import system as lookup
    from zepp.serve.comm import ExpertParallel
    from zepp.serve.engine import generate_rank
    from zepp.serve.loader import load_expert_parallel, moe_shape, read_config
    from zepp.serve.rank import _param_bytes, layer_demands, layer_placements

    hf_logging.set_verbosity_error()
    rank, world = dist.get_rank(), dist.get_world_size()
    L = cfg["gpus_per_node"]
    same = (np.arange(world) // L) == rank // L
    shape = moe_shape(read_config(cfg["checkpoint"]))
    spec = MoESpec("bench", shape["experts"], shape["top_k"], shape["hidden"], shape["ffn"], 4)
    loaded = {}
    for name in cfg["systems"]:
        sysd = lookup(name)
        comm = ExpertParallel(sysd, layer_placements(cfg, sysd, shape, world), spec, cfg["relaxation"], "cpu",
                              demands=layer_demands(cfg, shape, world))
        comm.table_ok = comm.table_ok and cfg.get("table_path", True)
        loaded[name] = (load_expert_parallel(cfg["checkpoint"], comm, rank, "cpu"), comm)
    mem = {"param_bytes": {n: _param_bytes(m) for n, (m, _) in loaded.items()},
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "checkpoint_bytes": loaded[cfg["systems"][0]][0].zepp_checkpoint_bytes}
    rows = []
    rng = np.random.default_rng([cfg["seed"], rank])
    vocab = int(read_config(cfg["checkpoint"]).vocab_size)
    for phase, sizes in (("prefill", cfg["prefill"]), ("decode", cfg["decode"])):
        for bs in sizes:
            if phase == "prefill":
                prompts = [rng.integers(0, vocab, bs // 4).tolist() for _ in range(4)]
                max_new = [1] * 4
            else:
                prompts = [rng.integers(0, vocab, 4).tolist() for _ in range(bs)]
                max_new = [1 + cfg["decode_steps"]] * bs
            for rep in range(cfg["reps"]):
                names = cfg["systems"][rep % len(cfg["systems"]):] + cfg["systems"][:rep % len(cfg["systems"])]
                for name in names:
                    model, comm = loaded[name]
                    comm.dispatcher.counter.reset()
                    comm.dispatcher.metadata_log.clear()
                    dist.barrier()
                    _, _, log = generate_rank(model, comm, prompts, max_new, eos=set())
                    secs = log.seconds[:1] if phase == "prefill" else log.seconds[1:]
                    t = torch.tensor([float(np.sum(secs))], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    b = comm.dispatcher.counter.by_dst
                    nic = torch.tensor([int(b["dispatch"][~same].sum() + b["combine"][~same].sum())],
                                       dtype=torch.int64)
                    dist.all_reduce(nic)
                    part = slice(0, 1) if phase == "prefill" else slice(1, len(log.seconds))
                    n = len(log.seconds)  # begin_step also ran once more, for the step that found everyone done
                    paths = sorted(set(comm.step_paths[-n - 1:-1][part]))
                    brk = _breakdown(comm.step_breakdown[-n - 1:-1][part], shape["layers"])
                    brk.update(_metadata_wait(comm.dispatcher, comm.step_paths[-n - 1:-1], part, shape["layers"]))
                    rows.append({"phase": phase, "batch": bs, "rep": rep, "system": name, "seconds": float(t),
                                 "steps": len(secs), "nic_bytes": int(nic), "paths": paths, "breakdown_ms": brk,
                                 "loadavg": os.getloadavg()[0]})
    loads = {n: c.expert_load.tolist() for n, (_, c) in loaded.items()}
    allmem = [None] * world
    dist.all_gather_object(allmem, mem)
    if rank:
        return None
    return {"rows": rows, "expert_load": loads, "memory": allmem}


BREAKDOWN = (*HOST_PARTS, "stages", "compute", "moe")


def _breakdown(steps: list[dict], layers: int) -> dict:
    """Per layer, mean over ``steps``, slowest rank (an all-reduce MAX): the host parts
    (``zepp.runtime.dispatcher.HOST_PARTS``), the stages (``d<s>`` / ``c<s>`` summed; the blocking
    calls, and the table path's two) and the table path's expert compute, in ms."""
    import torch.distributed as dist

    v = torch.zeros(len(BREAKDOWN), dtype=torch.float64)
    for st in steps:
        for k, sec in st.items():
            key = "stages" if k[0] in "dc" and k[1:2].isdigit() else k
            if key in BREAKDOWN:
                v[BREAKDOWN.index(key)] += sec
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return {k: float(x) * 1e3 / max(len(steps), 1) / layers for k, x in zip(BREAKDOWN, v.tolist())}


def _metadata_wait(d, paths: list[str], part: slice, layers: int) -> dict:
    """Of the metadata all-gather, per layer (ms, mean over the part's steps, slowest rank): the
    time a rank waited for the last rank to enter it (``metadata_wait``: skew between the ranks,
    e.g. 8 ranks sharing 2 cores, not host work of the planned path) and the time from that last
    entry to its end (``metadata_after``: the exchange itself). Wall-clock stamps of
    ``Dispatcher.metadata_log`` (one clock: the ranks share the machine); each planned step makes
    ``layers`` calls, in order."""
    from zepp.runtime.rank_process import gather_json

    logs = gather_json([list(c) for c in d.metadata_log])
    n = min(len(g) for g in logs)
    stamps = np.array([g[:n] for g in logs], np.float64).reshape(len(logs), n, 2)  # [R, calls, (in, out)]
    last = stamps[:, :, 0].max(axis=0)
    step = np.repeat([i for i, p in enumerate(paths) if p == "planned"], layers)[:n]
    steps = range(len(paths))[part]
    sel = np.isin(step, list(steps))
    wait = (last[None, :] - stamps[:, :, 0])[:, sel].sum(axis=1).max(initial=0.0)
    after = (stamps[:, :, 1] - last[None, :])[:, sel].sum(axis=1).max(initial=0.0)
    scale = 1e3 / max(len(steps), 1) / layers
    return {"metadata_wait": float(wait) * scale, "metadata_after": float(after) * scale}


# ----------------------------------------------------------------------------- driver
def run_shape(cfg: dict, nodes: int, gpus: int, rate: float, work: str, prefix: str = "zsb") -> dict:
    from zepp.emulate.topology import EmulatedCluster

    cfg = dict(cfg, nodes=nodes, gpus_per_node=gpus, out=os.path.join(work, f"out_{nodes}x{gpus}.json"))
    path = os.path.join(work, f"cfg_{nodes}x{gpus}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    with EmulatedCluster(nodes, gpus, rate_mbit=rate, prefix=prefix) as cl:
        import tempfile

        logs = tempfile.mkdtemp(prefix=f"logs_{nodes}x{gpus}_", dir=work)  # fresh: the rendezvous store lives here
        with cl.spawn([sys.executable, os.path.abspath(__file__), "--rank", path],
                      env={"OMP_NUM_THREADS": "1", "ZEPP_THREADS": "1"}, logdir=logs) as g:
            res = g.wait(timeout=cfg["limit_s"], grace=float(cfg["timeout"]) + 15)
        if not res.ok:
            raise res.failure()
    with open(cfg["out"]) as f:
        return json.load(f)


def summarize(out: dict, systems: list[str]) -> dict:
    res: dict = {}
    for r in out["rows"]:
        key = (r["phase"], r["batch"], r["system"])
        res.setdefault(key, []).append(r)
    table = {}
    for (phase, bs, name), rs in res.items():
        sec = float(np.median([r["seconds"] for r in rs]))
        steps = rs[0]["steps"]
        table.setdefault(phase, {}).setdefault(str(bs), {})[name] = {
            "median_s": sec, "nic_bytes": rs[0]["nic_bytes"],
            "value": (bs * out["world"] / sec) if phase == "prefill" else (sec / max(steps, 1) * 1e3),
            "paths": sorted({p for r in rs for p in r.get("paths", [])}),
            "breakdown_ms": {k: float(np.median([r["breakdown_ms"][k] for r in rs])) for k in rs[0].get("breakdown_ms", {})},
            "loadavg": [r.get("loadavg") for r in rs]}
    load = {n: [float(np.max(l) / np.mean(l)) for l in np.asarray(v, np.float64)] for n, v in out["expert_load"].items()}
    return {"table": table, "expert_max_over_mean": load}


def _ratios(row: dict, systems: list[str], phase: str) -> list[str]:
    """Zepp's best variant over a2av, relay and the fastest other system (higher = Zepp faster)."""
    z = [row[n]["value"] for n in systems if n.startswith("zepp")]
    if not z:
        return ["-"] * 3
    best = max(z) if phase == "prefill" else min(z)
    others = [n for n in systems if not n.startswith("zepp")]
    fastest = (max if phase == "prefill" else min)(row[n]["value"] for n in others) if others else None
    out = []
    for ref in (row.get("a2av", {}).get("value"), row.get("relay", {}).get("value"), fastest):
        out.append("-" if ref is None else f"{(best / ref if phase == 'prefill' else ref / best):.2f}x")
    return out


def _breakdown_table(t: dict, systems: list[str]) -> list[str]:
    """Per layer (ms, slowest rank, median over repetitions) at the largest prefill and the
    smallest decode batch: host parts, stages, and host work's share of the layer."""
    out = []
    for phase, pick in (("prefill", max), ("decode", min)):
        bs = str(pick(int(b) for b in t[phase]))
        row = t[phase][bs]
        out += [f"per-layer breakdown, {phase} batch {bs} (ms per layer; host = metadata + plan + hops + compile + pack; "
                "of the metadata all-gather, the wait for the last rank to enter it and the exchange after; "
                "host less wait = host without that wait)", "",
                "| system | path | metadata | (wait) | (after) | plan | hops | compile | pack | stages | MoE layer "
                "| host share of the MoE layer | host less wait |", "|" + " --- |" * 13]
        for n in systems:
            b = row[n].get("breakdown_ms") or {}
            if not b:
                continue
            host = sum(b.get(k, 0.0) for k in HOST_PARTS)
            lean = host - b.get("metadata", 0.0) + b.get("metadata_after", b.get("metadata", 0.0))
            tot = b.get("moe", 0.0)
            out.append(f"| {n} | {', '.join(row[n]['paths'])} | " + " | ".join(
                f"{b.get(k, 0.0):.1f}" for k in ("metadata", "metadata_wait", "metadata_after", *HOST_PARTS[1:],
                                                 "stages", "moe")) +
                (f" | {host / tot:.0%} | {lean / tot:.0%} |" if tot else " | - | - |"))
        out.append("")
    loads = [x for ph in t.values() for row in ph.values() for c in row.values() for x in c.get("loadavg", [])
             if x is not None]
    if loads:
        out += [f"Load average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f}", ""]
    return out


def markdown(report: dict) -> str:
    """The results note: per shape, prefill tokens/s and decode ms/step per system and batch."""
    a = report["args"]
    out = ["# Serving benchmark (benchmarks/emulated/serve_bench.py)", "",
           f"Emulated cluster, NICs {a['rate_mbit']:g} Mbit/s; DeepSeek-V3-shaped model, hidden {a['hidden']}, "
           f"128 experts (FFN {a['ffn']}), top-8, {a['layers']} MoE layers, fp32 rows on the wire; median of "
           f"{a['reps']} interleaved repetitions; times are the slowest rank's.", "",
           "Expert max/mean load, real Qwen3 traces: " + ", ".join(
               f"{k} {v:.2f}" for k, v in report["real_trace_max_over_mean"].items()) +
           "; fitted model on the history prompts, per layer: " + ", ".join(
               f"{x['history_max_over_mean']:.2f}" for x in report["skew_fit"]["layers"]), ""]
    for shape, sh in report["shapes"].items():
        t = sh["summary"]["table"]
        systems = list(next(iter(t["prefill"].values())).keys())
        out += [f"## {shape} ranks ({sh['wall_s']:.0f} s)", ""]
        for phase, unit in (("prefill", "tokens/s (all ranks)"), ("decode", "ms per step")):
            head = (f"| {phase} batch per rank | " + " | ".join(systems) +
                    " | zepp best / a2av | / relay | / fastest other | Zepp's paths |")
            out += [f"{phase}: {unit}", "", head, "|" + " --- |" * (len(systems) + 5)]
            for bs, row in t[phase].items():
                out.append(f"| {bs} | " + " | ".join(f"{row[n]['value']:.1f}" for n in systems) + " | "
                           + " | ".join(_ratios(row, systems, phase)) + " | " +
                           ", ".join(sorted({p for n in systems if n.startswith("zepp") for p in row[n]["paths"]}))
                           + " |")
            out.append("")
        out += _breakdown_table(t, systems)
        big = t["prefill"][max(t["prefill"], key=int)]
        out.append("NIC payload bytes, largest prefill batch: " + ", ".join(
            f"{n} {big[n]['nic_bytes'] / 2**20:.1f} MB" for n in systems))
        mm = sh["summary"]["expert_max_over_mean"]
        out.append("Expert max/mean load of the evaluation runs (a2av), per layer: " + ", ".join(
            f"{x:.2f}" for x in mm.get("a2av", [])))
        mem = sh["raw"]["memory"]
        ck = mem[0]["checkpoint_bytes"]
        out.append("Memory per rank (a2av's model): parameters " + ", ".join(
            f"{m['param_bytes']['a2av'] / 2**20:.0f}" for m in mem) + f" MB vs whole model {ck / 2**20:.0f} MB; "
            "peak RSS (all systems' models loaded) " + ", ".join(f"{m['peak_rss_bytes'] / 2**20:.0f}" for m in mem) +
            " MB")
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default="2x2,4x2")
    ap.add_argument("--rate-mbit", type=float, default=500.0)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--systems", default="a2av,eplb,relay,sglang,zepp-a2av,zepp-overlap,zepp-direct")
    ap.add_argument("--no-table-path", action="store_true", help="Zepp's variants always take the planned path")
    ap.add_argument("--prefill", default="32,96,256", help="prompt tokens per rank")
    ap.add_argument("--decode", default="4,16,64", help="requests per rank")
    ap.add_argument("--decode-steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--work", default="/tmp/zepp-serve-bench")
    ap.add_argument("--out", default=str(RESULTS / "serve_bench.json"))
    ap.add_argument("--limit-s", type=float, default=3000.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait")
    ap.add_argument("--prefix", default="zsb", help="emulated cluster name prefix (apart from other users')")
    add_traces_option(ap)
    a = ap.parse_args()
    if a.rank:
        return rank_main(a.rank)
    qwen3 = str(find_traces(a.traces) / "qwen3")
    os.makedirs(a.work, exist_ok=True)
    ckpt = os.path.join(a.work, f"model_h{a.hidden}_f{a.ffn}_l{a.layers}")
    t0 = time.time()
    if not os.path.exists(os.path.join(ckpt, "history", f"layer_{a.layers - 1:03d}.txt")):
        make_model(ckpt, a.hidden, a.ffn, a.layers)
        rng = np.random.default_rng(123)
        skew = fit_skew(ckpt, qwen3, rng.integers(0, 256, (16, 64)).tolist())
        with open(os.path.join(ckpt, "skew.json"), "w") as f:
            json.dump(skew, f)
    with open(os.path.join(ckpt, "skew.json")) as f:
        skew = json.load(f)
    print(f"model ready in {time.time() - t0:.0f} s: {skew}", flush=True)
    pool = np.loadtxt(os.path.join(qwen3, "pool.txt"), dtype=np.int64)
    ev = np.loadtxt(os.path.join(qwen3, "eval.txt"), dtype=np.int64)
    real = {w: float(np.bincount(x.ravel(), minlength=128).max() / np.bincount(x.ravel(), minlength=128).mean())
            for w, x in (("pool", pool), ("eval", ev))}
    systems = a.systems.split(",")
    cfg = dict(checkpoint=ckpt, history=os.path.join(ckpt, "history"), systems=systems, relaxation=0.25, extra=2,
               prefill=[int(x) for x in a.prefill.split(",")], decode=[int(x) for x in a.decode.split(",")],
               decode_steps=a.decode_steps, reps=a.reps, seed=7, timeout=a.timeout, backend="gloo", device="cpu",
               limit_s=a.limit_s, table_path=not a.no_table_path)
    report = {"args": vars(a), "skew_fit": skew, "real_trace_max_over_mean": real, "shapes": {}}
    for shape in a.shapes.split(","):
        n, l = (int(x) for x in shape.split("x"))
        t1 = time.time()
        out = run_shape(cfg, n, l, a.rate_mbit, a.work, a.prefix)
        out["world"] = n * l
        report["shapes"][shape] = {"summary": summarize(out, systems), "raw": out, "wall_s": time.time() - t1}
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
        print(shape, json.dumps(report["shapes"][shape]["summary"]["table"]), flush=True)
        with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
            f.write(markdown(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
