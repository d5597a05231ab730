"""The one table of systems and stage choices.

Every system zepp knows (Zepp, its variants and the baselines) is one ``System`` row: a choice
per planning stage (placement, routing, dispatch transport, combine transport), how it executes
(overlap, adaptation), the simulator mechanics it runs with and which executors support it.
Every command's option parsing, help text and error messages, the README's system table and
the tests read this module; no other list of names exists.

Stage choices (each name has one meaning everywhere; ``zepp systems`` prints them) are owned by
the planner stage that implements them, one ``ChoiceTable`` of records each (``zepp.planner.choices``),
and read here: ``PLACEMENTS`` (``zepp.planner.placement``), ``ROUTINGS`` (``zepp.planner.routing``),
``DISPATCHES``, ``COMBINES`` (``zepp.planner.flows``), ``OVERLAPS``, ``OVERLAP_COMMS``
(``zepp.planner.overlap``), ``ADAPTATIONS`` (``zepp.planner.adaptation``). A row's records are its
properties (``placement_choice`` ...): code asks them what the system does, never its stage names.

Executors: ``plan`` (``zepp plan``: placement, routing and flows, bytes per link), ``sim`` (the
simulator: ``zepp bench``, ``zepp timeline``) and ``runtime`` (``zepp run`` on torch.distributed).
A meta-system (``best_of``) is the per-configuration best of its variants, or, with
``switch_tokens``, the variant a batch's size picks (an engine that switches kernels by batch
size); commands that do not compare latencies (``plan``, ``run``) expand it into its variants.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from zepp.errors import ZeppInputError
from zepp.planner.adaptation import ADAPTATIONS, AdaptationChoice
from zepp.planner.flows import COMBINES, DISPATCHES, CombineChoice, DispatchChoice
from zepp.planner.overlap import OVERLAP_COMMS, OVERLAPS, OverlapChoice, OverlapComm
from zepp.planner.placement import PLACEMENTS, PlacementChoice
from zepp.planner.routing import ROUTINGS, RoutingChoice

__all__ = ["System", "SYSTEMS", "PAPER_BASELINES", "EXECUTORS", "STAGE_TABLES", "PLACEMENTS", "ROUTINGS",
           "DISPATCHES", "COMBINES", "OVERLAPS", "OVERLAP_COMMS", "ADAPTATIONS", "system", "names_for", "variants",
           "pick_variant", "parse_systems", "help_list", "as_table", "format_systems", "markdown_table", "to_json"]

EXECUTORS = ("plan", "sim", "runtime")
# the stage tables in the order of a row's fields: (field, title in zepp systems, table)
STAGE_TABLES = (("placement", "placements", PLACEMENTS), ("routing", "routings", ROUTINGS),
                ("dispatch", "dispatch transports", DISPATCHES), ("combine", "combine transports", COMBINES),
                ("overlap", "overlap", OVERLAPS), ("adaptation", "adaptation", ADAPTATIONS),
                ("overlap_comm", "overlap communication (runtime)", OVERLAP_COMMS))


class _StageRecord:
    """A ``System`` attribute that reads the record of one of its stage fields from the stage's table."""

    def __init__(self, field_name: str, table):
        self.field_name, self.table = field_name, table

    def __get__(self, row, owner=None):
        return self if row is None else self.table[getattr(row, self.field_name)]


