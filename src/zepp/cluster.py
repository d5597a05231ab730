"""Cluster shapes and the hardware figures a cost model needs.

A cluster is ``nodes`` nodes of ``gpus_per_node`` GPUs. Ranks are numbered node-major:
rank ``r`` lives on node ``r // gpus_per_node`` at local index ``r % gpus_per_node``.
Every GPU has its own NIC; NVLink connects every pair of GPUs inside a node.

The presets take their figures from PAPER.md sections 3, 5 and 7 (``a100``, ``h100``: the
paper's 4-GPU testbeds) and section 5 for today's 8-GPU NVSwitch nodes (``h100-8``, ``h200-8``)
and GB200 NVL72 (``gb200-nvl72``, one 72-GPU NVLink domain); :func:`load_cluster_file` reads a
user's own from YAML or JSON. The grouped-GEMM figures the simulator uses per preset (efficiency
curve ``gemm_eff_max`` / ``gemm_rows_half``, ``weight_read_eff``) are ``zepp.sim.calibrate.HARDWARE``'s,
from PAPER.md section 7 and our H200 measurement (``benchmarks/results/gpu_gemm_h200.md``); the
fields below are the plain defaults a cluster file starts from. The network costs the paper-testbed simulation fits
(per-put cost growing with the rank count, achieved NIC efficiency) live in
``zepp.sim.calibrate.FITTED`` (today's presets: DeepEP's published figures, ``zepp.sim.calibrate.PUBLISHED``), not here: ``nvlink_msg_cost`` and ``nic_msg_cost`` are the flat
per-message costs used where no such fit applies (the emulated cluster's model, which measures
them with ``zepp.emulate.linkcal``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zepp.errors import ZeppInputError
from zepp.files import read_structured

# figures that must be positive (a zero bandwidth or peak would divide by zero)
_POSITIVE_FIELDS = ("nvlink_bw", "nic_bw", "peak_flops", "hbm_bw", "gemm_eff_max", "weight_read_eff", "sms")


@dataclass(frozen=True)
class Cluster:
    """A GPU cluster shape plus link, compute and fixed-cost figures.

    Rates are in bytes per second, times in seconds.
    """

    name: str
    nodes: int
    gpus_per_node: int = 4
    nvlink_bw: float = 72e9  # achieved bytes/s per direction per GPU pair
    nic_bw: float = 25e9  # bytes/s per direction per NIC (one NIC per GPU)
    nvlink_msg_cost: float = 10e-6  # fixed seconds per NVLink message
    nic_msg_cost: float = 20e-6  # fixed seconds per NIC message
    peak_flops: float = 312e12  # dense BF16 FLOP/s per GPU
    hbm_bw: float = 1.555e12  # bytes/s per GPU
    gemm_eff_max: float = 0.5  # asymptotic fraction of peak a grouped GEMM reaches
    gemm_rows_half: float = 64.0  # rows per expert at which efficiency is half its max
    kernel_launch: float = 10e-6  # fixed seconds per kernel (GEMM, reduce)
    weight_read_eff: float = 1.0  # fraction of hbm_bw a grouped GEMM streams its weights at
    sms: int = 108  # streaming multiprocessors per GPU (what communication kernels take from GEMMs)
    weight_copy_bw: float | None = None  # bytes/s for NVLink weight copies (None: nvlink_bw)
    # the fields a cluster file set (``load_cluster_file``): the simulator keeps these as given
    # instead of its calibration's figures (``zepp.sim.calibrate.on_network``)
    given: frozenset = dataclasses.field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if int(self.nodes) != self.nodes or self.nodes < 1:
            raise ZeppInputError(f"cluster {self.name!r}: nodes must be a positive integer, got {self.nodes!r}")
        if int(self.gpus_per_node) != self.gpus_per_node or self.gpus_per_node < 1:
            raise ZeppInputError(
                f"cluster {self.name!r}: gpus_per_node must be a positive integer, got {self.gpus_per_node!r}"
            )
        for field in _POSITIVE_FIELDS:
            if not getattr(self, field) > 0:
                raise ZeppInputError(f"cluster {self.name!r}: {field} must be positive, got {getattr(self, field)!r}")

    @property
    def ranks(self) -> int:
        """Total GPU count ``R = nodes * gpus_per_node``."""
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: np.ndarray | int) -> np.ndarray | int:
        """Node index of each rank (same shape as ``rank``)."""
        return rank // self.gpus_per_node

    def local_of(self, rank: np.ndarray | int) -> np.ndarray | int:
        """Local GPU index inside its node of each rank (same shape as ``rank``)."""
        return rank % self.gpus_per_node

    def gemm_efficiency(self, rows_per_expert: np.ndarray | float) -> np.ndarray | float:
        """Fraction of peak FLOP/s a grouped GEMM reaches at this many rows per expert."""
        rows = np.asarray(rows_per_expert, dtype=np.float64)
        return self.gemm_eff_max * rows / (rows + self.gemm_rows_half)

    def with_(self, **changes) -> "Cluster":
        """A copy with some fields replaced (``cluster.with_(nodes=8)``)."""
        return dataclasses.replace(self, **changes)


_PRESETS: dict[str, dict] = {
    # 4x A100-SXM4-40GB per node, NVLink3 (NCCL send/recv ~72 GB/s per pair),
    # one Slingshot-11 NIC per GPU at 25 GB/s per direction.
    "a100": dict(nvlink_bw=72e9, nic_bw=25e9, peak_flops=312e12, hbm_bw=1.555e12, sms=108),
    # 4x H100-96GB (GH200) per node, NVLink4; the same Slingshot-11 NICs.
    # 370 GB/s per GPU in NCCL on NVSwitch boards; on a 4-GPU board a GPU talks to 3 peers.
    "h100": dict(nvlink_bw=370e9 / 3, nic_bw=25e9, peak_flops=989e12, hbm_bw=4.0e12, sms=132),
    # Today's hardware. 8-GPU NVSwitch nodes with one NDR 400 Gb/s NIC per GPU:
    # PAPER.md section 5: "NDR 400 Gb/s NIC: about 45-48 GB/s achieved" (46 GB/s here) and
    # "H100 NVLink4: about 370 GB/s effective per GPU in NCCL on 8-GPU NVSwitch boards", shared by
    # a GPU's 7 peers when all talk at once (nvlink_bw is per pair, as for the 4-GPU presets).
    # Peak BF16 and HBM bandwidth: the vendors' public specifications (not in PAPER.md).
    "h100-8": dict(gpus_per_node=8, nvlink_bw=370e9 / 7, nic_bw=46e9, peak_flops=989e12, hbm_bw=3.35e12, sms=132),
    # H200: the same NVLink4 / NVSwitch board and NICs as H100; HBM3e 4.8 TB/s.
    "h200-8": dict(gpus_per_node=8, nvlink_bw=370e9 / 7, nic_bw=46e9, peak_flops=989e12, hbm_bw=4.8e12, sms=132),
    # GB200 NVL72: 72 GPUs in one NVLink domain (one "node" of 72 GPUs), NVLink5 at 1.8 TB/s per GPU
    # nominal, twice NVLink4's 900 GB/s: we assume twice NVLink4's achieved 370 GB/s (740 GB/s per GPU,
    # shared by 71 peers); an NDR 400 Gb/s NIC per GPU between racks (PAPER.md section 5, 46 GB/s).
    # PAPER.md has no measured GB200 figure: these are assumptions, override them with --cluster-file.
    "gb200-nvl72": dict(gpus_per_node=72, nvlink_bw=740e9 / 71, nic_bw=46e9, peak_flops=2.5e15, hbm_bw=8.0e12,
                        sms=148),
}
_DEFAULT_GPUS_PER_NODE = 4

PRESET_NAMES = tuple(_PRESETS)

_FIELDS = {f.name: f for f in dataclasses.fields(Cluster) if f.name != "given"}

# What each number of a cluster file means and the range it must lie in: (low, high, low open,
# unit and meaning). A bandwidth outside its range is a typo (bits for bytes, a missing
# exponent), not hardware; an efficiency is a fraction of peak; a fixed cost is per message or
# kernel, below 10 ms.
FIELD_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "nodes": (1, 4096, False, "nodes of the cluster"),
    "gpus_per_node": (1, 1024, False, "GPUs per node"),
    "nvlink_bw": (1e6, 1e14, False, "bytes/s per direction per GPU pair"),
    "nic_bw": (1e5, 1e13, False, "bytes/s per direction per NIC"),
    "weight_copy_bw": (1e6, 1e14, False, "bytes/s of NVLink weight copies (null: nvlink_bw)"),
    "nvlink_msg_cost": (0.0, 1e-2, False, "seconds per NVLink message"),
    "nic_msg_cost": (0.0, 1e-2, False, "seconds per NIC message"),
    "peak_flops": (1e9, 1e18, False, "dense FLOP/s per GPU"),
    "hbm_bw": (1e9, 1e14, False, "bytes/s of GPU memory"),
    "gemm_eff_max": (0.0, 1.0, True, "fraction of peak FLOP/s a grouped GEMM reaches"),
    "gemm_rows_half": (0.0, 1e6, True, "rows per expert at half the GEMM efficiency"),
    "kernel_launch": (0.0, 1e-2, False, "seconds per kernel launch"),
    "weight_read_eff": (0.0, 1.0, True, "fraction of hbm_bw a grouped GEMM streams its weights at"),
    "sms": (1, 10**5, False, "streaming multiprocessors per GPU"),
}


def field_ranges_markdown() -> str:
    """The README's table of cluster-file fields (``FIELD_RANGES``): name, range, meaning."""
    rows = ["| field | range | meaning |", "| --- | --- | --- |"]
    for key, (lo, hi, lo_open, what) in FIELD_RANGES.items():
        rows.append(f"| `{key}` | {'(' if lo_open else '['}{lo:g}, {hi:g}] | {what} |")
    return "\n".join(rows) + "\n"
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def cluster_preset(name: str, nodes: int, gpus_per_node: int | None = None, **overrides) -> Cluster:
    """The named hardware preset at ``nodes`` nodes. ``gpus_per_node`` defaults to the preset's
    board (4 for ``a100``/``h100``, 8 for ``h100-8``/``h200-8``, 72 for ``gb200-nvl72``)."""
    if name not in _PRESETS:
        raise ZeppInputError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    fields = dict(_PRESETS[name])
    default_l = fields.pop("gpus_per_node", _DEFAULT_GPUS_PER_NODE)
    fields.update(overrides)
    return Cluster(name=name, nodes=nodes, gpus_per_node=default_l if gpus_per_node is None else gpus_per_node,
                   **fields)


