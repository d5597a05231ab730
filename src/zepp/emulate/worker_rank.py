"""Entry point of a ``zepp run --emulate`` rank: the runtime worker plus interface counters.

``python -m zepp.emulate.worker_rank CONFIG.json OUTDIR`` runs ``zepp.runtime.worker`` (same
config, same exit codes) inside the rank's network namespace with ``CounterHooks``, which
record the kernel byte counters of this rank's own interfaces
(``/sys/class/net/{nic,nv*}/statistics``: the namespace sees only its own) before every MoE
layer call, so the launcher can report the bytes each NIC really carried per system next to
the planner's accounting. Writes ``OUTDIR/counters{RANK}.json`` (``seq``: the call's position
among all layer calls of the rank)::

    {"layers": [layer creation order -> {"system", "calls": [[seq, nic_tx, nic_rx, nvlink_tx], ...]}],
     "final": [nic_tx, nic_rx, nvlink_tx]}

Snapshot ``i`` of a layer is taken right before its ``i``-th call, which the worker begins
right after a barrier: every byte of every earlier layer call has been received by then (so it
has also left its sender's NIC). The bytes of call ``c`` are the difference between its
snapshot and the next snapshot on this rank (the next call of any layer, or ``final``, taken
after a barrier before the worker's closing exchange of results). That window holds the layer
(metadata all-gather, dispatch, combine), one barrier and the TCP acknowledgements; nothing else.

Layers are numbered in creation order, which is the order of ``cfg["systems"]`` (interleaved or
not, the worker creates one layer per system in that order).

Fault hook (tests): env ``ZEPP_EMULATE_NIC_FAULT=RANK:CALL`` makes rank ``RANK`` create
``OUTDIR/nic_fault`` right before its layer call number ``CALL`` (counting every layer) and
then wait a moment, so the launcher can take the node's NICs down in the middle of that layer.
"""

from __future__ import annotations

import json
import os
import sys
import time

from zepp.emulate.counters import read_own_counters
from zepp.runtime.case import RunHooks
from zepp.runtime.rank_process import read_config
from zepp.runtime.worker import default_config, run_in_process


class CounterHooks(RunHooks):
    """Interface counters around every layer call (see the module docstring)."""

    def __init__(self, rank: int, outdir: str, fault: tuple[int, int] | None = None):
        self.rank, self.outdir, self.fault = rank, outdir, fault
        self.layers: list[dict] = []
        self.calls = 0
        self.final: list[int] | None = None

    def on_layer_created(self, index: int, system: str) -> None:
        self.layers.append({"system": system, "calls": []})

    def on_layer_call(self, index: int, system: str, it: int) -> None:
        self.layers[index]["calls"].append([self.calls, *read_own_counters()])
        if self.fault is not None and self.fault == (self.rank, self.calls):
            with open(os.path.join(self.outdir, "nic_fault"), "w") as f:
                f.write(str(self.rank))
            time.sleep(0.5)  # the launcher takes the NICs down now, in the middle of this layer
        self.calls += 1

    def before_final_gather(self) -> None:
        import torch.distributed as dist

        dist.barrier()  # every layer's bytes have landed everywhere
        self.final = read_own_counters()

    def write(self) -> None:
        path = os.path.join(self.outdir, f"counters{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"layers": self.layers, "final": self.final or read_own_counters()}, f)
        os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m zepp.emulate.worker_rank CONFIG.json OUTDIR", file=sys.stderr)
        return 2
    cfg = read_config(argv[:1], default_config(), "zepp.emulate.worker_rank")
    fault = os.environ.get("ZEPP_EMULATE_NIC_FAULT")
    hooks = CounterHooks(int(os.environ.get("RANK", "0")), argv[1],
                         tuple(int(v) for v in fault.split(":")) if fault else None)
    code = run_in_process(cfg, hooks)
    hooks.write()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