@dataclass(frozen=True)
class System:
    """One system: a choice per stage, its simulator mechanics and its executors.

    ``mechanics``: name of the simulator's execution record (``zepp.sim.mechanics``);
    ``plugins``: named simulator parts that replace or add to the FlowPlan-driven phases
    (``zepp.sim.phases``); ``planning``: name of the planning-cost model (``zepp.sim.planning_cost``).
    ``best_of``: a meta-system's variants (then the stage fields describe the family).
    ``switch_tokens``: a meta-system that is not the best of its two variants but runs the first
    on batches of at most this many tokens per GPU and the second on larger ones
    (``pick_variant``). ``ours``: Zepp or one of its variants (not a baseline).
    """

    name: str
    summary: str
    stands_for: str
    placement: str
    routing: str
    dispatch: str
    combine: str
    overlap: str = "none"
    adaptation: str = "none"
    mechanics: str = "serial-barrier"
    planning: str = "none"
    plugins: tuple[str, ...] = ()
    executors: tuple[str, ...] = ("plan", "sim", "runtime")
    overlap_comm: str = "collective"  # runtime: overlap via async all-to-alls, or "p2p"
    paper_column: str | None = None  # column of PAPER.md section 4's measured table
    best_of: tuple[str, ...] = field(default=())
    switch_tokens: int | None = None
    ours: bool = False

    # a row's record of each stage (``s.routing_choice`` is ``ROUTINGS[s.routing]``): what code asks
    placement_choice = _StageRecord("placement", PLACEMENTS)
    routing_choice = _StageRecord("routing", ROUTINGS)
    dispatch_choice = _StageRecord("dispatch", DISPATCHES)
    combine_choice = _StageRecord("combine", COMBINES)
    overlap_choice = _StageRecord("overlap", OVERLAPS)
    adaptation_choice = _StageRecord("adaptation", ADAPTATIONS)
    comm_choice = _StageRecord("overlap_comm", OVERLAP_COMMS)

    @property
    def swaps(self) -> bool:
        """Whether the system swaps experts inside nodes while serving (either swap adaptation)."""
        return self.adaptation_choice.swaps

    def supports(self, executor: str) -> bool:
        return executor in self.executors

    def as_dict(self) -> dict:
        return asdict(self)


def _by_tokens(name: str, summary: str, stands_for: str, placement: str, routing: str, planning: str = "none",
               ours: bool = False, prefill_routing: str | None = None) -> tuple[System, System, System]:
    """An engine on DeepEP's kernels: the meta-row ``name`` (low-latency kernels up to 256 tokens per
    GPU, normal kernels above) and its variants ``name-ll`` (entries straight to their GPU) and
    ``name-normal`` (NIC once per node, combine reduced in the node; ``prefill_routing``: its own
    routing, default ``routing``)."""
    common = dict(planning=planning, executors=("plan", "sim"), ours=ours)
    return (System(name, summary + ": low-latency kernels up to 256 tokens per GPU, normal kernels above", stands_for,
                   placement, routing, "relay", "reduce", mechanics="by-tokens",
                   best_of=(name + "-ll", name + "-normal"), switch_tokens=256, **common),
            System(name + "-ll", summary + ", DeepEP low-latency kernels", stands_for + " (decode)", placement,
                   routing, "a2av", "a2av", mechanics="deepep-ll", **common),
            System(name + "-normal", summary + ", DeepEP normal kernels", stands_for + " (prefill)", placement,
                   prefill_routing or routing, "relay", "reduce", mechanics="deepep-normal", **common))


# How a system on COMET's fused kernels executes (overlap, simulator model, planner cost, executors).
_ON_COMET = dict(overlap="comet", mechanics="comet", planning="comet-routing",
                 plugins=("comet-allgather", "comet-ring-combine"), executors=("sim",))

