"""Entry point of a rank process started by ``EmulatedCluster.call``.

``python -m zepp.emulate.call_rank module:function '<json kwargs>' OUTDIR`` imports the function,
calls it with the keyword arguments (the rank's identity is in the environment: RANK,
WORLD_SIZE, ...), and writes its JSON-serialisable return value to ``OUTDIR/result{RANK}.json``.
Any exception ends the process with exit code 1 and the traceback on stderr.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(argv: list[str]) -> int:
    target, kwargs_json, outdir = argv
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    result = fn(**json.loads(kwargs_json))
    path = os.path.join(outdir, f"result{int(os.environ['RANK'])}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
