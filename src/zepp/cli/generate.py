"""``zepp generate``: serve a Hugging Face MoE checkpoint expert-parallel and generate.

On one machine it starts the ranks itself (gloo on loopback); under ``torchrun`` (``RANK`` and
``WORLD_SIZE`` set) it runs as that rank (rank 0 prints and writes the report); ``--emulate``
runs the ranks in the emulated cluster (network namespaces, NICs shaped to ``--rate-mbit``).
Every option is checked before any rank starts::

    zepp generate --checkpoint ckpt/ --nodes 2 --gpus-per-node 2 --system zepp-overlap \\
        --input-ids prompts.json --max-new-tokens 32 --json out.json --check

``--input-ids FILE``: JSON ``{"input_ids": [[...], ...]}`` (optionally ``"max_new_tokens": [...]``
per request, capped at ``--max-new-tokens``). ``--json`` writes
``output_ids`` (new tokens only, one list per request, in input order), ``system``,
``prefill_tokens_per_s``, ``decode_ms_per_step``, ``nic_bytes`` and more (``systems`` holds one
such report per system when ``--system`` names several).
"""

from __future__ import annotations

import json
import os
import tempfile

import click

from zepp.errors import ZeppInputError


def read_requests(path: str, vocab: int, max_new: int) -> tuple[list[list[int]], list[int]]:
    """``(requests, max_new per request)`` from an ``--input-ids`` file; one clear error otherwise."""
    if not os.path.isfile(path):
        raise ZeppInputError(f"--input-ids {path!r} does not exist")
    try:
        with open(path) as f:
            obj = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ZeppInputError(f"--input-ids {path!r}: not valid JSON ({exc})") from None
    reqs = obj.get("input_ids") if isinstance(obj, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise ZeppInputError(f"--input-ids {path!r}: expected {{\"input_ids\": [[token ids], ...]}} with at least one "
                             f"request")
    for i, r in enumerate(reqs):
        if not isinstance(r, list) or not r:
            raise ZeppInputError(f"--input-ids {path!r}: request {i} is not a non-empty list of token ids")
        bad = [t for t in r if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ZeppInputError(f"--input-ids {path!r}: request {i} holds {bad[0]!r}, not a token id in [0, {vocab})")
    per = obj.get("max_new_tokens")
    if per is None:
        per = [max_new] * len(reqs)
    elif not isinstance(per, list) or len(per) != len(reqs) or any(
            isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in per):
        raise ZeppInputError(f"--input-ids {path!r}: max_new_tokens must be a list of {len(reqs)} positive integers")
    return reqs, [min(int(m), max_new) for m in per]


def validate(o: dict) -> dict:
    """Check every option; returns the ``zepp.serve.rank`` config (nothing started yet)."""
    from zepp.registry import parse_systems
    from zepp.serve.checkpoint import check_folder
    from zepp.serve.loader import moe_shape, read_config

    for opt in ("nodes", "gpus_per_node", "max_new_tokens", "threads"):
        if o[opt] < 1:
            raise ZeppInputError(f"--{opt.replace('_', '-')} must be at least 1, got {o[opt]}")
    if o["timeout"] <= 0:
        raise ZeppInputError(f"--timeout must be positive, got {o['timeout']}")
    if not 0 <= o["relaxation"] < 10:
        raise ZeppInputError(f"--relaxation must be in [0, 10), got {o['relaxation']}")
    if o["extra"] < 0:
        raise ZeppInputError(f"--extra must be >= 0, got {o['extra']}")
    if o["emulate"]:
        from zepp.emulate.ownership import check_prefix

        check_prefix(o.get("emulate_prefix", "zgen"))
    if o["rate_mbit"] is not None and not o["emulate"]:
        raise ZeppInputError("--rate-mbit shapes the emulated cluster's NICs; add --emulate")
    dev = o["device"]
    if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ZeppInputError(f"--device must be cpu, cuda or cuda:N, got {dev!r}")
    if dev != "cpu":
        import torch

        if o["emulate"]:
            raise ZeppInputError("--emulate runs gloo ranks on the CPU; drop --device")
        if not torch.cuda.is_available():
            raise ZeppInputError(f"--device {dev}: no CUDA device is available")
    systems = parse_systems(o["system"], "runtime", option="--system", expand=True)
    check_folder(o["checkpoint"])
    config = read_config(o["checkpoint"])
    shape = moe_shape(config)
    world = o["nodes"] * o["gpus_per_node"]
    if shape["experts"] % world:
        raise ZeppInputError(f"the model's {shape['experts']} experts do not divide over {world} ranks; change "
                             f"--nodes or --gpus-per-node")
    reqs, per = read_requests(o["input_ids"], int(config.vocab_size), o["max_new_tokens"])
    if o["history"]:
        for i in range(shape["layers"]):
            p = os.path.join(o["history"], f"layer_{i:03d}.txt")
            if not os.path.isfile(p):
                raise ZeppInputError(f"--history {o['history']!r}: no {os.path.basename(p)} (one trace per MoE layer, "
                                     f"{shape['layers']} layers; write them with --record)")
    if o["record"]:
        parent = os.path.dirname(os.path.abspath(o["record"]))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise ZeppInputError(f"--record {o['record']!r}: cannot create it in {parent!r}")
    if o["json_path"]:
        parent = os.path.dirname(os.path.abspath(o["json_path"]))
        if not os.path.isdir(parent):
            raise ZeppInputError(f"--json {o['json_path']!r}: folder {parent!r} does not exist")
    return dict(checkpoint=os.path.abspath(o["checkpoint"]), nodes=o["nodes"], gpus_per_node=o["gpus_per_node"],
                systems=systems, requests=reqs, max_new=per, eos=None,
                history=os.path.abspath(o["history"]) if o["history"] else None,
                record=os.path.abspath(o["record"]) if o["record"] else None, relaxation=o["relaxation"],
                extra=o["extra"], device=dev, backend="nccl" if dev.startswith("cuda") else "gloo",
                timeout=o["timeout"], keep_logits=False, fault=json.loads(o["fault"]) if o["fault"] else None,
                emulate=o["emulate"])


def format_report(rep: dict) -> str:
    m = rep["model"]
    head = (f"{m['layers']} MoE layers, E={m['experts']}, k={m['top_k']}, H={m['hidden']}, FFN={m['ffn']}; "
            f"{rep['config']['nodes']} nodes x {rep['config']['gpus_per_node']} ranks")
    cols = f"{'system':<13} {'match':>6} {'prefill tok/s':>13} {'decode ms/step':>14} {'NIC MB':>8} {'swaps':>6}"
    lines = [head, cols, "-" * len(cols)]
    for name, s in rep["systems"].items():
        ok = {True: "yes", False: "NO", None: "-"}[s.get("matches_reference")]
        tps = f"{s['prefill_tokens_per_s']:.0f}" if s["prefill_tokens_per_s"] else "-"
        dms = f"{s['decode_ms_per_step']:.1f}" if s["decode_ms_per_step"] is not None else "-"
        lines.append(f"{name:<13} {ok:>6} {tps:>13} {dms:>14} {s['nic_bytes'] / 2**20:>8.2f} "
                     f"{sum(s['swaps_per_step']):>6}")
    return "\n".join(lines)


def check_against_reference(cfg: dict, rep: dict) -> bool:
    """``--check``: plain transformers generate in this process; marks each system's report."""
    from zepp.serve.reference import reference_generate

    ref, _ = reference_generate(cfg["checkpoint"], cfg["requests"], cfg["max_new"], device=cfg["device"])
    ok = True
    for s in rep["systems"].values():
        bad = [i for i, (a, b) in enumerate(zip(s["output_ids"], ref)) if a != b]
        s["matches_reference"] = not bad
        s["mismatched_requests"] = bad
        ok = ok and not bad
    rep["reference_output_ids"] = ref
    return ok


def _finish(cfg: dict, rep: dict, check: bool, json_path: str | None) -> None:
    ok = check_against_reference(cfg, rep) if check else True
    click.echo(format_report(rep))
    if json_path:
        first = next(iter(rep["systems"].values()))
        out = {**{k: v for k, v in first.items() if k != "logits"}, "systems": {
            n: {k: v for k, v in s.items() if k != "logits"} for n, s in rep["systems"].items()},
            "model": rep["model"], "config": rep["config"]}
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
    if not ok:
        bad = [n for n, s in rep["systems"].items() if not s["matches_reference"]]
        click.echo(f"zepp generate: --check failed for {', '.join(bad)}: tokens differ from plain transformers "
                   f"generate", err=True)
        raise SystemExit(1)


@click.command("generate")
@click.option("--checkpoint", required=True, help="Hugging Face checkpoint folder (config.json + safetensors).")
@click.option("--nodes", default=1, show_default=True, type=int, help="Nodes (consecutive ranks form a node).")
@click.option("--gpus-per-node", default=2, show_default=True, type=int, help="Ranks per node.")
@click.option("--system", default="zepp-overlap", show_default=True,
              help="Registry system(s) the runtime runs (comma list; 'zepp' runs each of its variants).")
@click.option("--input-ids", "input_ids", required=True, help='JSON file {"input_ids": [[...], ...]}.')
@click.option("--max-new-tokens", default=16, show_default=True, type=int, help="New tokens per request (at most).")
@click.option("--json", "json_path", default=None, help="Write the report here.")
@click.option("--check", is_flag=True, default=False,
              help="Also run plain transformers generate in one process; exit 1 unless every token matches.")
@click.option("--emulate", is_flag=True, default=False, help="Run the ranks in the emulated cluster (root).")
@click.option("--rate-mbit", type=float, default=None, help="With --emulate: NIC rate per direction (Mbit/s).")
@click.option("--record", default=None, help="Write per-layer traces (layer_{i:03d}.txt) and load.json here.")
@click.option("--history", default=None, help="Plan each layer's placement from a --record folder.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda (GPU LOCAL_RANK) or cuda:N.")
@click.option("--relaxation", default=0.25, show_default=True, type=float, help="Balance relaxation C.")
@click.option("--extra", default=2, show_default=True, type=int, help="Redundant slots per GPU (with --history).")
@click.option("--timeout", default=60.0, show_default=True, type=float,
              help="Seconds a collective may wait before the run ends with an error.")
@click.option("--threads", default=1, show_default=True, type=int, help="torch threads per spawned rank.")
@click.option("--emulate-prefix", default="zgen", show_default=True, hidden=True,
              help="With --emulate: name prefix of the namespaces (apart from zepp run's).")
@click.option("--fault", default=None, hidden=True, help='Test hook: JSON {"rank", "step", "mode": "die"|"hang"}.')
def generate(checkpoint, nodes, gpus_per_node, system, input_ids, max_new_tokens, json_path, check, emulate, rate_mbit,
             record, history, device, relaxation, extra, timeout, threads, emulate_prefix, fault):
    """Serve a checkpoint expert-parallel and generate greedily for every request."""
    from zepp.errors import RankFailure

    cfg = validate(dict(locals()))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not emulate:  # under torchrun
        from zepp.serve.rank import run_in_process

        with tempfile.TemporaryDirectory(prefix="zepp-generate-") as tmp:
            cfg["out"] = os.path.join(tmp, "report.json")
            code = run_in_process(cfg)
            if int(os.environ["RANK"]) != 0 or code:
                raise SystemExit(code)
            with open(cfg["out"]) as f:
                rep = json.load(f)
        _finish(cfg, rep, check, json_path)
        return
    try:
        if emulate:
            rep = _run_emulated(cfg, rate_mbit, threads, emulate_prefix)
        else:
            from zepp.launch.generate import spawn_generate

            rep = spawn_generate(cfg, threads=threads)
    except RankFailure as exc:
        click.echo(f"zepp generate: {exc}", err=True)
        raise SystemExit(3)
    _finish(cfg, rep, check, json_path)


def _run_emulated(cfg: dict, rate_mbit, threads: int, prefix: str = "zgen") -> dict:
    """The ranks inside an emulated cluster (``zepp.emulate.topology.EmulatedCluster``)."""
    import sys

    from zepp.launch.processes import temp_folder
    from zepp.emulate.topology import DEFAULT_RATE_MBIT, EmulatedCluster, availability

    ok, reason = availability()
    if not ok:
        raise ZeppInputError(f"--emulate: emulated cluster unavailable: {reason}")
    rate = DEFAULT_RATE_MBIT if rate_mbit is None else rate_mbit
    with EmulatedCluster(cfg["nodes"], cfg["gpus_per_node"], rate_mbit=rate, prefix=prefix) as cl, \
            temp_folder("zepp-generate-emu-") as tmp:
        cfg = dict(cfg, out=os.path.join(tmp, "report.json"))
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        env = {"ZEPP_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        with cl.spawn([sys.executable, "-m", "zepp.serve.rank", path], env=env,
                      logdir=os.path.join(tmp, "logs")) as group:
            res = group.wait(timeout=None, grace=float(cfg["timeout"]) + 15)
        if not res.ok:
            raise res.failure("(the emulated cluster was torn down)")
        with open(cfg["out"]) as f:
            rep = json.load(f)
    rep["emulate"] = {"rate_mbit": rate, "nodes": cfg["nodes"], "gpus_per_node": cfg["gpus_per_node"]}
    return rep