_ROWS = (
    # ---- the paper's seven baselines (PAPER.md section 3 and section 7)
    System("a2av", "all-to-all-v both ways, one replica per expert, no overlap",
           "the paper's a2av baseline: NVSHMEM blocking puts in ring order, world barriers",
           "home", "home", "a2av", "a2av", mechanics="serial-barrier", paper_column="a2av"),
    System("fast", "FAST: in-server rebalance, then Birkhoff-von Neumann one-to-one inter-node rounds",
           "FAST scheduler (host-planned synchronous rounds)",
           "home", "home", "a2av", "a2av", mechanics="fast", planning="fast-host", plugins=("fast-rounds",),
           executors=("plan", "sim"), paper_column="fast"),
    System("comet", "COMET: dense all-gather dispatch, fused tile-level GEMM overlap, home placement",
           "COMET fused MoE kernels", "home", "home", "allgather", "dedup", **_ON_COMET, paper_column="comet"),
    System("eplb", "DeepSeek EPLB replicas over a staged all-to-all-v, replica round-robin",
           "DeepSeek EPLB + all-to-all-v (vLLM / TensorRT-LLM style replica choice)",
           "eplb", "replica-rr", "a2av", "a2av", mechanics="eplb-staged", planning="eplb-torch",
           paper_column="eplb"),
    System("epic", "EPIC: greedy NIC-aware placement, relay dispatch, hierarchical pre-reduced combine",
           "EPIC (serial relay puts through the host proxy)",
           "epic", "fixed", "relay", "reduce-direct", mechanics="epic-relay", planning="epic",
           paper_column="epic"),
    System("moonep", "MoonEP: per-batch redundant experts so every GPU computes T*k rows, weights pulled",
           "MoonEP (per-batch balance, weight prefetch)",
           "home", "moonep", "dedup", "dedup", adaptation="moonep", mechanics="moonep", planning="moonep",
           plugins=("moonep-pulls",), executors=("sim",), paper_column="moonep"),
    System("comet+eplb", "COMET's fused kernels over EPLB's physical slots and replica round-robin",
           "COMET + DeepSeek EPLB", "eplb", "replica-rr", "allgather", "dedup", **_ON_COMET, paper_column="comet+eplb"),
    # ---- engines and transports users run today
    System("relay", "home placement over a DeepEP-style relay (one NIC crossing per token and node)",
           "DeepEP-style relay dispatch without pre-reduced combine",
           "home", "home", "relay", "dedup", mechanics="signals"),
    System("sglang", "EPLB replicas with SGLang's static dispatch over all-to-all-v",
           "SGLang static dispatch (--ep-dispatch-algorithm static)", "eplb", "sglang-static", "a2av", "a2av",
           mechanics="signals"),
    # ---- today's clusters: DeepEP's kernels (zepp.sim.mechanics deepep-*), each engine switching
    # them by batch size (_by_tokens). SGLang 0.5.23 (read in its wheel): with a DeepEP backend
    # --ep-dispatch-algorithm defaults to static; --deepep-mode auto runs low-latency kernels on
    # decode batches and normal ones when the batch extends (DeepEPMode.resolve); the low-latency
    # buffer holds SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK tokens (default 128; a deployment
    # decoding 256 tokens per GPU raises it). A simulated batch has only a size: at most 256 tokens
    # per GPU (issue 12's largest decode batch) is a decode batch. vLLM 0.33.0 runs DeepEP through
    # --all2all-backend deepep_low_latency / deepep_high_throughput: the same kernels, switched here at
    # the same size. The replica choices are the engines' own (zepp.planner.routing.sglang_routing,
    # vllm_routing); SGLang's lists are those of a placement loaded from a file (an --enable-eplb
    # rebalance keeps the static rule but unshrinks dynamic's and lp's lists). sglang-lp: the LP's
    # time is the lplb planning model (zepp/data/lp_solver.json). sglang-zepp / vllm-zepp: the same
    # engines and kernels with only Zepp's placement and Zepp's table in the engine's own form
    # (zepp.planner.routing.engine_tables; zepp place --format sglang|vllm, zepp.engines), a
    # decode deployment's table (busiest NIC) on the low-latency kernels, a prefill one's (busiest GPU) above.
    *_by_tokens("sglang-deepep", "SGLang + DeepEP + EPLB's placement, static dispatch",
                "SGLang --moe-a2a-backend deepep --deepep-mode auto --init-expert-location <EPLB's map> (static dispatch)",
                "eplb", "sglang-static"),
    *_by_tokens("sglang-lp", "SGLang + DeepEP + EPLB's placement with the lp dispatch (per-batch LP over redundant "
                "experts, drawn from SGLang's candidate lists)", "SGLang --moe-a2a-backend deepep --deepep-mode auto "
                "--init-expert-location <EPLB's map> --ep-dispatch-algorithm lp", "eplb", "sglang-lp", planning="lplb"),
    *_by_tokens("vllm-eplb", "vLLM + DeepEP + EPLB: the copy by vLLM's hash of the token's row",
                "vLLM --enable-eplb with the DeepEP all2all backends", "eplb", "vllm-hash"),
    *_by_tokens("sglang-zepp", "SGLang + DeepEP with Zepp's placement and Zepp's static dispatch table (SGLang's own "
                "kernels and dispatch)", "SGLang --init-expert-location <zepp place file> + zepp.engines.sglang_hook",
                "zepp", "sglang-table", ours=True, prefill_routing="sglang-table-prefill"),
    *_by_tokens("vllm-zepp", "vLLM + DeepEP with Zepp's placement and Zepp's per-rank maps (vLLM's own kernels and "
                "hash)", "vLLM --enable-eplb + the zepp vllm.general_plugins entry point", "zepp", "vllm-table",
                ours=True, prefill_routing="vllm-table-prefill"),
    System("zepp-deepep", "Zepp on DeepEP's kernels: the best of its table-routed low-latency variants, zepp-deepep-ll, "
           "zepp-deepep-normal, zepp-deepep-overlap and zepp-deepep-lp",
           "Zepp on today's clusters", "zepp", "zepp", "zepp", "reduce", overlap="zepp", mechanics="best-of",
           planning="zepp", best_of=("zepp-deepep-table", "zepp-deepep-table-cols", "zepp-deepep-table-lean",
                                     "zepp-deepep-table-relay", "zepp-deepep-ll", "zepp-deepep-normal",
                                     "zepp-deepep-overlap", "zepp-deepep-lp"),
           executors=("plan", "sim"), ours=True),
    System("zepp-deepep-ll", "Zepp's placement and routing over DeepEP's low-latency kernels",
           "Zepp variant (DeepEP low-latency)", "zepp", "zepp", "a2av", "a2av", mechanics="deepep-ll", planning="zepp",
           executors=("plan", "sim"), ours=True),
    System("zepp-deepep-table", "Zepp's placement, its routing table looked up per entry on the device, DeepEP-style "
           "low-latency kernels sending a token once per destination GPU (outputs summed there)",
           "Zepp variant (low-latency kernels, table routing)", "zepp", "zepp-table", "dedup", "dedup",
           mechanics="deepep-ll", planning="zepp-table", executors=("sim",), ours=True),
    System("zepp-deepep-table-cols", "zepp-deepep-table with GEMM 2 in column splits, each sending its slice of the "
           "partials as it finishes (the combine overlaps GEMM 2)",
           "Zepp variant (low-latency kernels, table routing, column-split combine)", "zepp", "zepp-table", "dedup",
           "dedup", mechanics="deepep-ll-cols", planning="zepp-table", executors=("sim",), ours=True),
    System("zepp-deepep-table-lean", "zepp-deepep-table-cols routed over the fewest replicas that leave every GPU the "
           "fewest slots with work (a decode GEMM reads the weights of every slot it serves)",
           "Zepp variant (low-latency kernels, lean table routing, column-split combine)", "zepp", "zepp-table-lean",
           "dedup", "dedup", mechanics="deepep-ll-cols", planning="zepp-table", executors=("sim",), ours=True),
    System("zepp-deepep-table-relay", "Zepp's placement and routing table over a hierarchical low-latency kernel: a "
           "token crosses the NIC once per node to the GPU of its local index, which forwards it over NVLink; "
           "partials reduced in the node before the NIC",
           "Zepp variant (low-latency kernels, table routing, node merge)", "zepp", "zepp-table", "relay", "reduce",
           mechanics="deepep-ll-relay", planning="zepp-table", executors=("sim",), ours=True),
    System("zepp-deepep-normal", "Zepp's placement, routing and transport over DeepEP's normal-kernel figures",
           "Zepp variant (DeepEP normal)", "zepp", "zepp", "zepp", "reduce", mechanics="deepep-normal", planning="zepp",
           executors=("plan", "sim"), ours=True),
    System("zepp-deepep-overlap", "zepp-deepep-normal with Zepp's dispatch groups and combine waves",
           "Zepp variant (DeepEP normal + overlap)", "zepp", "zepp", "zepp", "reduce", overlap="zepp",
           mechanics="deepep-overlap", planning="zepp", executors=("plan", "sim"), ours=True),
    System("zepp-deepep-lp", "zepp-deepep-overlap with the replicas of Zepp's placement balanced per batch by LPLB's LP "
           "(GPU load) instead of the water-fill", "Zepp variant (DeepEP normal + overlap, LP balance)", "zepp", "lp",
           "zepp", "reduce", overlap="zepp", mechanics="deepep-overlap", planning="zepp+lp", executors=("plan", "sim"), ours=True),
    # ---- Zepp and its variants
    System("zepp", "Zepp: the best of zepp-a2av, zepp-overlap, zepp-auto and zepp-swap per configuration",
           "the paper's Zepp number (plus the per-batch granularity of issue 12)", "zepp", "zepp", "zepp", "reduce",
           overlap="zepp", best_of=("zepp-a2av", "zepp-overlap", "zepp-auto", "zepp-swap"), executors=("plan", "sim", "runtime"),
           mechanics="best-of", planning="zepp", ours=True),
    System("zepp-a2av", "Zepp's placement and routing over plain all-to-all-v",
           "Zepp variant (a2av)", "zepp", "zepp", "a2av", "a2av", mechanics="serial-barrier", planning="zepp", ours=True),
    System("zepp-overlap", "Zepp's placement, routing and transport with dispatch groups and combine waves",
           "Zepp variant (overlap)", "zepp", "zepp", "zepp", "reduce", overlap="zepp", mechanics="zepp-overlap",
           planning="zepp", ours=True),
    System("zepp-auto", "zepp-overlap with as many dispatch groups and combine waves as the planner's cost model "
           "chooses per batch (one GEMM per phase up to one per node)", "Zepp variant (overlap, planned granularity)",
           "zepp", "zepp", "zepp", "reduce", overlap="zepp-auto", mechanics="zepp-overlap",
           planning="zepp+granularity", ours=True),
    System("zepp-swap", "zepp-overlap plus intra-node expert swaps planned from the previous batch's loads",
           "Zepp variant (overlap + swaps)", "zepp", "zepp", "zepp", "reduce", overlap="zepp",
           adaptation="zepp-swap", mechanics="zepp-overlap", planning="zepp+swap", executors=("sim", "runtime"), ours=True),
    System("zepp-relay", "Zepp's placement and routing over the relay transport (no split, no pre-reduce)",
           "ablation: merge only", "zepp", "zepp", "relay", "dedup", mechanics="signals", planning="zepp", ours=True),
    System("zepp-sync", "Zepp's placement, routing and transport without overlap",
           "ablation: no overlap", "zepp", "zepp", "zepp", "reduce", mechanics="signals", planning="zepp", ours=True),
    System("zepp-direct", "Zepp's transport with pre-reduced combine rows sent straight to the owner (one stage fewer)",
           "ours: for executors that pay per stage", "zepp", "zepp", "zepp", "reduce-direct",
           mechanics="signals", planning="zepp", ours=True),
    System("zepp-p2p", "zepp-overlap executed with batched point-to-point sends instead of async all-to-alls",
           "runtime variant of zepp-overlap", "zepp", "zepp", "zepp", "reduce", overlap="zepp",
           mechanics="zepp-overlap", planning="zepp", executors=("runtime",), overlap_comm="p2p", ours=True),
)