def preset_gpus_per_node(name: str) -> int:
    """The GPUs per node of preset ``name``'s board."""
    if name not in _PRESETS:
        raise ZeppInputError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    return int(_PRESETS[name].get("gpus_per_node", _DEFAULT_GPUS_PER_NODE))


def load_cluster_file(path, nodes: int | None = None, gpus_per_node: int | None = None,
                      default_nodes: int | None = None) -> Cluster:
    """A :class:`Cluster` from a YAML or JSON file holding the preset's fields.

    Fields are those of :class:`Cluster` (``nvlink_bw``, ``nic_bw``, ``peak_flops``, ...; rates
    in bytes/s, times in seconds), plus optional ``base`` (a preset whose figures the file
    overrides) and ``name``. ``nodes`` / ``gpus_per_node`` given here fill in what the file
    leaves out; one that disagrees with the file is refused (the same file means one cluster).
    ``default_nodes``: the node count when neither gives one. An unknown field, a wrong type or
    a value outside its range (``FIELD_RANGES``) is one error naming the field.
    """
    p = Path(path)  # read_structured checks it is a regular file (zepp.files)
    obj = _read_mapping(p)
    base = obj.get("base")
    fields = _base_fields(p, base)
    given = set()
    for key, value in obj.items():
        if key != "base":
            fields[key] = _field_value(p, key, value)
            given.add(key)
    for key, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if value is not None and key in given and fields[key] != value:
            raise ZeppInputError(f"{p}: field {key!r} is {fields[key]}, but --{key.replace('_', '-')} says {value}; "
                                 f"drop one of them")
        if value is not None:
            fields[key] = value
    if "nodes" not in fields and default_nodes is not None:
        fields["nodes"] = default_nodes
    if "nodes" not in fields:
        raise ZeppInputError(f"{p}: field 'nodes' is missing; add it or pass --nodes")
    fields.setdefault("name", str(base or p.stem))
    return Cluster(**fields, given=frozenset(given))


