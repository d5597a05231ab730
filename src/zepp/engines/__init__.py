"""Zepp inside the engines: plug-ins that install Zepp's placement and routing tables into SGLang
and vLLM through their own plug-in points, without editing them.

- ``sglang_hook``: a ``--forward-hooks`` factory (SGLang 0.5.23) that writes each rank's static
  dispatch map from the table file ``zepp place --format sglang`` writes beside the placement
  (the placement itself is ``--init-expert-location``).
- ``vllm_plugin``: the ``vllm.general_plugins`` entry point (vLLM 0.33.0, declared in
  pyproject.toml) that puts Zepp's placement policy behind EPLB's ``default`` policy (the file's
  placement first, then Zepp's placement re-planned from vLLM's load window at each rebalance)
  and writes each rank's ``logical_to_physical_map`` / ``logical_replica_count`` rows after every
  rearrangement; ``vllm_policy`` holds the policy.

``import zepp`` imports none of this; these modules import an engine only inside the functions
the engine calls. ``launch_lines`` says how each engine is started with the files.
"""

from __future__ import annotations

__all__ = ["launch_lines", "VLLM_TABLE_ENV", "PINNED"]

VLLM_TABLE_ENV = "ZEPP_VLLM_TABLE"  # the table file the vLLM plug-in reads (unset: the plug-in does nothing)
PINNED = {"sglang": "0.5.23", "vllm": "0.33.0"}  # the versions the plug-ins are tested against (tests/engines)


def launch_lines(fmt: str, placement: str, table: str, redundant: int, nodes: int, gpus_per_node: int,
                 decode: bool) -> list[str]:
    """How engine ``fmt`` is started on node ``R`` of ``nodes`` (``HEAD`` the first node's address)
    with ``zepp place``'s placement file and table file (``decode``: a decode deployment's table,
    DeepEP's low-latency kernels; else a prefill one's, its normal kernels)."""
    ranks = nodes * gpus_per_node
    if fmt == "sglang":
        hooks = ('[{"name": "zepp", "target_modules": ["model"], "hook_factory": "zepp.engines.sglang_hook:'
                 'dispatch_table", "config": {"table": "' + table + '"}}]')
        return [f"SGLang {PINNED['sglang']}, on node R of {nodes}: python -m sglang.launch_server --model-path MODEL "
                f"--tp {ranks} --ep-size {ranks} --nnodes {nodes} --node-rank R --dist-init-addr HEAD:5000 "
                f"--moe-a2a-backend deepep --deepep-mode auto --ep-num-redundant-experts {redundant} "
                f"--init-expert-location {placement} --ep-dispatch-algorithm static --forward-hooks '{hooks}'",
                "  (without --enable-eplb: a rebalance would replace both the placement and the table)"]
    backend = "deepep_low_latency" if decode else "deepep_high_throughput"
    return [f"vLLM {PINNED['vllm']}, on node R of {nodes}: {VLLM_TABLE_ENV}={table} vllm serve MODEL "
            f"--data-parallel-size {ranks} --data-parallel-size-local {gpus_per_node} --data-parallel-address HEAD "
            f"--data-parallel-rpc-port 13345 --enable-expert-parallel --all2all-backend {backend} --enable-eplb "
            f"--eplb-config '{{\"num_redundant_experts\": {redundant}}}' (nodes R > 0 add --headless "
            f"--data-parallel-start-rank {gpus_per_node}*R)",
            "  (pip install zepp in vLLM's environment: its vllm.general_plugins entry point installs Zepp's policy "
            "and rows; the file's placement is applied at the first step, then re-planned from vLLM's load window)"]
