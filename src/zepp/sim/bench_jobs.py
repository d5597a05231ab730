"""The configurations of the simulated benchmark table (``zepp bench``, ``zepp timeline``,
``zepp ablation``): the default sweeps, the checks of the options, and one *job* per configuration.

A job is one configuration (cluster, nodes, GPUs per node, model, budget) with the systems to
run, the iterations, the seed and the traces: a placement history and ``warmup + iters``
evaluation batches (built-in synthetic traces, or ``DIR/<model>/`` recorded ones; a drift
schedule other than the default draws them from its topics). ``make_config`` turns a job into
the ``zepp.sim.run.Config`` every system of it is simulated on.
"""

from __future__ import annotations

import os

from zepp import registry
from zepp.errors import ZeppInputError
from zepp.traces.schedules import DEFAULT_SCHEDULE

# the configurations a run covers by default, per --sweep (None: the paper's section-4 table)
SWEEPS = {
    None: dict(nodes=(4, 8, 16), models=("k2", "qwen"), budgets=(1.0, 4.0, 16.0), clusters=("a100",),
               systems=registry.PAPER_BASELINES + ("zepp",)),
    "weak": dict(nodes=(2, 4, 8, 16, 32), models=("k2",), budgets=(1.0, 64.0), clusters=("a100", "h100"),
                 systems=("a2av", "zepp")),
}

def traces_for(model: str, traces_dir: str | None, seed: int):
    """``(pool, eval)`` Traces: ``DIR/<model>/`` when ``traces_dir`` is given, else built-in."""
    if traces_dir:
        from zepp.traces import load_model_traces

        return load_model_traces(traces_dir, model)
    from zepp.traces.synthetic import synthetic_traces

    return synthetic_traces(model, seed)


TRACE_FILES = ("*/pool.txt", "*/eval.txt")  # what a --traces folder holds (for zepp.outputs.Place)


def check_traces(traces_dir: str | None, models, seed: int) -> None:
    """The traces of every model exist (recorded under ``traces_dir``, or built-in) before any
    work starts; one ``ZeppInputError`` naming what is missing otherwise."""
    from zepp.model import model_preset

    if traces_dir and not os.path.isdir(traces_dir):
        raise ZeppInputError(f"--traces {traces_dir!r}: not a directory; give the folder holding <model>/pool.txt "
                             f"and <model>/eval.txt")
    for m in models:
        traces_for(m, traces_dir, seed) if traces_dir else model_preset(m)


def check_shapes(models, nodes, gpus_per_node: int, budgets) -> None:
    """Every model's experts divide over every node count's GPUs and every budget holds a token."""
    from zepp.model import model_preset

    for m in models:
        spec = model_preset(m)
        for n in nodes:
            if n < 1 or spec.num_experts % (n * gpus_per_node):
                raise ZeppInputError(f"--nodes {n}: {spec.num_experts} experts of {m} do not divide over "
                                     f"{n}x{gpus_per_node} GPUs; choose a node count that divides them")
        for b in budgets:
            spec.tokens_for_budget(b)


def systems_to_run(names) -> list[str]:
    """``names`` with every meta-system's variants before it (a meta-system needs its variants
    simulated; they are reported too), each once, in order."""
    run_names: list[str] = []
    for n in names:
        for v in registry.variants(n, "sim") + ((n,) if registry.SYSTEMS[n].best_of else ()):
            if v not in run_names:
                run_names.append(v)
    return run_names


def make_jobs(clusters, nodes, gpus_per_node: int, models, budgets, systems, iters: int, warmup: int, seed: int,
              traces: str | None, schedule: str = DEFAULT_SCHEDULE) -> list[dict]:
    """One job per (cluster, nodes, model, budget), in that nesting order. A ``schedule``
    other than the default is stored in the job (the default's jobs stay as they were)."""
    extra = {} if schedule == DEFAULT_SCHEDULE else dict(schedule=schedule)
    return [dict(cluster=c, nodes=n, gpus_per_node=gpus_per_node, model=m, budget_mb=b, systems=systems,
                 iters=iters, warmup=warmup, seed=seed, traces=traces, **extra)
            for c in clusters for n in nodes for m in models for b in budgets]


def config_key(job: dict) -> str:
    sched = job.get("schedule", DEFAULT_SCHEDULE)
    return (f"{job['cluster']} {job['nodes']}x{job.get('gpus_per_node', 4)} {job['model']} {job['budget_mb']:g}MB"
            + ("" if sched == DEFAULT_SCHEDULE else f" {sched}"))


def job_workload(job: dict, pool, ev, ranks: int, tokens_per_rank: int):
    """The ``zepp.traces.DriftWorkload`` of a job with a drift schedule: topics of the recorded
    windows (``pool``, ``ev``), or of the preset's built-in generator."""
    from zepp.traces import drift_workload
    from zepp.traces.topics import find_topics, synthetic_topics

    topics = find_topics(pool, ev) if job.get("traces") else synthetic_topics(job["model"], job["seed"])
    return drift_workload(topics, job["schedule"], ranks, tokens_per_rank, job["warmup"] + job["iters"], job["seed"],
                          job.get("period"))


def make_config(job: dict, with_workload: bool = False):
    """The ``zepp.sim.run.Config`` of one configuration ``job`` (``with_workload``: and its
    ``DriftWorkload``, ``None`` under the default schedule)."""
    from zepp.model import model_preset
    from zepp.sim.calibrate import calibrated
    from zepp.sim.run import Config
    from zepp.traces import node_demand, sample_batches

    cl, net = calibrated(job["cluster"], job["nodes"], gpus_per_node=job.get("gpus_per_node", 4))
    spec = model_preset(job["model"])
    pool, ev = traces_for(job["model"], job.get("traces"), job["seed"])
    T = spec.tokens_for_budget(job["budget_mb"])
    wl = None
    if job.get("schedule", DEFAULT_SCHEDULE) == DEFAULT_SCHEDULE:
        hist = node_demand(pool, cl.nodes, cl.gpus_per_node)
        batches = sample_batches(ev, cl.ranks, T, job["warmup"] + job["iters"], job["seed"])
    else:
        wl = job_workload(job, pool, ev, cl.ranks, T)
        hist, batches = wl.hist(cl.nodes, cl.gpus_per_node), wl.batches
    cfg = Config(cl, spec, net, hist, batches, warmup=job["warmup"])
    return (cfg, wl) if with_workload else cfg