def _read_mapping(p: Path) -> dict:
    """The mapping a cluster file holds (JSON by suffix, else YAML; ``zepp.files`` rules)."""
    obj = read_structured(p, "cluster file", ".yaml, .yml or .json")
    if not isinstance(obj, dict):
        raise ZeppInputError(f"{p}: must be a mapping of cluster fields (name: value), got {type(obj).__name__}; "
                             f"write one field per line")
    return obj


def _base_fields(p: Path, base) -> dict:
    """The figures of preset ``base`` (none when ``base`` is ``None``)."""
    fields: dict = {}
    if base is not None:
        if not isinstance(base, str) or base not in _PRESETS:
            raise ZeppInputError(f"{p}: field 'base': unknown preset {repr(base)[:60]}; choose one of {', '.join(PRESET_NAMES)}")
        fields.update(_PRESETS[base])
        fields.setdefault("gpus_per_node", _DEFAULT_GPUS_PER_NODE)
    return fields


def _field_value(p: Path, key: str, value):
    """``value`` of cluster field ``key`` from file ``p``, checked (numbers written as strings parsed)."""
    if key not in _FIELDS:
        raise ZeppInputError(f"{p}: unknown field {key!r}; cluster fields are {', '.join(_FIELDS)} (and base)")
    if key == "name":
        if not isinstance(value, str) or not value.strip() or len(value) > 100 or not value.isprintable():
            raise ZeppInputError(f"{p}: field 'name' must be a non-empty one-line string of printable characters "
                                 f"(no control characters), got {value!r}"[:300])
        return value
    if value is None and key == "weight_copy_bw":
        return value
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 5.0e10 (no exponent sign) as a string
    lo, hi, lo_open, what = FIELD_RANGES[key]
    integer = key in ("nodes", "gpus_per_node", "sms")
    good = not isinstance(value, bool) and isinstance(value, (int, float)) and abs(value) < 1e300 \
        and math.isfinite(value)
    good = good and (not integer or isinstance(value, int)) and (value > lo if lo_open else value >= lo) and value <= hi
    if not good:
        kind = "a positive integer" if integer else "a finite number"
        raise ZeppInputError(f"{p}: field {key!r} must be {kind} in {'(' if lo_open else '['}{lo:g}, {hi:g}] "
                             f"({what}), got {repr(value)[:60]}; fix the file")
    return value
