"""Entry point of a ``zepp generate --emulate`` rank: the serving rank plus interface counters.

``python -m zepp.emulate.serve_rank CONFIG.json`` runs ``zepp.serve.rank`` (same config, same
exit codes) inside the rank's network namespace, with the kernel byte counters of this rank's
own interfaces (``zepp.emulate.counters.read_own_counters``: ``[nic_tx, nic_rx, nvlink_tx]``)
as the generation's probe: read at the start, after prefill and at the end of each system, so
the report holds the wire bytes each NIC carried (``wire_nic_tx_bytes``).
"""

from __future__ import annotations

import sys

from zepp.emulate.counters import read_own_counters
from zepp.serve.rank import main as serve_main


def main(argv: list[str] | None = None) -> int:
    return serve_main(sys.argv[1:] if argv is None else argv, probe=read_own_counters)


if __name__ == "__main__":
    sys.exit(main())
