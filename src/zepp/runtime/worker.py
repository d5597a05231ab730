"""One rank of ``zepp run``: ``python -m zepp.runtime.worker CONFIG.json``.

Driven by the usual torch.distributed environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` (and, for gloo over a chosen interface, ``GLOO_SOCKET_IFNAME``, which gloo reads
itself). ``LOCAL_RANK`` picks the CUDA device when the config asks for ``cuda``. The emulated
cluster (``zepp.emulate``) starts this module inside network namespaces the same way.

The JSON config (all keys written by ``zepp.cli.run``; see ``default_config``):
``nodes``, ``gpus_per_node``, ``model`` + ``experts``/``topk``/``hidden``/``ffn`` overrides,
``tokens`` per rank (or ``budget_mb``), ``systems`` (names from ``zepp.runtime.systems``),
``history``/``trace`` (paths, or null for the built-in traces), ``iters``, ``warmup``, ``seed``,
``relaxation``, ``extra`` slots, ``check``, ``dtype`` (``float32``/``bfloat16``), ``device``
(``cpu``, ``cuda`` = GPU ``LOCAL_RANK``, ``cuda:N``), ``backend`` (``gloo``/``nccl``),
``timeout`` seconds, ``out`` (result JSON written by rank 0), ``interleave`` (run the systems
iteration by iteration, so they share the machine's load alike; default: when every system's
weights fit in 2 GiB per rank), ``fault`` (tests: ``{"rank", "system", "iter", "mode":
"die"|"hang"}``), ``cases`` (tests: a list of overrides; each case runs in turn in the same
process group and the report holds ``cases``).

Example, one rank of four (run the same with RANK=0..3)::

    RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=veth0 \\
        python -m zepp.runtime.worker config.json

Exit codes: 0 fine; 3 a collective failed or timed out (a peer died or hung); 4 bad input;
5 internal error (a bug: traceback printed).

Rendezvous: with ``ZEPP_STORE_FILE`` set (every zepp launcher sets it), the ranks meet through
a ``torch.distributed.FileStore`` at that path and nothing listens for the rendezvous;
otherwise the usual ``env://`` (``MASTER_ADDR``/``MASTER_PORT``, e.g. under torchrun). Results
travel to rank 0 as JSON bytes in tensors (``gather_json``), never as pickles.

Hooks: ``run_in_process(cfg, hooks)`` / ``run_case(cfg, hooks)`` take a ``RunHooks`` object
whose methods the worker calls at fixed points (layer created, right before each layer call,
right before the closing exchange of results); ``zepp.emulate.rankrun`` reads interface
counters there. The default hooks do nothing.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

from zepp.errors import ZeppInputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class RunHooks:
    """Callbacks of ``run_case`` (subclass and override; the defaults do nothing).

    ``on_layer_created(index, system)``: layer ``index`` (creation order, one per system) exists.
    ``on_layer_call(index, system, it)``: right before layer ``index`` runs iteration ``it``
    (after the barrier that starts the iteration and after any swap of weights).
    ``before_final_gather()``: every layer call is done; the results exchange comes next.
    """

    def on_layer_created(self, index: int, system: str) -> None:
        pass

    def on_layer_call(self, index: int, system: str, it: int) -> None:
        pass

    def before_final_gather(self) -> None:
        pass


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON-serialisable: {type(v).__name__}")


def gather_json(obj, device=None) -> list:
    """Every rank's ``obj`` (JSON-serialisable), in rank order, on every rank: the JSON text is
    exchanged as uint8 tensors (sizes first, then padded bytes), so nothing is unpickled."""
    device = torch.device("cpu") if device is None else torch.device(device)
    data = json.dumps(obj, default=_jsonable, separators=(",", ":")).encode()
    world = dist.get_world_size()
    n = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(x.item()) for x in sizes]
    buf = torch.zeros(max(sizes), dtype=torch.uint8)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(outs, buf.to(device))
    return [json.loads(bytes(o[:k].cpu().numpy())) for o, k in zip(outs, sizes)]


def default_config() -> dict:
    return dict(nodes=2, gpus_per_node=2, model="k2", experts=None, topk=None, hidden=None, ffn=None, tokens=None,
                budget_mb=1.0, systems=["a2av", "zepp"], history=None, trace=None, iters=3, warmup=1, seed=0,
                relaxation=0.25, extra=2, check=True, dtype="float32", device="cpu", backend="gloo", timeout=60.0,
                out=None, fault=None, interleave=None, cost_cluster=None)


def cost_figures(cfg: dict):
    """``zepp.planner.granularity.Figures`` of ``cfg["cost_cluster"]`` (a dict of ``zepp.cluster.Cluster``
    fields plus an optional ``overlap``, ``Figures.overlap``; the same in every rank's config), or
    ``None`` (the Dispatcher's default)."""
    if not cfg.get("cost_cluster"):
        return None
    from zepp.cluster import Cluster
    from zepp.planner.granularity import Figures

    fields = dict(cfg["cost_cluster"])
    overlap = float(fields.pop("overlap", 1.0))
    return Figures.of(Cluster(**fields), overlap=overlap)


def load_traces(cfg: dict, spec):
    """``(history, eval)`` Traces: files when given, else the built-in synthetic traces of the
    model, else (models without them, or overridden expert count / top-k) a seeded Zipf trace."""
    from zepp.traces import Trace, read_trace

    if cfg.get("trace"):
        ev = read_trace(cfg["trace"], num_experts=spec.num_experts, top_k=spec.top_k)
        hist = read_trace(cfg["history"], num_experts=spec.num_experts, top_k=spec.top_k) if cfg.get("history") else ev
        return hist, ev
    if cfg.get("history"):
        raise ZeppInputError("--history needs --trace too (the evaluation batches are drawn from --trace)")
    from zepp.model import model_preset

    base = model_preset(cfg["model"])
    if (base.num_experts, base.top_k) == (spec.num_experts, spec.top_k):  # else they would not fit: skip them
        try:
            from zepp.traces.synthetic import synthetic_traces

            pool, ev = synthetic_traces(cfg["model"], seed=cfg["seed"])
            if pool.num_experts == spec.num_experts and pool.top_k == spec.top_k:
                return pool, ev
        except ZeppInputError:
            pass
    rng = np.random.default_rng([cfg["seed"], 7])
    pop = 1.0 / np.arange(1, spec.num_experts + 1) ** 0.8
    pop = pop[rng.permutation(spec.num_experts)]
    out = []
    for window in ("pool", "eval"):
        g = np.log(pop)[None, :] + rng.gumbel(size=(8192, spec.num_experts))
        out.append(Trace(np.argsort(-g, axis=1)[:, : spec.top_k].astype(np.int32), spec.num_experts,
                         f"zipf(0.8, seed={cfg['seed']})/{window}"))
    return out[0], out[1]


def gate_weights(seed: int, it: int, rank: int, T: int, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + it * 104729 + rank)
    return torch.softmax(torch.randn(T, k, generator=g), dim=1)


def activations(seed: int, it: int, rank: int, T: int, H: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 15485863 + it * 32452843 + rank + 1)
    return torch.randn(T, H, generator=g)


def run_worker(cfg: dict, hooks: RunHooks | None = None) -> dict | None:
    """Run ``cfg`` (or each of ``cfg["cases"]``) on this rank; rank 0 returns the report."""
    if not cfg.get("cases"):
        return run_case(cfg, hooks)
    reports = [run_case({**cfg, **case, "cases": None}, hooks) for case in cfg["cases"]]
    return {"cases": reports} if reports[0] is not None else None


def run_case(cfg: dict, hooks: RunHooks | None = None) -> dict | None:
    """Run every system of ``cfg`` on this rank; rank 0 returns the report. ``hooks``: see
    ``RunHooks``."""
    from zepp.model import model_preset
    from zepp.planner.placement import make_placement
    from zepp.planner.types import link_stats
    from zepp.runtime.dispatcher import Dispatcher
    from zepp.runtime.moe import MoELayer
    from zepp.runtime.reference import reference_moe
    from zepp.runtime.systems import SYSTEMS
    from zepp.traces import node_demand, sample_batches

    rank, world = dist.get_rank(), dist.get_world_size()
    L, N = cfg["gpus_per_node"], cfg["nodes"]
    if world != L * N:
        raise ZeppInputError(f"WORLD_SIZE={world} but the config asks for {N} nodes x {L} GPUs")
    spec = model_preset(cfg["model"], experts=cfg.get("experts"), topk=cfg.get("topk"), hidden=cfg.get("hidden"),
                        ffn=cfg.get("ffn"))
    dtype = DTYPES[cfg["dtype"]]
    device = torch.device(cfg["device"])
    T = cfg.get("tokens") or spec.tokens_for_budget(cfg["budget_mb"])
    if cfg.get("interleave") is None:
        slots = spec.num_experts // world + cfg["extra"]
        per_system = slots * 2 * spec.hidden * spec.ffn * torch.empty(0, dtype=dtype).element_size()
        cfg = {**cfg, "interleave": per_system * len(cfg["systems"]) <= 2 * 2**30}
    hist_trace, eval_trace = load_traces(cfg, spec)
    hist = node_demand(hist_trace, N, L)
    iters, warmup = cfg["iters"], cfg["warmup"]
    batches = sample_batches(eval_trace, world, T, iters + warmup, cfg["seed"])  # [I, R, T, k]
    fault = cfg.get("fault") or {}
    same = (np.arange(world) // L) == rank // L
    row_d = spec.hidden * torch.empty(0, dtype=dtype).element_size()
    results, layers, refs = {}, {}, {}
    hooks = hooks or RunHooks()
    index: dict[str, int] = {}  # system -> creation index of its layer (one layer per system)

    def make(name):
        sysd = SYSTEMS[name]
        placement = make_placement(sysd.placement, hist, spec.num_experts, world, L, extra=cfg["extra"])
        d = Dispatcher.for_system(spec, placement, sysd, relaxation=cfg["relaxation"], gpus_per_node=L,
                                  device=device, figures=cost_figures(cfg))
        results[name] = {"times": [], "plan_times": [], "max_rel_err": 0.0, "bytes_ok": True, "bytes": [],
                         "swapped_slots": 0, "swap_bytes": 0, "metadata_bytes": {}, "weights_ok": True,
                         "granularity": []}
        layer = MoELayer(d, seed=cfg["seed"], dtype=dtype)
        index[name] = len(index)
        hooks.on_layer_created(index[name], name)
        return layer

    def inputs(it):
        x = activations(cfg["seed"], it, rank, T, spec.hidden).to(device, dtype)
        w = gate_weights(cfg["seed"], it, rank, T, spec.top_k).to(device)
        return batches[it, rank], x, w

    def one(name, layer, it):
        sysd, rec, d = SYSTEMS[name], results[name], layer.dispatcher
        ids_np, x, w = inputs(it)
        ids = torch.as_tensor(ids_np, dtype=torch.int64, device=device)
        if fault.get("rank") == rank and fault.get("system") == name and fault.get("iter") == it:
            layer.on_dispatched = (lambda: os._exit(17)) if fault.get("mode", "die") == "die" else (
                lambda: time.sleep(3600))
        d.counter.reset()
        dist.barrier()
        t0 = time.perf_counter()
        if sysd.swaps and d.last_plan is not None:  # swap planning + weight copies are inside the window
            from zepp.planner.swaps import plan_swaps

            sp = plan_swaps(d.placement, d.last_plan.routing.slot_loads(), cfg["relaxation"])
            if sp.num_swapped_slots:
                rec["swap_bytes"] += layer.apply_swaps(sp)
                rec["swapped_slots"] += sp.num_swapped_slots
        hooks.on_layer_call(index[name], name, it)
        y = layer(x, ids, w)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        plan = d.last_plan
        out_bytes = y.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        rec.setdefault("digest", hashlib.sha1()).update(out_bytes)
        # measured bytes of this rank against the planner's, per phase, per destination rank
        row_c = spec.hidden * torch.empty(0, dtype=d.combine_dtype or dtype).element_size()
        measured, planned = {}, {}
        for phase, hops, row in (("dispatch", plan.dispatch, row_d), ("combine", plan.combine, row_c)):
            st = link_stats(hops, world, L, row, plan.routing.rows_per_rank())
            b = d.counter.by_dst[phase]
            measured[phase] = {"nic": int(b[~same].sum()), "nvlink": int(b[same].sum())}
            planned[phase] = {"nic": int(st.nic_send[rank]), "nvlink": int(st.nvlink[rank].sum())}
            if not (measured[phase]["nic"] == planned[phase]["nic"]
                    and np.array_equal(b[same], st.nvlink[rank][same])):
                rec["bytes_ok"] = False
        rec["metadata_bytes"] = d.counter.split("metadata", rank, L)
        g = d.last_granularity
        if it >= warmup:
            rec["granularity"].append(None if g is None else [g.groups, g.waves])
            rec["times"].append(elapsed)
            rec["plan_times"].append(d.timing.get("metadata", 0.0) + d.timing.get("plan", 0.0))
            rec["bytes"].append({"measured": measured, "planned": planned})
        if cfg["check"]:
            rec["inputs_ok"] = rec.get("inputs_ok", True) and _check_inputs(layer.last_handle, cfg, it, spec)
            if it not in refs:
                refs[it] = reference_moe(x, ids_np, w, cfg["seed"], spec.ffn).float()
            ref = refs[it]
            err = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            rec["max_rel_err"] = max(rec["max_rel_err"], err)

    def done(name, layer):
        results[name]["digest"] = results[name]["digest"].hexdigest()
        if SYSTEMS[name].swaps and cfg["check"]:
            results[name]["weights_ok"] = layer.check_weights()

    if cfg.get("interleave"):  # iteration-major: every system sees the same machine load
        layers = {name: make(name) for name in cfg["systems"]}
        for it in range(iters + warmup):
            for name in cfg["systems"]:
                one(name, layers[name], it)
        for name in cfg["systems"]:
            done(name, layers[name])
    else:  # system-major: one system's weights in memory at a time
        for name in cfg["systems"]:
            layer = make(name)
            for it in range(iters + warmup):
                one(name, layer, it)
            done(name, layer)
            del layer
    results["_traces"] = {"history": hist_trace.source, "eval": eval_trace.source}
    hooks.before_final_gather()
    everything = gather_json(results, device if cfg.get("backend") == "nccl" else None)
    if rank != 0:
        return None
    return summarize(cfg, spec, T, everything)


def _check_inputs(h, cfg: dict, it: int, spec) -> bool:
    """The expert inputs are exactly the owners' token rows, grouped by slot with ``counts``."""
    p = h.prog
    if int(p.counts.sum()) != p.n_entries or np.any(np.diff(p.e_slot) < 0):
        return False
    if not np.array_equal(np.bincount(p.e_slot, minlength=p.slots), p.counts):
        return False
    rows = h.inputs.rows.cpu()
    for owner in np.unique(p.e_owner).tolist():
        m = np.flatnonzero(p.e_owner == owner)
        xo = activations(cfg["seed"], it, owner, p.tokens, spec.hidden).to(rows.dtype)
        if not torch.equal(rows[torch.as_tensor(m)], xo[torch.as_tensor(p.e_token[m])]):
            return False
    return True


def summarize(cfg: dict, spec, T: int, per_rank: list[dict]) -> dict:
    """Rank 0: per system, median over iterations of the slowest rank's layer time, bytes per link
    class summed over ranks (per iteration, measured and planned), worst error."""
    tol = 1e-5 if cfg["dtype"] == "float32" else 2e-2
    report = {"config": {k: v for k, v in cfg.items() if k not in ("out", "cases")}, "tokens_per_rank": T,
              "traces": per_rank[0].get("_traces"),
              "model": {"name": spec.name, "experts": spec.num_experts, "topk": spec.top_k, "hidden": spec.hidden,
                        "ffn": spec.ffn}, "tolerance": tol, "systems": {}}
    for name in cfg["systems"]:
        recs = [pr[name] for pr in per_rank]
        times = np.max(np.array([r["times"] for r in recs]), axis=0)
        plan_t = np.max(np.array([r["plan_times"] for r in recs]), axis=0)
        iters = len(recs[0]["bytes"])
        byt = {}
        for kind in ("measured", "planned"):
            for phase in ("dispatch", "combine"):
                for link in ("nic", "nvlink"):
                    v = [sum(r["bytes"][i][kind][phase][link] for r in recs) for i in range(iters)]
                    byt[f"{kind}_{phase}_{link}"] = v
        err = max(r["max_rel_err"] for r in recs)
        meta = {k: sum(r["metadata_bytes"].get(k, 0) for r in recs) for k in ("nic", "nvlink")}
        report["systems"][name] = {
            "median_layer_ms": float(np.median(times) * 1e3), "layer_ms": (times * 1e3).tolist(),
            "median_plan_ms": float(np.median(plan_t) * 1e3),
            "max_rel_err": err if cfg["check"] else None,
            "correct": (err <= tol and all(r["weights_ok"] and r.get("inputs_ok", True) for r in recs))
            if cfg["check"] else None,
            "inputs_ok": all(r.get("inputs_ok", True) for r in recs),
            # sha1 of every rank's outputs, all iterations: equal digests = bit-identical outputs
            "output_digest": hashlib.sha1("".join(r["digest"] for r in recs).encode()).hexdigest(),
            "bytes_match": all(r["bytes_ok"] for r in recs),
            "bytes_per_iter": byt, "metadata_bytes_per_iter": meta,
            "swapped_slots": sum(r["swapped_slots"] for r in recs), "swap_bytes": sum(r["swap_bytes"] for r in recs),
            # zepp-auto: (groups, waves) per timed iteration, and whether every rank chose the same
            "granularity": recs[0]["granularity"],
            "granularity_same_on_all_ranks": all(r["granularity"] == recs[0]["granularity"] for r in recs),
        }
    return report


def init_group(backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Join the process group the environment names: through the file store at
    ``ZEPP_STORE_FILE`` when set (nothing listens for the rendezvous), else ``env://``."""
    timeout = datetime.timedelta(seconds=float(timeout_s))
    path = os.environ.get("ZEPP_STORE_FILE")
    if not path:
        dist.init_process_group(backend, timeout=timeout)
        return
    world = int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(path, world)
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]), world_size=world, timeout=timeout)


def init_distributed(cfg: dict) -> None:
    backend = cfg.get("backend") or "gloo"
    dev = cfg.get("device", "cpu")
    if dev.startswith("cuda"):
        # "cuda": one GPU per rank (LOCAL_RANK); "cuda:N": that GPU (several gloo ranks may share one)
        idx = int(dev.split(":")[1]) if ":" in dev else int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(idx)
        cfg["device"] = f"cuda:{idx}"
    init_group(backend, float(cfg["timeout"]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m zepp.runtime.worker CONFIG.json  (env RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
              file=sys.stderr)
        return 2
    cfg = default_config()
    with open(argv[0]) as f:
        cfg.update(json.load(f))
    return run_in_process(cfg)


def run_in_process(cfg: dict, hooks: RunHooks | None = None) -> int:
    """Join the process group named by the environment, run (with ``hooks``), write
    ``cfg["out"]`` on rank 0."""
    return run_rank_process(cfg, lambda: run_worker(cfg, hooks), "zepp worker", indent=1)


def run_rank_process(cfg: dict, body, label: str, indent: int | None = None) -> int:
    """The life of one rank process (``zepp run`` and ``zepp generate``): join the process
    group named by the environment, run ``body()`` (rank 0 returns the report, written to
    ``cfg["out"]``), leave the group. Exit codes: 0 fine; 3 a collective failed or timed out (a
    peer died or hung); 4 bad input; 5 internal error (traceback printed). ``label`` starts every
    message."""
    torch.set_num_threads(int(os.environ.get("ZEPP_THREADS", "1")))
    rank = int(os.environ.get("RANK", "0"))
    try:
        init_distributed(cfg)
        report = body()
        if report is not None and cfg.get("out"):
            tmp = cfg["out"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(report, f, indent=indent)
            os.replace(tmp, cfg["out"])
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except ZeppInputError as exc:
        print(f"{label} rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        os._exit(4)
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        if not _is_comm_error(exc):
            print(f"{label} rank {rank}: internal error ({type(exc).__name__}: {msg})", file=sys.stderr, flush=True)
            traceback.print_exc()
            os._exit(5)
        # a peer died or hung: gloo/NCCL raise; end this rank now, clearly
        print(f"{label} rank {rank}: communication failed ({type(exc).__name__}: {msg}); a peer rank died, "
              f"hung or timed out (timeout {cfg.get('timeout')} s). Ending this rank.", file=sys.stderr, flush=True)
        if os.environ.get("ZEPP_DEBUG"):
            traceback.print_exc()
        os._exit(3)


def _is_comm_error(exc: Exception) -> bool:
    if isinstance(exc, (dist.DistError, ConnectionError, TimeoutError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        w in text for w in ("gloo", "nccl", "timed out", "timeout", "connection", "closed", "peer", "socket"))


if __name__ == "__main__":
    sys.exit(main())
