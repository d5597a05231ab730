"""One rank of ``zepp generate``: ``python -m zepp.serve.rank CONFIG.json``.

Driven by the usual torch.distributed environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``; ``LOCAL_RANK`` picks the GPU with ``device = "cuda"``). The JSON config (written
by ``zepp.cli.generate``; see ``default_config``): ``checkpoint`` folder, ``nodes``,
``gpus_per_node``, ``systems`` (registry names the runtime runs, each in turn in the same
process group), ``requests`` (token-id lists), ``max_new`` (per request), ``eos`` (ids, or null
for the config's), ``history`` (folder of ``layer_{i:03d}.txt`` traces, or null: home placement),
``record`` (folder: rank 0 writes the first system's per-layer traces and ``load.json``),
``relaxation``, ``extra`` slots, ``device``, ``backend``, ``timeout`` seconds, ``keep_logits``,
``fault`` (tests: ``{"rank", "system", "step", "mode": "die"|"hang"}``; no ``system``: every
system), ``emulate`` (informational: the ranks run in the emulated cluster), ``out`` (report JSON
written by rank 0). In the emulated cluster the ranks run ``zepp.emulate.serve_rank``, this
module's ``run_in_process`` with the NIC counters as ``probe``.

Exit codes as ``zepp.runtime.rank_process``: 0 fine; 3 a collective failed or timed out (a peer
died or hung); 4 bad input; 5 internal error.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError
from zepp.runtime.rank_process import gather_json, read_config, run_rank_process

MODULE = "zepp.serve.rank"


def default_config() -> dict:
    return dict(checkpoint=None, nodes=1, gpus_per_node=2, systems=["a2av"], requests=[], max_new=[], eos=None,
                history=None, record=None, relaxation=0.25, extra=2, device="cpu", backend="gloo", timeout=60.0,
                keep_logits=False, fault=None, out=None, dtype="float32")


def layer_demands(cfg: dict, shape: dict, world: int) -> list | None:
    """Per MoE layer the history's expected demand ``[G, E]`` (each node's histogram shared by its
    GPUs), for the routing tables of the table path; ``None`` without a history."""
    from zepp.planner.routing.table_routing import demand_per_gpu
    from zepp.traces import node_demand, read_trace

    if not cfg.get("history"):
        return None
    E, k, L = shape["experts"], shape["top_k"], cfg["gpus_per_node"]
    out = []
    for i in range(shape["layers"]):
        tr = read_trace(os.path.join(cfg["history"], f"layer_{i:03d}.txt"), num_experts=E, top_k=k)
        out.append(demand_per_gpu(node_demand(tr, cfg["nodes"], L), L)[:world])
    return out


def layer_placements(cfg: dict, system, shape: dict, world: int) -> list:
    """One placement per MoE layer: from ``cfg["history"]`` (``layer_{i:03d}.txt``) with the
    system's placement choice, else home."""
    from zepp.planner.placement import make_placement
    from zepp.traces import node_demand, read_trace

    E, k, L = shape["experts"], shape["top_k"], cfg["gpus_per_node"]
    out = []
    for i in range(shape["layers"]):
        if cfg.get("history"):
            tr = read_trace(os.path.join(cfg["history"], f"layer_{i:03d}.txt"), num_experts=E, top_k=k)
            hist = node_demand(tr, cfg["nodes"], L)
            out.append(make_placement(system.placement, hist, E, world, L, extra=cfg["extra"]))
        else:
            out.append(make_placement("home", None, E, world, L))
    return out


def write_record(folder: str, recorded: list[list[np.ndarray]], expert_load: np.ndarray, meta: dict) -> None:
    """``folder/layer_{i:03d}.txt`` (one token per line, its k ids, the ``../shared/traces`` format)
    and ``folder/load.json`` (``{"logical_count": [layers][E], ...}``, readable by
    ``zepp.traces.sampling.read_load_histogram``). Each file is replaced whole
    (``zepp.outputs``), ``load.json`` last: a run killed while writing leaves every file either
    the previous one or the new one."""
    from zepp.outputs import write_json, write_text

    os.makedirs(folder, exist_ok=True)
    for i, parts in enumerate(recorded):
        ids = np.concatenate(parts) if parts else np.zeros((0, 1), np.int32)
        write_text(os.path.join(folder, f"layer_{i:03d}.txt"),
                   "\n".join(" ".join(map(str, row)) for row in ids.tolist()) + ("\n" if len(ids) else ""), "--record")
    write_json(os.path.join(folder, "load.json"), {"logical_count": expert_load.tolist(), **meta}, "--record", None)


