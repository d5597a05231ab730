"""Entry point of a ``zepp run --emulate`` rank: the runtime worker plus interface counters.

``python -m zepp.emulate.rankrun CONFIG.json OUTDIR`` runs ``zepp.runtime.worker`` unchanged
(same config, same exit codes) inside the rank's network namespace, and records the kernel byte
counters of this rank's own interfaces (``/sys/class/net/{nic,nv*}/statistics``: the namespace
sees only its own) around every MoE layer call, so the launcher can report the bytes each NIC
really carried per system next to the planner's accounting. Writes ``OUTDIR/counters{RANK}.json`` (``seq``: the call's position among all layer calls of the rank)::

    {"layers": [layer creation order -> {"calls": [[seq, nic_tx, nic_rx, nvlink_tx], ...]}],
     "final": [nic_tx, nic_rx, nvlink_tx]}

Snapshot ``i`` of a layer is taken at the start of its ``i``-th call, which the worker begins
right after a barrier: every byte of every earlier layer call has been received by then (so it
has also left its sender's NIC). The bytes of call ``c`` are the difference between its
snapshot and the next snapshot on this rank (the next call of any layer, or ``final``, taken
after a barrier before the worker's closing all-gather). That window holds the layer (metadata
all-gather, dispatch, combine), one barrier and the TCP acknowledgements; nothing else.

Layers are numbered in creation order, which is the order of ``cfg["systems"]`` (interleaved or
not, the worker creates one layer per system in that order).

Fault hook (tests): env ``ZEPP_EMULATE_NIC_FAULT=RANK:CALL`` makes rank ``RANK`` create
``OUTDIR/nic_fault`` at the start of its layer call number ``CALL`` (counting every layer) and
then wait a moment, so the launcher can take the node's NICs down in the middle of that layer.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _read_counters() -> list[int]:
    base = "/sys/class/net"
    out = [0, 0, 0]
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            if name == "nic":
                with open(f"{base}/nic/statistics/tx_bytes") as f:
                    out[0] = int(f.read())
                with open(f"{base}/nic/statistics/rx_bytes") as f:
                    out[1] = int(f.read())
            elif name.startswith("nv"):
                with open(f"{base}/{name}/statistics/tx_bytes") as f:
                    out[2] += int(f.read())
        except OSError:
            pass
    return out


def main(argv: list[str]) -> int:
    cfg_path, outdir = argv
    import torch.distributed as dist

    from zepp.runtime import moe, worker

    rank = int(os.environ.get("RANK", "0"))
    layers: list[dict] = []
    ncalls = [0]
    fault = os.environ.get("ZEPP_EMULATE_NIC_FAULT")
    fault_rank, fault_call = (int(v) for v in fault.split(":")) if fault else (-1, -1)

    orig_init, orig_forward = moe.MoELayer.__init__, moe.MoELayer.forward

    def init(self, *a, **kw):
        orig_init(self, *a, **kw)
        self._zepp_emulate_index = len(layers)
        layers.append({"calls": []})

    def forward(self, *a, **kw):
        layers[self._zepp_emulate_index]["calls"].append([ncalls[0], *_read_counters()])
        if rank == fault_rank and ncalls[0] == fault_call:
            with open(os.path.join(outdir, "nic_fault"), "w") as f:
                f.write(str(rank))
            time.sleep(0.5)  # the launcher takes the NICs down now, in the middle of this layer
        ncalls[0] += 1
        return orig_forward(self, *a, **kw)

    orig_gather = dist.all_gather_object
    final: list = []

    def gather(*a, **kw):
        if not final:  # the worker's closing all-gather: every layer's bytes have landed
            dist.barrier()
            final.append(_read_counters())
        return orig_gather(*a, **kw)

    moe.MoELayer.__init__, moe.MoELayer.forward = init, forward
    dist.all_gather_object = gather
    cfg = worker.default_config()
    with open(cfg_path) as f:
        cfg.update(json.load(f))
    code = worker.run_in_process(cfg)
    path = os.path.join(outdir, f"counters{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"layers": layers, "final": final[0] if final else _read_counters()}, f)
    os.replace(path + ".tmp", path)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
