"""SGLang's ``--forward-hooks`` factory that installs Zepp's static dispatch table (SGLang 0.5.23).

SGLang imports ``hook_factory`` in every model-runner process after the model is loaded (and
after its CUDA graphs are captured) and calls it with the spec's ``config``. The factory reads the
table file (``config["table"]``, written by ``zepp place --format sglang``), checks that SGLang's
expert-location metadata holds the placement the table was planned for (``--init-expert-location``
with the placement file written beside it) and that SGLang runs the static dispatch, and writes
this rank's rows into ``logical_to_rank_dispatch_physical_map`` in place: SGLang's dispatch (and
the captured graphs, which read the same tensor) then send each expert's entries to the copy
Zepp's table names. The hook it returns does nothing. An EPLB rebalance (``--enable-eplb``)
replaces the placement and the map with SGLang's own; the table is then gone.
"""

from __future__ import annotations

import numpy as np

from zepp.errors import ZeppInputError

__all__ = ["dispatch_table", "install"]


def _rank(ep_size: int) -> int:
    """This process's EP rank: SGLang's runtime context, else the world rank modulo the EP size."""
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().moe_ep_rank)
    except (ImportError, AttributeError):
        import torch.distributed as dist

        return dist.get_rank() % ep_size


def install(metadata, table: dict, rank: int) -> int:
    """Write rank ``rank``'s rows of ``table`` (``zepp.interop.engine_tables.read_tables``) into
    SGLang's ``metadata`` in place; returns the number of layers written."""
    import torch

    held = metadata.logical_to_rank_dispatch_physical_map
    if held is None:
        raise ZeppInputError("zepp's SGLang table needs --ep-dispatch-algorithm static (SGLang keeps no static map "
                             "otherwise)")
    if metadata.ep_size != table["ep_size"] or not 0 <= rank < table["ep_size"]:
        raise ZeppInputError(f"zepp's SGLang table was planned for EP size {table['ep_size']}, SGLang runs "
                             f"{metadata.ep_size} (rank {rank})")
    p2l = metadata.physical_to_logical_map_cpu.numpy()
    for i, layer in enumerate(table["layers"]):
        if layer >= p2l.shape[0] or not np.array_equal(p2l[layer], table["physical_to_logical_map"][i]):
            raise ZeppInputError(f"SGLang's placement of layer {layer} is not the one zepp's table was planned for; "
                                 f"start SGLang with --init-expert-location set to the placement file written with "
                                 f"the table (and without --enable-eplb)")
    rows = torch.as_tensor(table["logical_to_rank_dispatch_physical_map"][rank], dtype=held.dtype)
    held[table["layers"]] = rows.to(held.device)
    return len(table["layers"])


def dispatch_table(config: dict):
    """The ``--forward-hooks`` factory: install the table of ``config["table"]`` on this rank."""
    from zepp.interop.engine_tables import read_tables

    if not isinstance(config, dict) or not isinstance(config.get("table"), str):
        raise ZeppInputError('zepp.engines.sglang_hook:dispatch_table needs "config": {"table": "<the .zepp-table '
                             'file zepp place wrote>"}')
    table = read_tables(config["table"])
    if table["zepp_table"] != "sglang":
        raise ZeppInputError(f"{config['table']}: a {table['zepp_table']} table, not an SGLang one")
    from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

    metadata = get_global_expert_location_metadata()
    if metadata is None:
        raise ZeppInputError("SGLang has no expert-location metadata: start it with --init-expert-location and an EP "
                             "size above 1")
    install(metadata, table, _rank(metadata.ep_size))
    return _no_op


def _no_op(module, inputs, output):
    return None