def _param_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


class ServedSystem:
    """System ``name``'s model on this rank: its ``ExpertParallel`` (one placement per layer), the
    expert-parallel model loaded from the checkpoint, and how long loading took (``load_s``)."""

    def __init__(self, cfg: dict, name: str, shape: dict):
        from zepp.model import MoESpec
        from zepp.registry import system as lookup
        from zepp.serve.comm import ExpertParallel
        from zepp.serve.loader import load_expert_parallel

        self.cfg, self.name = cfg, name
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.system = lookup(name)
        spec = MoESpec("served", shape["experts"], shape["top_k"], shape["hidden"], shape["ffn"], 4)
        self.device = torch.device(cfg["device"])
        self.record = bool(cfg.get("record")) and name == cfg["systems"][0]
        self.comm = ExpertParallel(self.system, layer_placements(cfg, self.system, shape, self.world), spec,
                                   cfg["relaxation"], self.device, record=self.record,
                                   demands=layer_demands(cfg, shape, self.world))
        if cfg.get("paths") == "planned":  # the table path off (zepp generate --paths planned)
            self.comm.table_ok = False
        self.placements_at_load = list(self.comm.placements)
        t_load = time.perf_counter()
        self.model = load_expert_parallel(cfg["checkpoint"], self.comm, self.rank, self.device)
        self.load_s = time.perf_counter() - t_load

    def generate(self, probe=None) -> dict:
        """Generate this rank's share of the requests; returns its JSON record (``summarize``)."""
        from zepp.serve.engine import Swapper, deal, generate_rank

        cfg, comm = self.cfg, self.comm
        reqs = cfg["requests"]
        mine = deal([len(p) for p in reqs], self.world)[self.rank]
        fault = cfg.get("fault") or {}
        my_fault = fault if fault.get("rank") == self.rank and fault.get("system", self.name) == self.name else None
        adapt = Swapper(self.model, comm) if self.system.swaps else None
        comm.dispatcher.counter.reset()
        dist.barrier()
        t0 = time.perf_counter()
        new, logits, log = generate_rank(self.model, comm, [reqs[i] for i in mine], [cfg["max_new"][i] for i in mine],
                                         eos=cfg.get("eos"), keep_logits=cfg.get("keep_logits", False), adapt=adapt,
                                         fault=my_fault, probe=probe)
        wall = time.perf_counter() - t0
        same = (np.arange(self.world) // cfg["gpus_per_node"]) == self.rank // cfg["gpus_per_node"]
        return {"mine": mine, "new": new, "logits": [x.tolist() for x in logits] if logits is not None else None,
                "seconds": log.seconds, "rows": log.rows, "all_rows": log.all_rows,
                "bytes": self._phase_bytes(log, same),
                "swapped_slots": log.swapped_slots, "swap_bytes": log.swap_bytes, "swap_seconds": log.swap_seconds,
                "swap_wait_seconds": log.swap_wait_seconds,
                "param_bytes": _param_bytes(self.model), "bytes_read": self.model.zepp_bytes_read,
                "local_experts": int(sum(int((p.slot_expert[self.rank] >= 0).sum()) for p in self.placements_at_load)),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "load_s": self.load_s,
                "wall_s": wall, "moe_s": comm.moe_seconds, "probes": log.probes,
                "paths": comm.step_paths[:len(log.seconds)], "breakdown": comm.step_breakdown[:len(log.seconds)],
                "swap_bytes_cross_node": int(adapt.sent_to[~same].sum()) if adapt is not None else 0}

    def _phase_bytes(self, log, same: np.ndarray) -> dict:
        """``{"{prefill|decode}_{phase}_{nic|nvlink}": bytes}`` this rank sent (``same [R]``: own node)."""
        counter = self.comm.dispatcher.counter
        pre = log.bytes_after_prefill or {p: np.zeros(self.world, np.int64) for p in counter.by_dst}
        nbytes = {}
        for phase, b in counter.by_dst.items():
            for part, v in (("prefill", pre[phase]), ("decode", b - pre[phase])):
                nbytes[f"{part}_{phase}_nic"] = int(v[~same].sum())
                nbytes[f"{part}_{phase}_nvlink"] = int(v[same].sum())
        return nbytes


def run_system(cfg: dict, name: str, shape: dict, probe=None) -> dict | None:
    """Load the model for system ``name``, generate, and (rank 0) return its report. ``probe``:
    see ``zepp.serve.engine.generate_rank``."""
    served = ServedSystem(cfg, name, shape)
    mine = served.generate(probe)
    device = served.device if dist.get_backend() == "nccl" else None
    everything = gather_json(mine, device)  # JSON, never pickles
    if served.rank == 0 and served.record:
        write_record(cfg["record"], served.comm.recorded, served.comm.expert_load,
                     {"experts": shape["experts"], "top_k": shape["top_k"], "layers": shape["layers"],
                      "system": name, "nodes": cfg["nodes"], "gpus_per_node": cfg["gpus_per_node"]})
    rep = summarize(cfg, name, shape, everything, served.comm.expert_load, served.model.zepp_checkpoint_bytes)
    rank = served.rank
    del served
    gc.collect()
    return rep if rank == 0 else None


def summarize(cfg: dict, name: str, shape: dict, per_rank: list[dict], expert_load: np.ndarray,
              ckpt_bytes: int) -> dict:
    """Rank 0's report of one system: outputs in input order, throughput, bytes, swaps, memory."""
    n = len(cfg["requests"])
    output_ids: list = [None] * n
    logits: list = [None] * n
    for pr in per_rank:
        for j, i in enumerate(pr["mine"]):
            output_ids[i] = pr["new"][j]
            if pr["logits"] is not None:
                logits[i] = pr["logits"][j]
    secs = np.max(np.array([pr["seconds"] for pr in per_rank]), axis=0)  # every rank runs the same steps
    rows = np.array(per_rank[0]["all_rows"])
    prompt_tokens = sum(len(p) for p in cfg["requests"])
    decode = secs[1:]
    byt = {k: sum(pr["bytes"][k] for pr in per_rank) for k in per_rank[0]["bytes"]}
    nic = {part: byt[f"{part}_dispatch_nic"] + byt[f"{part}_combine_nic"] for part in ("prefill", "decode")}
    load = expert_load.astype(np.float64)
    mm = (load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-9)).tolist()
    return {
        "system": name, "output_ids": output_ids, "logits": logits if cfg.get("keep_logits") else None,
        "steps": int(secs.size), "prefill_tokens": prompt_tokens,
        "prefill_s": float(secs[0]) if secs.size else 0.0,
        "prefill_tokens_per_s": prompt_tokens / float(secs[0]) if secs.size and secs[0] > 0 else None,
        "decode_steps": int(decode.size),
        "decode_ms_per_step": float(np.mean(decode) * 1e3) if decode.size else None,
        "decode_ms_median": float(np.median(decode) * 1e3) if decode.size else None,
        "rows_per_step": rows.tolist(),
        "nic_bytes": nic["prefill"] + nic["decode"], "nic_bytes_prefill": nic["prefill"],
        "nic_bytes_decode": nic["decode"], "bytes": byt,
        "expert_load_max_over_mean": mm,
        **_swaps(per_rank),
        "memory": {"checkpoint_bytes": int(ckpt_bytes),
                   "param_bytes_per_rank": [int(pr["param_bytes"]) for pr in per_rank],
                   "checkpoint_bytes_read_per_rank": [int(pr["bytes_read"]) for pr in per_rank],
                   "expert_copies_per_rank": [int(pr["local_experts"]) for pr in per_rank],
                   "peak_rss_bytes_per_rank": [int(pr["peak_rss_bytes"]) for pr in per_rank]},
        "load_s": max(pr["load_s"] for pr in per_rank), "wall_s": max(pr["wall_s"] for pr in per_rank),
        "moe_s_max": max(pr["moe_s"] for pr in per_rank),
        "wire_nic_tx_bytes": _wire(per_rank),
        "paths": per_rank[0].get("paths", []),
        "breakdown_ms_per_layer": _breakdown(per_rank, shape["layers"]),
    }



