"""The objects the planner hands from stage to stage: Placement, Routing and FlowPlan.

Shapes used throughout (all numpy arrays):

- ``R`` ranks (GPUs), node-major: rank ``r`` is on node ``r // L`` (``L`` GPUs per node).
- ``S`` slots per rank; the global (physical) slot id of local slot ``s`` on rank ``r`` is
  ``r * S + s``.
- ``E`` logical experts, ``T`` tokens per rank, ``k`` experts per token.
- A batch is ``topk_ids [R, T, k]``: the expert ids of the tokens each rank holds. An id of
  ``-1`` marks a missing entry (padding: a token whose ids are all ``-1`` is absent, which is how
  ranks hold different numbers of tokens); a missing entry has slot ``-1`` and moves no row.

This module owns the plan objects, the replica-load bounds and the routing's invariants
(``Routing.validate``; ``FlowPlan.validate`` runs ``zepp.planner.validation``); a plan's counts
and link accounting are ``zepp.planner.volumes``'. The flat,
deduplicated view of a routing that the flow builders and the validation read is
``zepp.planner.flows.entry_view.EntryView``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from zepp.errors import ZeppInputError


class PlanInvariantError(AssertionError):
    """A plan broke one of its invariants (a bug in the planner, never bad user input)."""


@dataclass(frozen=True)
class Placement:
    """Which logical expert each slot holds.

    ``slot_expert [R, S]`` int32: logical expert in each slot, ``-1`` for an empty slot.
    """

    slot_expert: np.ndarray
    num_experts: int
    gpus_per_node: int
    replicas: np.ndarray = field(init=False, repr=False)
    replica_count: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        se = np.asarray(self.slot_expert)
        if se.ndim != 2:
            raise ZeppInputError(f"slot_expert must be [ranks, slots], got shape {se.shape}")
        if se.shape[0] % self.gpus_per_node:
            raise ZeppInputError(
                f"slot_expert has {se.shape[0]} ranks, not a multiple of gpus_per_node={self.gpus_per_node}"
            )
        se = se.astype(np.int32)
        if se.size and (se.min() < -1 or se.max() >= self.num_experts):
            raise ZeppInputError(f"slot_expert holds ids outside [-1, {self.num_experts})")
        flat = se.ravel()
        count = np.bincount(flat[flat >= 0], minlength=self.num_experts).astype(np.int32)
        missing = np.flatnonzero(count == 0)
        if missing.size:
            raise ZeppInputError(
                f"placement has no replica of expert(s) {missing[:8].tolist()}; every expert needs a slot"
            )
        # replicas [E, c_max]: global slot ids of each expert's replicas, ascending, -1 padded.
        slots = np.flatnonzero(flat >= 0)
        order = np.argsort(flat[slots], kind="stable")
        slots = slots[order]
        experts = flat[slots]
        starts = np.concatenate(([0], np.cumsum(count)[:-1]))
        rank_in_expert = np.arange(slots.size) - starts[experts]
        replicas = np.full((self.num_experts, int(count.max())), -1, dtype=np.int32)
        replicas[experts, rank_in_expert] = slots
        object.__setattr__(self, "slot_expert", se)
        object.__setattr__(self, "replicas", replicas)
        object.__setattr__(self, "replica_count", count)

    @property
    def ranks(self) -> int:
        return self.slot_expert.shape[0]

    @property
    def slots_per_rank(self) -> int:
        return self.slot_expert.shape[1]

    @property
    def nodes(self) -> int:
        return self.ranks // self.gpus_per_node

    def validate(self) -> None:
        """Placements are checked on construction; kept for a uniform interface."""


@dataclass(frozen=True)
class Routing:
    """Which replica serves each entry.

    ``slot [R, T, k]`` int32: global slot id (``rank * S + local``) serving each entry of
    ``topk_ids [R, T, k]``. The computing rank of an entry is ``slot // S``.
    """

    topk_ids: np.ndarray
    slot: np.ndarray
    placement: Placement
    relaxation: float | None = None  # C; when set, validate() checks the replica-load bounds

    @property
    def compute_rank(self) -> np.ndarray:
        """``[R, T, k]`` rank that computes each entry (``-1`` for a missing entry)."""
        return self.slot // self.placement.slots_per_rank

    def slot_loads(self) -> np.ndarray:
        """``[R * S]`` entries served by each global slot."""
        s = self.slot.ravel()
        return np.bincount(s[s >= 0], minlength=self.placement.slot_expert.size)

    def rows_per_rank(self) -> np.ndarray:
        """``[R]`` GEMM rows (entries) each rank computes."""
        s = self.slot.ravel()
        return np.bincount(s[s >= 0] // self.placement.slots_per_rank, minlength=self.placement.ranks)

    def validate(self) -> None:
        """Prove: every entry is served by a replica of its own expert, exactly once (one slot
        per entry by construction of the array); with a relaxation ``C``, every replica's load lies
        in ``[floor((1-C) q_e), ceil((1+C) q_e)]`` where ``q_e = D_e / c_e``."""
        p = self.placement
        if self.slot.shape != self.topk_ids.shape:
            raise PlanInvariantError(f"slot shape {self.slot.shape} != topk_ids shape {self.topk_ids.shape}")
        if self.slot.shape[0] != p.ranks:
            raise PlanInvariantError(f"routing has {self.slot.shape[0]} ranks, placement {p.ranks}")
        flat_slot = self.slot.ravel()
        ids = self.topk_ids.ravel()
        missing = ids < 0
        if np.any((flat_slot < 0) != missing):
            i = int(np.flatnonzero((flat_slot < 0) != missing)[0])
            raise PlanInvariantError(f"entry {i}: expert id {ids[i]} but slot {flat_slot[i]}; exactly the missing "
                                     f"entries (id -1) must have slot -1")
        if flat_slot.size and flat_slot.max() >= p.slot_expert.size:
            raise PlanInvariantError("an entry is routed to a slot id out of range")
        served = np.where(missing, -1, p.slot_expert.ravel()[np.maximum(flat_slot, 0)])
        wrong = np.flatnonzero(served != ids)
        if wrong.size:
            i = wrong[0]
            raise PlanInvariantError(
                f"{wrong.size} entries served by a slot of another expert; first: entry {i} wants expert "
                f"{self.topk_ids.ravel()[i]}, slot {flat_slot[i]} holds {served[i]}"
            )
        if self.relaxation is None:
            return
        lo, hi = replica_bounds(self.topk_ids, p, self.relaxation)
        load = self.slot_loads()
        used = p.slot_expert.ravel() >= 0
        bad = np.flatnonzero(used & ((load < lo) | (load > hi)))
        if bad.size:
            s = bad[0]
            raise PlanInvariantError(
                f"{bad.size} replicas outside their load bounds; first: slot {s} (expert "
                f"{p.slot_expert.ravel()[s]}) has {load[s]} entries, bounds [{lo[s]}, {hi[s]}]"
            )


def relaxation_fraction(relaxation: float) -> tuple[int, int]:
    """``C`` as an exact fraction ``(num, den)`` with ``den = 10**6``, so bounds are integer math."""
    if not 0 <= relaxation < 1e6:
        raise ZeppInputError(f"relaxation C must be >= 0, got {relaxation!r}")
    return int(round(relaxation * 10**6)), 10**6


def expert_load_bounds(demand: np.ndarray, count: np.ndarray, relaxation: float) -> tuple[np.ndarray, np.ndarray]:
    """Per expert, the replica-load bounds ``floor((1-C) D/c)`` (never negative) and
    ``ceil((1+C) D/c)`` of demand ``D = demand [M]`` over ``c = count [M]`` replicas (int64 each);
    returns ``(lower [M], upper [M])``. Integer arithmetic only, in operators numpy arrays and torch
    tensors share, so the torch planner bounds its device tensors with this same function."""
    num, den = relaxation_fraction(relaxation)
    upper = -((-(den + num) * demand) // (den * count))  # ceil
    lower = ((den - num) * demand // (den * count)).clip(min=0)  # floor, never negative
    return lower, upper


def replica_bounds(topk_ids: np.ndarray, placement: Placement, relaxation: float) -> tuple[np.ndarray, np.ndarray]:
    """Per global slot, the load bounds ``floor((1-C) D/c)`` and ``ceil((1+C) D/c)`` of its expert.

    Returns two ``[R * S]`` int64 arrays (0 for empty slots). Integer arithmetic only.
    """
    ids = topk_ids.ravel()
    demand = np.bincount(ids[ids >= 0], minlength=placement.num_experts).astype(np.int64)
    lo_e, hi_e = expert_load_bounds(demand, placement.replica_count.astype(np.int64), relaxation)
    se = placement.slot_expert.ravel()
    lo = np.where(se >= 0, lo_e[np.maximum(se, 0)], 0)
    hi = np.where(se >= 0, hi_e[np.maximum(se, 0)], 0)
    return lo, hi


DISPATCH, COMBINE = 0, 1

# The columns of a hop table and their dtypes (``Hops``; ``zepp.planner.torch.types.TorchHops``
# holds the same columns as tensors).
HOP_COLUMNS = {"stage": np.int8, "src": np.int32, "dst": np.int32, "owner": np.int32, "token": np.int32,
               "msg": np.int32, "entry": np.int8}


@dataclass(frozen=True)
class Hops:
    """One phase's row moves, one element per hop (all arrays ``[M]``).

    A hop moves one hidden-size row of token ``(owner, token)`` from rank ``src`` to rank ``dst``.
    Hops of stage ``s`` start only once every hop of stages ``< s`` has arrived, so ``src`` must
    hold the row when its stage starts. Hops sharing ``(stage, src, dst, msg)`` travel as one
    message; the order of hops inside a message is the order of this table.

    Dispatch rows are token inputs: a rank *holds* a token once any hop delivered it (or it owns
    it); duplicate deliveries are legal (``a2av`` sends one row per entry) and each costs bytes.

    Combine rows are partial outputs. At the start, rank ``c`` holds, per token it computed any
    entry of, the gate-weighted sum of those entries (``entry == -1`` units), or, for hops with
    ``entry >= 0``, exactly that entry's weighted output. A hop with ``entry == -1`` *moves* the
    whole partial ``src`` holds for the token at that stage (it is summed into ``dst``'s partial);
    one with ``entry == j`` moves only entry ``j``'s output. At the end every partial must sit at
    its owner, summing each of the token's ``k`` entries exactly once.
    """

    stage: np.ndarray  # int8
    src: np.ndarray  # int32
    dst: np.ndarray  # int32
    owner: np.ndarray  # int32
    token: np.ndarray  # int32
    msg: np.ndarray  # int32, message key within (stage, src, dst)
    entry: np.ndarray  # int8, -1 = whole partial (combine) / unused (dispatch), j = that entry only

    @staticmethod
    def concat(parts: list["Hops"]) -> "Hops":
        parts = [p for p in parts if p.size]
        if not parts:
            return Hops.empty()
        return Hops(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in Hops._fields()})

    @staticmethod
    def _fields() -> tuple[str, ...]:
        return tuple(HOP_COLUMNS)

    @staticmethod
    def empty() -> "Hops":
        return Hops(**{c: np.zeros(0, dtype) for c, dtype in HOP_COLUMNS.items()})

    @staticmethod
    def make(stage, src, dst, owner, token, msg=0, entry=-1) -> "Hops":
        """Build from arrays or scalars (broadcast to the length of ``src``)."""
        src = np.asarray(src, np.int32)
        n = src.shape[0]

        def col(v, dtype):
            v = np.asarray(v, dtype)
            return v if v.shape == (n,) else np.broadcast_to(v, (n,)).copy()

        return Hops(stage=col(stage, np.int8), src=src, dst=col(dst, np.int32), owner=col(owner, np.int32),
                    token=col(token, np.int32), msg=col(msg, np.int32), entry=col(entry, np.int8))

    @property
    def size(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_stages(self) -> int:
        return int(self.stage.max()) + 1 if self.size else 0

    def select(self, mask: np.ndarray) -> "Hops":
        return Hops(**{f: getattr(self, f)[mask] for f in Hops._fields()})


RoutingT = TypeVar("RoutingT")
HopsT = TypeVar("HopsT")


@dataclass(frozen=True)
class FlowPlanFields(Generic[RoutingT, HopsT]):
    """The one field list of a FlowPlan, whichever arrays hold it (``FlowPlan``: numpy;
    ``zepp.planner.torch.types.TorchFlowPlan``: tensors on a device).

    ``routing``; ``row_bytes`` is the size of one row on the wire (``hidden * dtype_bytes``) in
    both phases; ``dispatch_transport`` / ``combine_transport`` name the transports of each phase
    (``zepp.planner.flows``); ``coalesce``: the ``zepp`` dispatch's pieces one NIC carries to one
    node travel as one message. A plan is decided on counts: ``volumes`` (rows per stage, source,
    destination, message and owner node of each phase, ``zepp.planner.volumes``) are built from
    the routing's counts on first use, and the per-row hop tables ``dispatch`` / ``combine``
    only where something reads them (an executor, a dump, the validation), unless the plan was
    made from given tables (``hops``: ``(dispatch, combine)``; the volumes are then theirs counted).
    """

    routing: RoutingT
    gpus_per_node: int
    row_bytes: int
    dispatch_transport: str
    combine_transport: str
    coalesce: bool = True
    hops: tuple | None = field(default=None, repr=False)

    @property
    def transport(self) -> str:
        """``dispatch/combine`` transport names, for messages and reports."""
        return f"{self.dispatch_transport}/{self.combine_transport}"

    @functools.cached_property
    def hop_tables(self) -> tuple:
        """``(dispatch, combine)`` hop tables: the given ones, else built from the routing."""
        return self.hops if self.hops is not None else self._build_hops()

    @property
    def dispatch(self) -> HopsT:
        return self.hop_tables[0]

    @property
    def combine(self) -> HopsT:
        return self.hop_tables[1]

    @functools.cached_property
    def volumes(self):
        """``PlanVolumes(dispatch, combine)``: each phase's ``Volumes``."""
        return self._build_volumes()

    def _build_hops(self) -> tuple:
        raise NotImplementedError

    def _build_volumes(self):
        raise NotImplementedError


@dataclass(frozen=True)
class FlowPlan(FlowPlanFields[Routing, Hops]):
    """The transfers of one MoE layer: its routing and transports, its volumes and hop tables
    (fields: ``FlowPlanFields``). The ``allgather`` dispatch has no hop table: it delivers every
    token to every rank (COMET's dense all-gather, which the simulator models with its own plug-in).
    """

    @property
    def ranks(self) -> int:
        return self.routing.placement.ranks

    @property
    def tokens_per_rank(self) -> int:
        return self.routing.topk_ids.shape[1]

    def _build_hops(self) -> tuple[Hops, Hops]:
        from zepp.planner.flows import build_hops  # flows read the plan types

        return build_hops(self.routing, self.dispatch_transport, self.combine_transport, self.coalesce)

    @functools.cached_property
    def volume_state(self):
        """``zepp.planner.flows.VolumeState``: the volumes from the routing's counts, with the
        counts and gateways they were built from (``None`` for a plan made from given hop tables)."""
        from zepp.planner.flows import build_volumes

        if self.hops is not None:
            return None
        return build_volumes(self.routing, self.dispatch_transport, self.combine_transport, self.coalesce)

    def _build_volumes(self):
        from zepp.planner.volumes import PlanVolumes, volumes_of_hops

        if self.hops is None:
            return self.volume_state.volumes
        return PlanVolumes(*(volumes_of_hops(h, self.ranks, self.gpus_per_node) for h in self.hops))

    def stats(self, phase: int | None = None):
        """``zepp.planner.volumes.LinkStats``: byte and message accounting for ``DISPATCH``,
        ``COMBINE`` or both (``None``), from the volumes."""
        from zepp.planner.volumes import volume_stats

        if phase is None:
            return self.stats(DISPATCH) + self.stats(COMBINE)
        if phase not in (DISPATCH, COMBINE):
            raise ValueError(f"phase must be zepp.planner.types.DISPATCH, COMBINE or None, got {phase!r}")
        return volume_stats(self.volumes[phase], self.ranks, self.gpus_per_node, self.row_bytes,
                            self.routing.rows_per_rank())

    def validate(self) -> None:
        """Prove the plan delivers every entry to its computing rank and returns every entry's
        output to its token's owner exactly once (``zepp.planner.validation.validate_flow_plan``)."""
        from zepp.planner.validation import validate_flow_plan  # validation reads the transport table

        validate_flow_plan(self)