SYSTEMS: dict[str, System] = {s.name: s for s in _ROWS}
PAPER_BASELINES = tuple(s.name for s in _ROWS if s.paper_column is not None)


def _check_table() -> None:
    for s in _ROWS:
        for what, _, table in STAGE_TABLES:
            if getattr(s, what) not in table:
                raise AssertionError(f"registry row {s.name!r}: unknown {what} {getattr(s, what)!r}")
        if not set(s.executors) <= set(EXECUTORS):
            raise AssertionError(f"registry row {s.name!r}: unknown executor in {s.executors}")
        for v in s.best_of:
            if v not in SYSTEMS or SYSTEMS[v].best_of:
                raise AssertionError(f"registry row {s.name!r}: variant {v!r} is not a plain system")
        if s.best_of and set(s.executors) != {e for v in s.best_of for e in SYSTEMS[v].executors}:
            raise AssertionError(f"registry row {s.name!r}: executors must be those of its variants")
        if s.switch_tokens is not None and (len(s.best_of) != 2 or s.switch_tokens < 1):
            raise AssertionError(f"registry row {s.name!r}: switch_tokens needs two variants and a positive size")


def system(name: str) -> System:
    """The row of ``name``; an unknown name is bad input (the message lists every name)."""
    if name not in SYSTEMS:
        raise ZeppInputError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)} (zepp systems lists them)")
    return SYSTEMS[name]


