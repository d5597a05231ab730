"""``zepp generate``: serve a Hugging Face MoE checkpoint expert-parallel and generate.

On one machine it starts the ranks itself (gloo on loopback); under ``torchrun`` (``RANK`` and
``WORLD_SIZE`` set) it runs as that rank (rank 0 prints and writes the report); ``--emulate``
runs the ranks in the emulated cluster (network namespaces, NICs shaped to ``--rate-mbit``).
The launch is ``zepp run``'s (``zepp.launch.ranks.launch``: a rank that dies or hangs ends the
run, exit code 3, naming it), and so are the rules of the options both have
(``zepp.launch.checks``). Every option is checked before any rank starts::

    zepp generate --checkpoint ckpt/ --nodes 2 --gpus-per-node 2 --system zepp-overlap \\
        --input-ids prompts.json --max-new-tokens 32 --json out.json --check

``--input-ids FILE``: JSON ``{"input_ids": [[...], ...]}`` (optionally ``"max_new_tokens": [...]``
per request, capped at ``--max-new-tokens``). ``--json`` writes
``output_ids`` (new tokens only, one list per request, in input order), ``system``,
``prefill_tokens_per_s``, ``decode_ms_per_step``, ``nic_bytes`` and more (``systems`` holds one
such report per system when ``--system`` names several).
"""

from __future__ import annotations

import contextlib
import functools
import os

import click

from zepp.errors import ZeppFileError, ZeppInputError
from zepp.files import read_json
from zepp.launch import ranks
from zepp.launch.checks import check_fault, check_launch_options, check_number
from zepp.outputs import Place, check_output_folder

RANK_MODULE = "zepp.serve.rank"  # what every rank of ``zepp generate`` runs
RANK_ENV = {"TOKENIZERS_PARALLELISM": "false"}
PROMPT_KEYS = ("input_ids", "max_new_tokens")  # what an --input-ids file may hold
RECORD = ("layer_*.txt", "load.json")  # what --record writes in its folder (zepp.serve.rank.write_record)


