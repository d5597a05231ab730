"""Formats of neighbouring systems: read their dumps, write placements they can load.

- :mod:`zepp.interop.sglang`: SGLang's ``--init-expert-location`` files
  (``physical_to_logical_map [layers, P]`` or ``logical_count [layers, E]``) and its expert
  distribution recorder dumps (``logical_count``, ``topk_ids_of_layer``).
"""