def names_for(executor: str) -> tuple[str, ...]:
    """The systems ``executor`` supports, in table order (a meta-system when any of its
    variants is supported: it then stands for those variants)."""
    return tuple(s.name for s in _ROWS if s.supports(executor))


def variants(name: str, executor: str) -> tuple[str, ...]:
    """What ``name`` runs as under ``executor``: a meta-system's supported variants, else itself."""
    s = system(name)
    return tuple(v for v in s.best_of if SYSTEMS[v].supports(executor)) if s.best_of else (name,)


def pick_variant(name: str, tokens_per_rank: int, medians: dict[str, float]) -> str:
    """The variant a meta-system runs as on a batch of ``tokens_per_rank`` tokens per GPU:
    with ``switch_tokens``, the first variant up to that size and the second above it; else the
    variant of ``medians`` (simulated median seconds per variant) that is fastest."""
    s = system(name)
    if s.switch_tokens is not None:
        return s.best_of[0] if tokens_per_rank <= s.switch_tokens else s.best_of[1]
    return min((v for v in s.best_of if v in medians), key=medians.get)


def parse_systems(text: str, executor: str, option: str = "--systems", default_all: tuple[str, ...] | None = None,
                  expand: bool = False) -> list[str]:
    """A comma list of registry names that ``executor`` supports; ``all`` stands for
    ``default_all`` (default: every supported name). ``expand``: meta-systems become their
    variants (for commands that do not compare latencies). Unknown or unsupported names are one
    clear error naming the option and the choices."""
    supported = names_for(executor)
    parts = [s.strip() for s in str(text).split(",")]
    names = [n for s in parts for n in ((supported if default_all is None else default_all) if s == "all" else [s])]
    if parts == [""]:
        raise ZeppInputError(f"{option}: empty list; choose from {', '.join(supported)} or 'all'")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    via = " (all includes it)" if "all" in parts else ""
    if "" in parts or twice:
        raise ZeppInputError(f"{option} {text!r}: " + ("an empty entry between commas; remove the extra comma"
                                                       if "" in parts else f"{twice} is named twice{via}; name each "
                                                                           f"system once"))
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise ZeppInputError(f"{option}: unknown system(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(supported)} or 'all' (zepp systems lists them)")
    unsupported = [n for n in names if n not in supported]
    if unsupported:
        where = {n: ", ".join(SYSTEMS[n].executors) for n in unsupported}
        raise ZeppInputError(f"{option}: {', '.join(f'{n} (runs in: {w})' for n, w in where.items())} not supported "
                             f"by this command; choose from {', '.join(supported)}")
    out = [v for n in names for v in variants(n, executor)] if expand else names
    twice = next((v for i, v in enumerate(out) if v in out[:i]), None)
    if twice and "all" not in parts:  # a meta-system and one of its variants
        raise ZeppInputError(f"{option} {text!r}: {twice} is named twice (a meta-system runs each of its variants, "
                             f"{twice} among them); name each system once")
    return list(dict.fromkeys(out))


