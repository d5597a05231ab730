"""The bad-input table of every command: bad input as a careless or hostile user gives it, and
what ``zepp`` must answer. Every case runs ``zepp ARGV`` in-process and must give exactly one line
``zepp: error: ...`` (naming what the case says it names), exit code 2, before any work or rank
starts: nothing on stdout, no traceback, nothing written, no temp folder or child process left
(``refusal.refusal_line`` checks all of it). A case is ``(category, argvs, names)``: options that
several commands share follow one rule with one message (``zepp.launch.checks``), so a shared case
runs on every command that has the option and the lines must be equal; every other case has one
argv. Placeholders in braces are fixtures made in the test's folder (``refusal.materialise``).
Bad file *contents* are also tested with their readers and commands (``tests/traces``,
``tests/cli/test_cli_generate.py``, ``tests/cli/test_cli_plan.py``).
"""

from __future__ import annotations

import pytest

import hostile_files
from refusal import in_own_folders, make_tiny_checkpoint, materialise, refusal_line

RUN = ["run", "--nodes", "2", "--gpus-per-node", "1", "--model", "olmoe", "--experts", "8", "--topk", "2",
       "--hidden", "16", "--ffn", "8", "--warmup", "0", "--iters", "1", "--systems", "a2av"]
# the shared options are checked before the checkpoint is read: no checkpoint needed for them
GENERATE = ["generate", "--checkpoint", "/nonexistent-zepp-checkpoint", "--input-ids", "/nonexistent-zepp.json",
            "--nodes", "2", "--gpus-per-node", "1", "--system", "a2av"]
GEN = ["generate", "--nodes", "1", "--gpus-per-node", "2", "--system", "a2av", "--input-ids", "{prompts}",
       "--max-new-tokens", "4"]
GEN_CK = GEN + ["--checkpoint", "{ck}"]
CLUSTER_UP = ["cluster", "up", "--nodes", "2", "--gpus-per-node", "1"]
BENCH = ["bench", "--nodes", "1", "--models", "k2", "--budgets", "1", "--iters", "1", "--warmup", "0", "--jobs", "1",
         "--systems", "a2av"]
SMALL_PLAN = ["plan", "--model", "olmoe", "--experts", "16", "--topk", "2", "--hidden", "64", "--nodes", "2",
              "--gpus-per-node", "2", "--budget-mb", "0.01", "--iters", "1", "--trace", "{trace}"]
PLAN_FILE = ["plan", "--model", "olmoe", "--nodes", "2", "--budget-mb", "0.1", "--iters", "1", "--trace", "{trace64}"]
PLACE = ["place", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2",
         "--redundant", "4", "--format", "zepp", "--out", "{out}/p.json"]
PLACE_H = ["place", "--model", "olmoe", "--nodes", "2", "--gpus-per-node", "2", "--redundant", "4", "--format", "zepp",
           "--out", "{out}/p.json", "--history"]