def _swaps(per_rank: list[dict]) -> dict:
    """The report's swap figures per step: slots swapped, weight bytes (summed over senders; across
    nodes: must be 0) and milliseconds (the slowest rank's)."""
    swaps = np.sum([pr["swapped_slots"] for pr in per_rank[:1]], axis=0) if per_rank[0]["swapped_slots"] else []
    return {
        "swaps_per_step": [int(x) for x in swaps],
        "swap_bytes_per_step": [int(sum(pr["swap_bytes"][i] for pr in per_rank))
                                for i in range(len(per_rank[0]["swap_bytes"]))],
        "swap_bytes_cross_node": int(sum(pr["swap_bytes_cross_node"] for pr in per_rank)),
        # slowest rank: planning + posting between steps; waiting for copies inside each step
        "swap_ms_per_step": [float(max(pr["swap_seconds"][i] for pr in per_rank) * 1e3)
                             for i in range(len(per_rank[0]["swap_seconds"]))],
        "swap_wait_ms_per_step": [float(max(pr["swap_wait_seconds"][i] for pr in per_rank) * 1e3)
                                  for i in range(len(per_rank[0]["swap_wait_seconds"]))],
    }

def _breakdown(per_rank: list[dict], layers: int) -> dict:
    """Per part of a MoE layer (``zepp.runtime.dispatcher.HOST_PARTS``, stages ``d<s>`` / ``c<s>``,
    ``compute`` on the table path): milliseconds per layer, the slowest rank's, for the prefill
    step and averaged over the decode steps."""
    steps = min(len(pr.get("breakdown", [])) for pr in per_rank)
    out = {}
    for part, sl in (("prefill", slice(0, 1)), ("decode", slice(1, steps))):
        idx = range(steps)[sl]
        if not idx:
            continue
        keys = sorted({k for pr in per_rank for i in idx for k in pr["breakdown"][i]})
        out[part] = {k: float(np.mean([max(pr["breakdown"][i].get(k, 0.0) for pr in per_rank) for i in idx])
                              * 1e3 / layers) for k in keys}
    return out