def help_list(executor: str) -> str:
    """The names ``executor`` supports, for ``--help`` texts."""
    return ", ".join(names_for(executor))


def as_table(rows=None) -> list[dict]:
    """Every row as a dict (``zepp systems --json``)."""
    return [s.as_dict() for s in (rows or _ROWS)]


def format_systems() -> str:
    """The table ``zepp systems`` prints: one line per system, then the stage choices."""
    cols = ("name", "placement", "routing", "dispatch", "combine", "overlap", "adaptation", "executors")
    rows = [[s.name, s.placement, s.routing, s.dispatch, s.combine, s.overlap, s.adaptation, ",".join(s.executors)]
            for s in _ROWS]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(cols), line(["-" * w for w in widths])]
    for s, r in zip(_ROWS, rows):
        out.append(line(r))
        out.append("    " + s.summary + (f" [stands for: {s.stands_for}]" if s.stands_for else ""))
        if s.best_of:
            out.append("    " + _meta_text(s))
    for _, title, table in STAGE_TABLES:
        out.append("")
        out.append(title + ":")
        w = max(len(k) for k in table)
        out.extend(f"  {k.ljust(w)}  {v}" for k, v in table.meanings().items())
    return "\n".join(out)


def _meta_text(s: System) -> str:
    if s.switch_tokens is not None:
        return f"runs {s.best_of[0]} up to {s.switch_tokens} tokens per GPU, {s.best_of[1]} above"
    return "best of: " + ", ".join(s.best_of)


def markdown_table() -> str:
    """The README's system table (a test checks the README holds exactly this)."""
    head = "| system | what it is | stands for | placement | routing | dispatch | combine | overlap | adaptation | runs in |"
    out = [head, "| " + " | ".join("---" for _ in range(10)) + " |"]
    for s in _ROWS:
        what = s.summary + (f" ({_meta_text(s)})" if s.best_of and "best of" not in s.summary else "")
        out.append(f"| `{s.name}` | {what} | {s.stands_for} | {s.placement} | {s.routing} | {s.dispatch} | "
                   f"{s.combine} | {s.overlap} | {s.adaptation} | {', '.join(s.executors)} |")
    return "\n".join(out)


def to_json() -> str:
    return json.dumps({"systems": as_table(), "stages": {what: {name: _choice_dict(c) for name, c in table.items()}
                                                         for what, _, table in STAGE_TABLES}}, indent=1)


def _choice_dict(c) -> dict:
    """A stage record as JSON: its name, meaning, flags and whether it has a torch twin."""
    return {k: v for k, v in asdict(c).items() if not callable(v)}


_check_table()