def read_requests(path: str, vocab: int | None, max_new: int) -> tuple[list[list[int]], list[int]]:
    """``(requests, max_new per request)`` from an ``--input-ids`` file; one clear error otherwise.
    ``vocab`` ``None``: the token ids are checked against the vocabulary later (``check_tokens``)."""
    if not os.path.exists(path):
        raise ZeppInputError(f"--input-ids {path!r} does not exist")
    try:
        obj = read_json(path, "--input-ids file")
    except ZeppFileError:
        raise
    except ZeppInputError as exc:
        raise ZeppInputError(f"--input-ids {path!r}: {str(exc).removeprefix(f'{path}: ')}") from None
    unknown = sorted(set(obj) - set(PROMPT_KEYS)) if isinstance(obj, dict) else []
    if unknown:
        raise ZeppFileError(f"unknown key {unknown[0]!r}", path, repr(unknown[0])[:60],
                            f"a prompt file holds {' and '.join(PROMPT_KEYS)} only")
    reqs = obj.get("input_ids") if isinstance(obj, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise ZeppInputError(f"--input-ids {path!r}: expected {{\"input_ids\": [[token ids], ...]}} with at least one "
                             f"request")
    check_tokens(reqs, vocab, path)
    per = obj.get("max_new_tokens")
    if per is None:
        per = [max_new] * len(reqs)
    elif not isinstance(per, list) or len(per) != len(reqs) or any(
            isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in per):
        raise ZeppInputError(f"--input-ids {path!r}: max_new_tokens must be a list of {len(reqs)} positive integers")
    return reqs, [min(int(m), max_new) for m in per]


def check_tokens(reqs: list, vocab: int | None, path: str) -> None:
    """Every request a non-empty list of token ids in ``[0, vocab)`` (``None``: any non-negative id)."""
    top = vocab if vocab is not None else 1 << 62
    for i, r in enumerate(reqs):
        if not isinstance(r, list) or not r:
            raise ZeppInputError(f"--input-ids {path!r}: request {i} is not a non-empty list of token ids")
        bad = [t for t in r if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < top]
        if bad:
            where = f"[0, {vocab})" if vocab is not None else "(a non-negative integer)"
            raise ZeppInputError(f"--input-ids {path!r}: request {i} holds {bad[0]!r}, not a token id {where}")


def check_positions(reqs: list[list[int]], per: list[int], positions: int | None, path: str) -> None:
    """Every request's prompt plus its new tokens fits the model's ``max_position_embeddings``
    (refused, never clipped: the fix is a shorter prompt or a smaller ``--max-new-tokens``)."""
    if positions is None:
        return
    for i, (r, m) in enumerate(zip(reqs, per)):
        if len(r) + m > positions:
            room = positions - len(r)
            fix = (f"lower --max-new-tokens (or its max_new_tokens) to {room}" if room >= 1
                   else "shorten the prompt")
            raise ZeppInputError(f"--input-ids {path!r}: request {i} has {len(r)} prompt tokens + {m} new tokens = "
                                 f"{len(r) + m}, beyond the model's max_position_embeddings {positions}; {fix}")


def _check_model(o: dict, world: int):
    """The checkpoint's config and MoE shape, its experts over ``world`` ranks, ``--extra`` and
    ``--history`` (one trace per MoE layer)."""
    from zepp.serve.ckpt_check import check_tensors, read_config_json
    from zepp.serve.loader import moe_shape, read_config

    read_config_json(o["checkpoint"])
    config = read_config(o["checkpoint"])
    shape = moe_shape(config)
    check_tensors(o["checkpoint"], config)
    if shape["experts"] % world:
        raise ZeppInputError(f"the model's {shape['experts']} experts do not divide over {world} ranks; change "
                             f"--nodes or --gpus-per-node")
    check_number("--extra", o["extra"], 0, shape["experts"], integer=True)
    if o["history"]:
        from zepp.traces import read_trace

        for i in range(shape["layers"]):
            p = os.path.join(o["history"], f"layer_{i:03d}.txt")
            if not os.path.isfile(p):
                raise ZeppInputError(f"--history {o['history']!r}: no {os.path.basename(p)} (one trace per MoE layer, "
                                     f"{shape['layers']} layers; write them with --record)")
            read_trace(p, num_experts=shape["experts"], top_k=shape["top_k"])  # as the ranks will read it
    return config


def validate(o: dict) -> tuple[dict, object]:
    """Check every option (``o``: the click parameters); returns the ``zepp.serve.rank`` config and,
    with ``--emulate``, the emulated cluster (not up yet; else None). Nothing is started."""
    from zepp.registry import parse_systems
    from zepp.serve.ckpt_check import check_folder

    common = check_launch_options(o)
    world = common["nodes"] * common["gpus_per_node"]
    check_number("--max-new-tokens", o["max_new_tokens"], 1, 1 << 20, integer=True)
    systems = parse_systems(o["system"], "runtime", option="--system", expand=True)
    fault = check_fault(o["fault"], world, systems, "step")
    if o["record"]:
        check_output_folder(o["record"], "--record")
    cluster = None
    if o["emulate"]:
        from zepp.emulate.launcher import check_cluster

        cluster = check_cluster(common["nodes"], common["gpus_per_node"], o["rate_mbit"], o["delay_ms"],
                                o["emulate_prefix"])
    from zepp.cli.run import claim_run_outputs

    claim_run_outputs([Place("--json", o["json_path"]), Place("--record", o["record"], folder=True, names=RECORD)],
                      [Place("--input-ids", o["input_ids"]), Place("--checkpoint", o["checkpoint"], folder=True),
                       Place("--history", o["history"], folder=True)])
    check_folder(o["checkpoint"])
    reqs, per = read_requests(o["input_ids"], None, o["max_new_tokens"])  # before torch: a bad file is refused at once
    config = _check_model(o, world)  # the checkpoint is read last: every cheaper check comes first
    check_tokens(reqs, int(config.vocab_size), o["input_ids"])
    check_positions(reqs, per, getattr(config, "max_position_embeddings", None), o["input_ids"])
    absolute = {k: os.path.abspath(o[k]) if o[k] else None for k in ("checkpoint", "history", "record")}
    cfg = dict(absolute, **common, systems=systems, requests=reqs, max_new=per, eos=None, relaxation=o["relaxation"],
               extra=o["extra"], keep_logits=False, fault=fault, emulate=o["emulate"])
    return cfg, cluster


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
        if sum(s["swaps_per_step"]):  # per step: swaps, their bytes, the time they cost (zepp.serve.engine.Swapper)
            lines.append(f"  {name} swaps per step {s['swaps_per_step']}, weight KB per step "
                         f"{[round(b / 1024, 1) for b in s['swap_bytes_per_step']]}, across nodes "
                         f"{s['swap_bytes_cross_node']} B; ms between steps (plan + post) "
                         f"{[round(v, 2) for v in s['swap_ms_per_step']]}; ms waited for copies inside steps "
                         f"{[round(v, 2) for v in s.get('swap_wait_ms_per_step', [])]}")
    return "\n".join(lines + host_lines(rep))


def host_lines(rep: dict) -> list[str]:
    """Per system: host ms per MoE layer (the sum of ``HOST_PARTS``: metadata, plan, hops, compile,
    pack) of the prefill step and of a decode step, and the path each step took."""
    from zepp.runtime.dispatcher import HOST_PARTS

    out = []
    for name, s in rep["systems"].items():
        b = s.get("breakdown_ms_per_layer") or {}
        host = {p: sum(b[p].get(k, 0.0) for k in HOST_PARTS) for p in b}
        moe = {p: b[p].get("moe", 0.0) for p in b}
        parts = ", ".join(f"{p} {host[p]:.1f} of {moe[p]:.1f} ms" for p in host)
        paths = ", ".join(f"{p} x{s.get('paths', []).count(p)}" for p in sorted(set(s.get("paths", []))))
        out.append(f"{name}: host work per MoE layer {parts or '-'}; steps by path: {paths or '-'}")
    return out


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
        from zepp.outputs import write_json

        write_json(json_path, out, "--json")
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
@click.option("--delay-ms", type=float, default=0.0, show_default=True,
              help="With --emulate: added one-way NIC latency (needs the netem qdisc).")
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
             delay_ms, record, history, device, relaxation, extra, timeout, threads, emulate_prefix, fault):
    """Serve a checkpoint expert-parallel and generate greedily for every request."""
    o = dict(locals())
    with inductor_cache():
        cfg, cluster = validate(o)
        emulated = None
        if cluster is not None:
            from zepp.emulate.launcher import generate_emulated

            emulated = functools.partial(generate_emulated, cfg, cluster, threads=threads)
        rep = ranks.launch(RANK_MODULE, cfg, label="zepp generate" + (" --emulate" if emulate else ""),
                           threads=threads, env=RANK_ENV, emulated=emulated, prefix="zepp-generate-")
        _finish(cfg, rep, check, json_path)


@contextlib.contextmanager
def inductor_cache():
    """torch's compiler cache (``TORCHINDUCTOR_CACHE_DIR``, which building the model's skeleton
    creates, by default ``$TMPDIR/torchinductor_<user>``) in a temp folder of this run, removed
    with it (``kill -9`` too: ``zepp.launch.processes.temp_folder``); the ranks inherit it. A
    folder the user chose is kept."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield
        return
    from zepp.launch.processes import temp_folder

    try:
        with temp_folder("zepp-inductor-") as folder:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
            yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