def _wire(per_rank: list[dict]) -> dict | None:
    """Emulated cluster: NIC tx bytes per rank from the interface counters (wire bytes: headers,
    ACKs and every collective included), prefill and decode."""
    if not per_rank[0]["probes"] or len(per_rank[0]["probes"]) < 3:
        return None
    pre = [pr["probes"][1][0] - pr["probes"][0][0] for pr in per_rank]
    dec = [pr["probes"][2][0] - pr["probes"][1][0] for pr in per_rank]
    return {"prefill": pre, "decode": dec, "total": int(sum(pre) + sum(dec))}


def run_rank(cfg: dict, probe=None) -> dict | None:
    """Every system of ``cfg`` on this rank; rank 0 returns ``{"systems": {name: report}, ...}``."""
    from transformers.utils import logging as hf_logging

    from zepp.serve.loader import moe_shape, read_config

    hf_logging.set_verbosity_error()
    world = dist.get_world_size()
    if world != cfg["nodes"] * cfg["gpus_per_node"]:
        raise ZeppInputError(f"WORLD_SIZE={world} but the config asks for {cfg['nodes']} nodes x "
                             f"{cfg['gpus_per_node']} GPUs")
    shape = moe_shape(read_config(cfg["checkpoint"]))
    reports = {}
    for name in cfg["systems"]:
        reports[name] = run_system(cfg, name, shape, probe)
    if dist.get_rank() != 0:
        return None
    return {"systems": reports, "model": {k: v for k, v in shape.items() if k != "paths"},
            "config": {k: v for k, v in cfg.items() if k not in ("requests", "out")}}


def run_in_process(cfg: dict, probe=None) -> int:
    """Join the process group named by the environment, run, write ``cfg["out"]`` on rank 0
    (``zepp.runtime.rank_process``: the same exit codes as ``zepp run``'s ranks). ``probe``: a
    reading kept at the start, after prefill and at the end of each system's generation (the
    emulated cluster's rank entry ``zepp.emulate.serve_rank`` passes its NIC counters)."""
    return run_rank_process(cfg, lambda: run_rank(cfg, probe), "zepp generate")


def main(argv: list[str] | None = None, probe=None) -> int:
    cfg = read_config(sys.argv[1:] if argv is None else argv, default_config(), MODULE)
    return 2 if cfg is None else run_in_process(cfg, probe)


if __name__ == "__main__":
    sys.exit(main())
