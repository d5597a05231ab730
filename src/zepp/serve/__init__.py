"""Serve a Hugging Face MoE checkpoint expert-parallel with zepp (``zepp generate``).

Data-parallel attention, expert-parallel MoE: every rank holds the non-expert weights and the
expert weights of its own slots, runs its own requests, and every sparse MoE block moves its
rows with a zepp system (any registry row the runtime supports).

- ``checkpoint.py``: tensor-by-tensor safetensors reading (a rank reads only what it needs);
- ``moe_blocks.py``: module surgery, ``ExpertParallelMoE`` replacing each sparse MoE block;
- ``comm.py``: ``ExpertParallel``, the one communication object of the process (one Dispatcher);
- ``loader.py``: ``load_expert_parallel`` builds a rank's model;
- ``engine.py``: dealing requests, prefill and greedy decode with the model's KV cache, swaps;
- ``rank.py``: one rank (``python -m zepp.serve.rank CONFIG``; started by ``zepp generate``,
  ``zepp.cli.generate``, through ``zepp.launch.ranks``); ``reference.py``: plain ``transformers`` generate;
- ``tiny.py``: random-init checkpoints for tests and benchmarks.

Needs the ``serve`` extra (``pip install -e '.[serve]'``: transformers 5, safetensors).
"""

__all__ = ["ExpertParallel", "load_expert_parallel", "generate_rank", "deal"]


def __getattr__(name):
    if name == "ExpertParallel":
        from zepp.serve.comm import ExpertParallel

        return ExpertParallel
    if name == "load_expert_parallel":
        from zepp.serve.loader import load_expert_parallel

        return load_expert_parallel
    if name in ("generate_rank", "deal"):
        from zepp.serve import engine

        return getattr(engine, name)
    raise AttributeError(name)