TIMELINE = ["timeline", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5", "--out", "{out}/t.png"]
ABLATION = ["ablation", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5", "--iters", "1"]
# the base argv of each command that the option rows below add to
BASE = {"run": RUN, "generate": GENERATE, "cluster up": CLUSTER_UP, "bench": BENCH, "plan": SMALL_PLAN,
        "place": PLACE, "timeline": TIMELINE, "ablation": ABLATION}

# ----------------------------------------------------------------------------- options, by command
# (options, what the line must name, the commands that have them): every command, one message
SHARED = [
    (["--nodes", "0"], "--nodes", ["run", "generate", "cluster up"]),
    (["--nodes", "200", "--gpus-per-node", "2"], "at most 256", ["run", "generate", "cluster up"]),
    (["--gpus-per-node", "65"], "--gpus-per-node", ["run", "generate", "cluster up"]),
    (["--timeout", "nan"], "--timeout", ["run", "generate"]),
    (["--timeout", "inf"], "--timeout", ["run", "generate"]),
    (["--timeout", "0"], "--timeout", ["run", "generate"]),
    (["--threads", "0"], "--threads", ["run", "generate"]),
    (["--relaxation", "nan"], "--relaxation", ["run", "generate"]),
    (["--device", "foo"], "--device", ["run", "generate"]),
    (["--rate-mbit", "500"], "add --emulate", ["run", "generate"]),
    (["--delay-ms", "5"], "add --emulate", ["run", "generate"]),
    (["--json", "/nonexistent-zepp-folder/out.json"], "does not exist", ["run", "generate"]),
    (["--json", "/proc/zepp-out.json"], "cannot be written", ["run", "generate"]),
    (["--fault", '{"rank": 9}'], "rank must be an integer in 0..1", ["run", "generate"]),
    (["--emulate", "--device", "cuda:0"], "--device", ["run", "generate"]),
    (["--emulate", "--rate-mbit", "inf"], "--rate-mbit", ["run", "generate"]),
    (["--emulate", "--delay-ms", "nan"], "--delay-ms", ["run", "generate"]),
    (["--emulate", "--emulate-prefix", "Bad-Prefix"], "prefix", ["run", "generate"]),
    (["--rate-mbit", "inf"], "--rate-mbit", ["cluster up"]),
    (["--delay-ms", "-1"], "--delay-ms", ["cluster up"]),
]

# one command's own options: (options, what the line must name, the command)
_ROW = '"cluster": "a100", "nodes": 1, "model": "k2", "budget_mb": 1'
OWN = [
    (["--measured", "{file.json:not json}"], "not valid JSON", "bench"),
    (["--measured", '{file.json:{"rows": []}}'], "one or more rows", "bench"),
    (["--measured", '{file.json:{"rows": [{' + _ROW + ', "ms": {"zepp-x": 1}}]}}'], "no system the simulator runs",
     "bench"),
    (["--measured", '{file.json:{"rows": [{' + _ROW + ', "ms": {"zepp": -1}}]}}'], "field ms.zepp", "bench"),
    (["--measured", '{file.json:{"rows": [{' + _ROW + ', "ms": {"zepp": 1}}, {' + _ROW + ', "ms": {"a2av": 1}}]}}'],
     "repeats configuration", "bench"),
    (["--measured", '{file.json:{"rows": [{' + _ROW + ', "ms": {"zepp": 1, "zepp": 2}}]}}'], "given twice", "bench"),
    (["--measured", '{file.json:{"rows": [{' + _ROW.replace("a100", "tpu") + ', "ms": {"zepp": 1}}]}}'],
     "field cluster", "bench"),
    (["--measured", '{file.json:{"rows": [{' + _ROW.replace('"nodes": 1', '"nodes": 1.5') + ', "ms": {"zepp": 1}}]}}'],
     "field nodes", "bench"),
    (["--measured", "{fifo}"], "not a regular file", "bench"),
    (["--budget-mb", "inf"], "budget", "run"),
    (["--iters", "0"], "--iters", "run"),
    (["--extra", "9"], "--extra", "run"),
    (["--systems", "nope"], "nope", "run"),
    (["--fault", "notjson"], "--fault", "run"),
    (["--fault", '{"rank": 1, "system": "eplb", "iter": 0}'], "--fault: system", "run"),
    (["--fault", '{"rank": 1, "iter": 0, "mode": "sleep"}'], "--fault: mode", "run"),
    (["--trace", "{garbage}"], "garbage.txt", "run"),
    (["--trace", "{fifo}"], "not a regular file", "run"),
    (["--history", "{garbage}"], "--history needs --trace", "run"),
    (["--max-new-tokens", "0"], "--max-new-tokens", "generate"),
    (["--fault", "notjson"], "--fault", "generate"),
    (["--fault", '{"rank": 1, "iter": 0}'], "keys rank, system, step, mode", "generate"),
    (["--system", "nope"], "unknown system", "generate"),
    (["--system", "comet"], "not supported", "generate"),
    (["--record", "/nonexistent-zepp-folder/rec"], "--record", "generate"),
    ([], "is not a folder", "generate"),  # the checkpoint
    (["--nic-mtu", "10"], "--nic-mtu", "cluster up"),
    (["--systems", "nope"], "unknown system(s) nope", "bench"),
    (["--systems", "zepp-p2p"], "not supported by this command", "bench"),
    (["--nodes", "5", "--models", "k2"], "divide", "bench"),
    (["--budgets", "inf"], "budget", "bench"),
    (["--jobs", "0"], "--jobs", "bench"),
    (["--resume"], "--resume needs --json", "bench"),
    (["--json", "/nonexistent-folder/x.json"], "does not exist", "bench"),
    (["--iters", "0"], "--iters", "bench"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'", "bench"),
    (["--systems", "zepp-overlap", "--plot", "{out}/x.png"], "--plot draws each system against", "bench"),
    (["--iters", "0"], "--iters must be an integer at least 1", "plan"),
    (["--relaxation", "nan"], "--relaxation must be a finite number", "plan"),
    (["--json", "/nonexistent-folder/p.json"], "does not exist", "plan"),
    (["--systems", "zepp,deepep"], "deepep", "plan"),
    (["--budget-mb", "0.0001"], "too small for one token", "plan"),
    (["--out", "/nonexistent-dir/p.json"], "folder '/nonexistent-dir' does not exist", "place"),
    (["--report", "/nonexistent-dir/r.json"], "--report '/nonexistent-dir/r.json': folder '/nonexistent-dir' does not exist",
     "place"),
    (["--budget-mb", "inf"], "--budget-mb must be a finite number", "place"),
    (["--heldout", "1.5"], "--heldout must lie in [0, 1)", "place"),
    (["--policy", "best"], "--policy 'best': choose one of home, zepp, eplb", "place"),
    (["--routing", "fastest"], "--routing 'fastest'", "place"),
    (["--dispatch", "a2av", "--combine", "reduce"], "needs a relay or zepp dispatch", "place"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'", "place"),
    (["--relaxation", "nan"], "--relaxation must be a finite number", "place"),
    (["--redundant", "5"], "not divisible by the 4 GPUs", "place"),
    (["--format", "trtllm"], "--format trtllm writes .yaml or .yml files", "place"),
    (["--format", "sglang", "--out", "{tabledir}"], "the table file beside --out ", "place"),
    (["--format", "vllm", "--out", "{out}/p.pt", "--report", "{out}/p.zepp-table.pt"],
     "one output would overwrite the other", "place"),
    (["--redundant", "200"], "at most one copy of an expert per node", "place"),
    (["--nodes", "1", "--redundant", "4"], "use --redundant 0 or fewer", "place"),
    (["--format", "sglang", "--routing", "sglang-table"], "--routing 'sglang-table': choose one of", "place"),
    (["--out", "/nonexistent-folder/t.png"], "does not exist", "timeline"),
    (["--compare", "a2av,eplb,fast"], "give two systems", "timeline"),
    (["--traces", "/nonexistent-folder"], "not a directory", "timeline"),
    (["--cluster", "tpu"], "unknown cluster preset 'tpu'", "timeline"),
    (["--ranks", "0,x"], "--ranks: expected a comma-separated list", "timeline"),
    (["--schedule", "drift"], "--schedule 'drift': unknown schedule; choose from stationary", "timeline"),
    (["--schedule", "drift"], "--schedule 'drift': unknown schedule; choose from stationary", "bench"),
    (["--schedule", "drift"], "--schedule 'drift': unknown schedule; choose from stationary", "plan"),
    (["--schedules", "rotating,drift"], "--schedules 'drift': unknown schedule", "ablation"),
    (["--schedules", "rotating,rotating"], "named twice", "ablation"),
    (["--period", "0"], "--period must be an integer at least 1", "ablation"),
    (["--iters", "0"], "--iters must be an integer at least 1", "ablation"),
    (["--budget-mb", "nan"], "--budget-mb must be a finite number above 0", "ablation"),
    (["--nodes", "3"], "divide", "ablation"),
    (["--json", "/nonexistent-folder/a.json"], "does not exist", "ablation"),
    (["--traces", "/nonexistent-folder"], "not a directory", "ablation"),
]
PREFIX_ONLY = [["cluster", "status", "--prefix", "Bad-Prefix"], ["cluster", "down", "--prefix", "Bad-Prefix"],
               ["cluster", "check", "--prefix", "Bad-Prefix"], ["cluster", "calibrate", "--prefix", "Bad-Prefix"]]


def _with(base: list[str], options: list[str]) -> list[str]:
    """``base`` with ``options`` added; an option of the base given again is replaced by the row's."""
    if options[:1] and options[0] in base:
        i = base.index(options[0])
        base = base[:i] + base[i + 2:]
    return base + options


# ----------------------------------------------------------------------------- inputs, by category
# argvs; every line will do (the category says what is wrong)

USAGE = [  # click's own errors, as zepp's one line
    ["nosuch"], ["plan", "--nosuch"], ["plan", "--nodes", "abc"], ["plan", "--model", "gpt"], ["plan", "--seed", "x"],
    ["plan", "--budget-mb", "lots"], ["plan", "--nodes"], ["bench", "--sweep", "strong"], ["bench", "--iters", "1.5"],
    ["bench", "extra-arg"], ["timeline", "--nodes", "two"], ["timeline", "--bogus", "1"],
    ["place", "--format", "foo", "--history", "synthetic", "--model", "olmoe", "--nodes", "2", "--out", "x.json"],
    ["place", "--model", "olmoe"], ["place", "--nodes", "2.5"], ["run", "--dtype", "float8"], ["run", "--threads", "x"],
    ["generate"], ["generate", "--checkpoint", "x"], ["generate", "--max-new-tokens", "many"],
    ["cluster", "nosuch"], ["cluster", "up", "--nodes", "x"], ["cluster", "check", "--timeout", "soon"],
    ["cluster", "down", "--bogus"], ["systems", "--bogus"], ["systems", "extra"],
]

NUMBERS = [  # finite, in range, integers where counts are meant, seeds non-negative
    SMALL_PLAN + ["--seed", "-1"], SMALL_PLAN + ["--seed", str(2**64)], SMALL_PLAN + ["--nodes", "0"],
    SMALL_PLAN + ["--nodes", "100000"], SMALL_PLAN + ["--gpus-per-node", "0"], SMALL_PLAN + ["--budget-mb", "nan"],
    SMALL_PLAN + ["--budget-mb", "-1"], SMALL_PLAN + ["--budget-mb", "inf"], SMALL_PLAN + ["--iters", "-3"],
    SMALL_PLAN + ["--relaxation", "-0.5"], SMALL_PLAN + ["--relaxation", "inf"], SMALL_PLAN + ["--extra", "-1"],
    SMALL_PLAN + ["--experts", "0"], SMALL_PLAN + ["--topk", "0"],
    BENCH + ["--seed", "-1"], BENCH + ["--warmup", "-1"], BENCH + ["--gpus-per-node", "0"], BENCH + ["--nodes", "0"],
    BENCH + ["--nodes", "-4"], BENCH + ["--budgets", "nan"], BENCH + ["--budgets", "-1"], BENCH + ["--jobs", "100000"],
    BENCH + ["--iters", "0"],
    TIMELINE + ["--seed", "-1"], TIMELINE + ["--gpus-per-node", "0"], TIMELINE + ["--nodes", "0"],
    TIMELINE + ["--budget-mb", "nan"], TIMELINE + ["--budget-mb", "0"], TIMELINE + ["--ranks", "99"],
    TIMELINE + ["--ranks", "-1"],
    PLACE + ["--seed", "-1"], PLACE + ["--nodes", "0"], PLACE + ["--gpus-per-node", "0"], PLACE + ["--iters", "0"],
    PLACE + ["--heldout", "-0.1"], PLACE + ["--heldout", "nan"], PLACE + ["--sim-layers", "-1"],
    PLACE + ["--redundant", "-4"], PLACE + ["--budget-mb", "nan"], PLACE + ["--relaxation", "-1"],
    RUN + ["--seed", "-1"], RUN + ["--warmup", "-1"], RUN + ["--tokens", "0"], RUN + ["--threads", "100000"],
    RUN + ["--timeout", "-1"], RUN + ["--extra", "-2"],
    GEN_CK + ["--max-new-tokens", "1000000000"], GEN_CK + ["--max-new-tokens", "-1"], GEN_CK + ["--timeout", "nan"],
    GEN_CK + ["--threads", "100000"], GEN_CK + ["--extra", "-1"], GEN_CK + ["--relaxation", "inf"],
    ["cluster", "up", "--nodes", "0"], ["cluster", "up", "--nic-mtu", "0"], ["cluster", "check", "--timeout", "nan"],
    ["cluster", "check", "--timeout", "0"],
    ABLATION + ["--seed", "-1"], ABLATION + ["--period", "0"], ABLATION + ["--nodes", "0"],
    ABLATION + ["--budget-mb", "nan"], ABLATION + ["--iters", "0"], ABLATION + ["--schedules", "rotating,,unseen"],
    ABLATION + ["--schedules", "nosuch"], ABLATION + ["--model", "gpt"], ABLATION + ["--cluster", "tpu"],
    ABLATION + ["--gpus-per-node", "0"], ABLATION + ["--traces", "/nonexistent-zepp"], ABLATION + ["--period", "x"], BENCH + ["--nodes", "1,,2"], BENCH + ["--budgets", ","],
    BENCH + ["--schedule", "nosuch"], SMALL_PLAN + ["--schedule", "drifting"], TIMELINE + ["--schedule", "x"],
    RUN + ["--schedule", "rotate"],
]

OUTPUTS = [  # the folder exists and is writable, the path is not a folder, the writer supports the suffix
    SMALL_PLAN + ["--json", "{out}"], SMALL_PLAN + ["--json", "/nonexistent-zepp/p.json"],
    SMALL_PLAN + ["--json", "/proc/zepp-p.json"], SMALL_PLAN + ["--json", "{afile}/p.json"],
    SMALL_PLAN + ["--dump", "{afile}"], SMALL_PLAN + ["--dump", "/nonexistent-zepp/a/b"],
    SMALL_PLAN + ["--json", ""], BENCH + ["--json", ""], BENCH + ["--plot", ""], PLACE + ["--report", ""],
    RUN + ["--json", ""], GEN_CK + ["--json", ""], ["cluster", "calibrate", "--json", ""],
    BENCH + ["--json", "{out}"], BENCH + ["--json", "/proc/zepp-b.json"], BENCH + ["--plot", "{out}/b.xyz"],
    BENCH + ["--plot", "{out}/b"], BENCH + ["--plot", "{out}"], BENCH + ["--plot", "/nonexistent-zepp/b.png"],
    BENCH + ["--json", "{out}/b.json", "--plot", "{out}/b.docx"],
    ABLATION + ["--plot", "{out}/a.xyz"], ABLATION + ["--json", "{out}"], ABLATION + ["--plot", "/proc/zepp-a.png"],
    TIMELINE + ["--out", "{out}/t.xyz"], TIMELINE + ["--out", "{out}/t"], TIMELINE + ["--out", "{out}"],
    TIMELINE + ["--out", "/proc/zepp-t.png"], TIMELINE + ["--out", "{afile}/t.png"],
    PLACE + ["--out", "{out}"], PLACE + ["--out", "/proc/zepp-p.json"], PLACE + ["--report", "{out}"],
    PLACE + ["--report", "/proc/zepp-r.json"],
    RUN + ["--json", "{out}"], RUN + ["--json", "{afile}/r.json"],
    GEN_CK + ["--json", "{out}"], GEN_CK + ["--json", "/proc/zepp-g.json"], GEN_CK + ["--record", "{afile}"],
    GEN_CK + ["--record", "/nonexistent-zepp/a/rec"],
    ["cluster", "calibrate", "--json", "/nonexistent-zepp/c.json"], ["cluster", "calibrate", "--json", "{out}"],
]

CHECKPOINTS = [GEN + ["--checkpoint", c] for c in (
    "{ck:config=vocab_size:lots}", "{ck:config=hidden_size:-4}", "{ck:config=num_hidden_layers:0}",
    "{ck:config=vocab_size:true}", "{ck:config=num_attention_heads:1.5}", "{ck:config=max_position_embeddings:-1}",
    "{ck:config=model_type:nosuch_moe}", "{ck:config=model_type:null}", "{ck:config=model_type:llama}",
    "{ck:config=num_hidden_layers:3}", "{ck:config=num_local_experts:16}", "{ck:config=moe_intermediate_size:32}",
    "{ck:config=hidden_size:64}", "{ck:config=vocab_size:256}", "{ck:config_text={}",
    "{ck:config_text=[1, 2]}", "{ck:config_text=}", "{ck:empty}", "{ck:truncated}", "{ck:short}",
    "{ck:header_length}", "{ck:header_garbage}", "{ck:header_list}", "{ck:bad_offsets}", "{ck:bad_dtype}",
    "{ck:missing_tensor}", "{ck:index_garbage}", "{ck:index_missing_file}", "{ck:index_wrong_file}",
    "{ck:index_escape}", "{ck:no_config}", "{ck:no_weights}", "{afile}", "/nonexistent-zepp-ck",
)]

GEN_PROMPTS = ["generate", "--nodes", "1", "--gpus-per-node", "2", "--system", "a2av", "--checkpoint", "{ck}",
               "--input-ids"]
LIMITS = [  # prompt + new tokens against max_position_embeddings (512 in the tiny checkpoints)
    GEN_PROMPTS + ["{prompts:600}"], GEN_PROMPTS + ["{prompts:512}"],
    GEN_PROMPTS + ["{prompts:500}", "--max-new-tokens", "100"], GEN_PROMPTS + ["{prompts:510:per}"],
    GEN_PROMPTS + ["{prompts:bad_token}"], GEN_PROMPTS + ["{prompts:empty}"],
]

CLUSTER_TEXTS = [
    "gemm_eff_max: 7", "gemm_eff_max: 0", "gemm_eff_max: -0.5", "gemm_rows_half: 0", "weight_copy_bw: 0",
    "nic_msg_cost: 1e30", "nvlink_msg_cost: 1", "nvlink_bw: 1e-300", "nic_bw: 0", "nic_bw: .nan", "nic_bw: .inf",
    "peak_flops: 1e30", "hbm_bw: -1", "kernel_launch: -1e-6", "nvlink_bw: fast", "nvlink_bw: true",
    "nodes: 0", "nodes: 2.5", "gpus_per_node: 100000", "gpus_per_node: 0", "nic_speed: 3", "base: tpu",
    "name: ''", "nvlink_bw: [1, 2]", "nodes: [1", "- 1\n- 2", "just text", "nic_bw: 2.0e10\nnic_bw: 4.0e10",
]
CLUSTER_FILES = ([SMALL_PLAN + ["--cluster-file", "{cluster:" + t + "}"] for t in CLUSTER_TEXTS]
                 + [PLACE + ["--cluster-file", "{cluster:" + t + "}"] for t in CLUSTER_TEXTS[:12]]
                 + [SMALL_PLAN + ["--cluster-file", "{cluster.json:{\"nic_bw\": NaN}}"],
                    SMALL_PLAN + ["--cluster-file", "{cluster.json:{\"nic_bw\": -1}}"],
                    SMALL_PLAN + ["--cluster-file", "{cluster.json:[1, 2]}"],
                    SMALL_PLAN + ["--cluster-file", "{cluster.json:{\"nic_bw\": 2e10, \"nic_bw\": 4e10}}"],
                    SMALL_PLAN + ["--cluster-file", "{out}"], PLACE + ["--cluster-file", "/nonexistent-zepp.yaml"],
                    SMALL_PLAN + ["--cluster-file", "{cluster:nodes: 8}"],  # the file and --nodes 2 disagree
                    PLACE + ["--cluster-file", "{cluster:gpus_per_node: 8}"],
                    PLACE + ["--cluster-file", "{cluster:base: h100-8\nnodes: 3}"]])

HISTORIES = [PLACE_H + [h] for h in (
    "{hist:zero}", "{hist:nosteps}", "{hist:overflow}", "{hist:uint64}", "{hist:negative}", "{hist:zero_layer}",
    "{hist:empty.txt}", "{hist:comments.txt}", "{hist:float.npz}", "{hist:nan.npz}",
)] + [GEN_CK + ["--history", "{genhist:" + bad + "}"] for bad in ("0 9", "", "0 1 2", "3 3", "x y")] + [
    PLAN_FILE[:-1] + ["{hist:empty.txt}"], PLAN_FILE[:-2] + ["--history", "{hist:empty.txt}", "--trace",
                                                                  "{trace64}"]]

RESUME = [BENCH + ["--json", "{resume:" + k + "}", "--resume"] for k in (
    "missing_key", "string_latency", "null_latency", "nan_latency", "negative_latency", "inf_bound",
    "bool_nodes", "string_nodes", "run_missing", "run_bad_iters", "systems_missing", "not_json", "rows_not_list",
    "row_not_dict", "bad_budget", "detail_bad",
)]

CATEGORIES = {"click usage": USAGE, "numbers": NUMBERS, "output paths": OUTPUTS, "checkpoints": CHECKPOINTS,
              "generation limits": LIMITS, "cluster files": CLUSTER_FILES, "histories": HISTORIES,
              "resume files": RESUME}

# ----------------------------------------------------------------------------- reading (issue 29)
# hostile files for every reader (fixtures: tests/cli/hostile_files.py): each reader refuses what
# it cannot trust through zepp.files' rules and its format's schema

PLACE_DS = ["place", "--model", "deepseek-v2-lite", "--nodes", "2", "--gpus-per-node", "2", "--redundant", "4",
            "--format", "zepp", "--out", "{out}/p.json", "--history"]
YAML_FILES = ([PLAN_FILE + ["--cluster-file", "{yaml:" + k + "}"] for k in hostile_files.YAML_TEXTS]
              + [PLACE + ["--cluster-file", "{yaml:" + k + "}"] for k in ("laughs", "octal", "base_list", "huge_int")]
              + [PLAN_FILE + ["--cluster-file", "{cjson:" + k + "}"] for k in hostile_files.JSON_TEXTS])
DEEP_JSON = [GEN_PROMPTS + ["{deep:prompts}"], BENCH + ["--json", "{deep:resume}", "--resume"],
             PLACE_H + ["{trt:deep}"], PLACE_H + ["{rec:deep}"]] + [
    GEN + ["--checkpoint", "{deep:" + k + "}"] for k in ("config", "index", "header")]
PROMPT_FILES = [GEN_PROMPTS + ["{ptext:" + k + "}"] for k in ("dup", "unknown", "huge", "nan")]
CONFIG_VALUES = [GEN + ["--checkpoint", c] for c in (
    "{ck:config=rms_norm_eps:-1e-6}", "{ck:config=rope_theta:NaN}", "{ck:config=rope_theta:Infinity}",
    "{ck:config=rope_theta:0}", "{ck:config=rms_norm_eps:small}", "{ck:config=tie_word_embeddings:yes}",
    "{ck:config=norm_topk_prob:on}", "{ck:config=decoder_sparse_step:0}", "{ck:config=num_experts_per_tok:9}",
    "{ck:config=bos_token_id:1000000}", "{ck:config=eos_token_id:-5}", "{ck:config=mlp_only_layers:all}",
    "{ck:config=sliding_window:-4}", "{ck:config=torch_dtype:float7}", "{ck:config=attention_dropout:2.0}",
    "{ck:config=initializer_range:-1}", "{ck:config=vocab_size:null}", "{ck:config=hidden_size:100000000000000000000}",
    "{ckdup}", "{ck:config=hidden_act:nosuch}", '{ck:config=rope_parameters:{"rope_type": "nosuch"}}',
    '{ck:config=rope_parameters:{"rope_type": "default", "rope_theta": -1}}', "{ck:config=rope_parameters:[1]}",
)]
ENGINE_HISTORIES = ([PLACE_H + ["{rec:" + k + "}"] for k in hostile_files.RECORDERS if k not in ("deep", "fifo")]
                    + [PLACE_DS + ["{sglang:" + k + "}"] for k in ("string", "list", "float", "negative", "huge",
                                                                   "tensor")]
                    + [PLACE_H + ["{vllm:" + k + "}"] for k in ("layers", "experts", "strings", "bool")]
                    + [PLACE_H + ["{trt:" + k + "}"] for k in ("topk_gt", "dup", "string")])
NOT_REGULAR = [GEN_PROMPTS + ["{fifojson:prompts.json}"], GEN + ["--checkpoint", "{ckfifo:weights}"],
               GEN + ["--checkpoint", "{ckfifo:index}"], PLACE_H + ["{rec:fifo}"], PLACE_H + ["{fifojson:h.npz}"],
               PLACE_H + ["{fifojson:h.pt}"], PLAN_FILE + ["--cluster-file", "{fifojson:c.yaml}"],
               PLAN_FILE + ["--cluster-file", "/dev/zero"], PLACE_H + ["/dev/null"]]
CATEGORIES.update({"reading: YAML files": YAML_FILES, "reading: deep JSON": DEEP_JSON,
                   "reading: prompt files": PROMPT_FILES, "reading: checkpoint config": CONFIG_VALUES,
                   "reading: engine histories": ENGINE_HISTORIES, "reading: not regular files": NOT_REGULAR})

# ----------------------------------------------------------------------------- the table
# (category, the argvs that must all give the same line, what the line must name)
CASES = ([("shared options", [BASE[c] + options for c in commands], names) for options, names, commands in SHARED]
         + [(f"{command} options", [_with(BASE[command], options)], names) for options, names, command in OWN]
         + [("cluster prefix", [argv], "prefix") for argv in PREFIX_ONLY]
         + [(category, [argv], "") for category, rows in CATEGORIES.items() for argv in rows])


def _case_id(category: str, argvs: list[list[str]]) -> str:
    if len(argvs) > 1:  # a shared option: the row's options, and the commands it runs on
        first = argvs[0][len(BASE[_command(argvs[0])]):]
        return f"{category}: {' '.join(first)} ({', '.join(_command(a) for a in argvs)})"
    return f"{category}: {' '.join(argvs[0])}"


def _command(argv: list[str]) -> str:
    return " ".join(argv[:2]) if argv[0] == "cluster" else argv[0]


def test_the_table_holds_every_case_over_every_command():
    commands = {_command(argv) for _, argvs, _ in CASES for argv in argvs}
    assert len(CASES) >= 340, len(CASES)
    assert {"bench", "plan", "timeline", "run", "generate", "place", "systems", "ablation", "cluster up",
            "cluster check", "cluster status", "cluster down", "cluster calibrate"} <= commands, commands


@pytest.fixture(scope="module")
def tiny_ck(tmp_path_factory):
    """The tiny checkpoint the checkpoint and generation cases break copies of, made once."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny")


@pytest.mark.parametrize("category,argvs,names", CASES, ids=[_case_id(c, a) for c, a, _ in CASES])
def test_bad_input_is_one_line_exit_2_nothing_left(category, argvs, names, tmp_path, capfd, monkeypatch, request):
    needs_ck = any("{ck" in a or "{prompts" in a or "{deep:" in a for argv in argvs for a in argv)
    tiny = request.getfixturevalue("tiny_ck") if needs_ck else None
    work, tmpdir = in_own_folders(tmp_path, monkeypatch)
    lines = {}
    for argv in argvs:
        args = materialise(argv, work, tiny)
        lines[_command(argv)] = refusal_line(args, work, tmpdir, capfd)
    for command, line in lines.items():
        assert names in line, (command, line)
    assert len(set(lines.values())) == 1, lines  # a shared option: one message on every command


# ============================================================================= outputs, lists, the rank environment
# (issue 29: what a run writes, the lists it takes, what torchrun hands a rank; the outputs are
# checked by ``zepp.outputs``, the environment by ``zepp.launch.rank_env``). Each case: the argv,
# what the line must name, and the environment it runs in (variables set, ``None``: unset).

RUN16 = RUN[:RUN.index("--experts")] + ["--experts", "16", "--topk", "2", "--hidden", "16", "--ffn", "8", "--warmup",
                                        "0", "--iters", "1", "--systems", "a2av"]
PLOT_BENCH = BENCH[:BENCH.index("--systems")] + ["--systems", "a2av,zepp"]
OUTPUT_CLASHES = [  # an output that is an input of the run, or another output of it
    (RUN16 + ["--trace", "{trace}", "--json", "{out}/trace.txt"], "an input of this run"),
    (RUN16 + ["--trace", "{trace}", "--json", "{out}/../work/trace.txt"], "an input of this run"),  # via ..
    (RUN16 + ["--trace", "{trace}", "--json", "{hardlink:trace.txt}"], "an input of this run"),  # a hard link
    (RUN16 + ["--history", "{trace}", "--trace", "{trace}", "--json", "{out}/trace.txt"], "--history"),
    (GEN_CK + ["--json", "{out}/prompts.json"], "--input-ids"),
    (GEN_CK + ["--json", "{out}/ck/config.json"], "--checkpoint"),  # a file of the checkpoint's folder
    (GEN_CK + ["--history", "{genhist:0 1}", "--record", "{out}/rec"], "the same folder as --history"),
    (GEN_CK + ["--record", "{out}", "--json", "{out}/load.json"], "--record"),  # a file --record writes
    (PLACE + ["--report", "{out}/p.json"], "--report"),
    (PLACE_H + ["{trace64}", "--out", "{out}/trace64.json", "--report", "{out}/trace64.txt"], "an input"),
    (PLOT_BENCH + ["--json", "{out}/b.png", "--plot", "{out}/b.png"], "--plot"),
    (PLOT_BENCH + ["--json", "{out}/b.json", "--plot", "{out}/b.detail.json"], "suffix"),
    (SMALL_PLAN + ["--json", "{out}/d", "--dump", "{out}/d"], "--dump"),
    (SMALL_PLAN + ["--json", "{out}/a2av_iter0.npz", "--dump", "{out}"], "--dump"),
    (SMALL_PLAN + ["--json", "{out}/trace.txt"], "--trace"),
    (ABLATION + ["--json", "{out}/a.png", "--plot", "{out}/a.png"], "--plot"),
]
# (links of the test's own, never /dev/stdout: code that replaced a link, run as root, would
# replace the machine's)
OUTPUT_KINDS = [  # what is at the path: a link is neither written through nor replaced; devices, pipes refused
    (RUN16 + ["--json", "{symlink:/dev/null}"], "symbolic link"), (RUN16 + ["--json", "/dev/full"], "character device"),
    (GEN_CK + ["--json", "/dev/null"], "character device"), (RUN16 + ["--json", "{fifo}"], "named pipe"),
    (SMALL_PLAN + ["--json", "{symlink:trace.txt}"], "symbolic link"),
    (PLACE + ["--report", "{symlink:/dev/full}"], "symbolic link"),
    (BENCH + ["--json", "{symlink:nowhere}"], "symbolic link"),  # a link to nothing yet
    (["cluster", "calibrate", "--json", "/dev/full"], "character device"),
    (TIMELINE[:-2] + ["--out", "{afile}"], "suffix"),
]
REPEATS = [  # a list that names one thing twice: one line, never run twice
    (BENCH[:-2] + ["--systems", "a2av,a2av"], "a2av is named twice"),
    (BENCH[:-2] + ["--systems", "all,a2av"], "all includes it"),
    (BENCH[:-2] + ["--systems", "a2av,,zepp"], "empty entry"),
    (BENCH + ["--nodes", "1,1"], "--nodes '1,1': 1 is named twice"),
    (BENCH + ["--models", "k2,k2"], "k2 is named twice"), (BENCH + ["--budgets", "1,1.0"], "1.0 is named twice"),
    (BENCH + ["--cluster", "a100,a100"], "a100 is named twice"),
    (SMALL_PLAN + ["--systems", "a2av,eplb,a2av"], "a2av is named twice"),
    (SMALL_PLAN + ["--systems", "zepp,zepp-overlap"], "zepp-overlap is named twice"),
    (RUN + ["--systems", "a2av,a2av"], "a2av is named twice"),
    (RUN[:-2] + ["--systems", "all,relay"], "all includes it"),
    (GENERATE + ["--system", "a2av,a2av"], "a2av is named twice"),
    (TIMELINE + ["--compare", "a2av,a2av"], "a2av is named twice"), (TIMELINE + ["--ranks", "0,0"], "0 is named twice"),
]
MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "LOCAL_WORLD_SIZE": "1",
          "TORCHELASTIC_USE_AGENT_STORE": "True"}
RANK_ENV = [  # RUN and GENERATE run 2 nodes x 1 rank: what torchrun would hand rank 1
    ({"RANK": "1"}, "WORLD_SIZE is not"), ({"WORLD_SIZE": "2"}, "but RANK is not"),
    ({"RANK": "1", "WORLD_SIZE": "two", "LOCAL_RANK": "0", **MASTER}, "WORLD_SIZE='two' is not an integer"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", **MASTER}, "WORLD_SIZE=4, but --nodes 2"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER}, "RANK=2 is out of range"),
    ({"RANK": "-1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER}, "RANK=-1 is out of range"),
    ({"RANK": "1", "WORLD_SIZE": "2", **MASTER}, "LOCAL_RANK is not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", **MASTER}, "LOCAL_RANK=1 is out of range"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER, "LOCAL_WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE=2"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER, "MASTER_ADDR": None}, "MASTER_ADDR is not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER, "MASTER_PORT": "99999"}, "MASTER_PORT=99999"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER, "MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER, "MASTER_PORT": "{taken}",
      "TORCHELASTIC_USE_AGENT_STORE": None}, "already in use"),
]
ENV_CASES = ([("output clashes", argv, names, {}) for argv, names in OUTPUT_CLASHES]
             + [("output kinds", argv, names, {}) for argv, names in OUTPUT_KINDS]
             + [("repeated names", argv, names, {}) for argv, names in REPEATS]
             + [("rank environment", base, names, env) for env, names in RANK_ENV
                for base in (RUN, GEN_CK + ["--nodes", "2", "--gpus-per-node", "1"])]
             + [("rank environment", RUN + ["--emulate"], "--emulate starts its own ranks",
                 {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **MASTER})])


@pytest.mark.parametrize("category,argv,names,env", ENV_CASES,
                         ids=[f"{c}: {' '.join(a)} {e or ''}" for c, a, _, e in ENV_CASES])
def test_outputs_lists_and_rank_env_are_one_line(category, argv, names, env, tmp_path, capfd, monkeypatch, request):
    import socket

    tiny = request.getfixturevalue("tiny_ck") if any("{ck" in a or "{prompts" in a for a in argv) else None
    work, tmpdir = in_own_folders(tmp_path, monkeypatch)
    with socket.socket() as taken:  # a port another process listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_USE_AGENT_STORE"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            if v is not None:
                monkeypatch.setenv(k, v.replace("{taken}", str(taken.getsockname()[1])))
        line = refusal_line(materialise(argv, work, tiny), work, tmpdir, capfd)
    assert names in line, line
