"""vLLM 0.33.0's EPLB code loaded by path (``engine_code``), with the stubs it imports.

``base_router.py`` defines its replica choice as a Triton kernel (``_eplb_map_and_record_i32_kernel``);
there is no torch reference of it. To run vLLM's own kernel on the CPU, ``triton`` / ``tl`` are
stood in for by a numpy interpreter of the few Triton operations that kernel uses (one program
per block, pointers as (array, offsets), masked loads and stores, ``atomic_add``), and vLLM's own
launcher ``_eplb_map_and_record_triton`` runs it on CPU tensors.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import torch

from engine_code import loaded, stub


class _Arr(np.ndarray):
    """A numpy array with Triton's ``.to(dtype)``."""

    def to(self, dtype):
        return self.astype(dtype).view(_Arr)


def _arr(x):
    return np.asarray(x).view(_Arr)


class _Ptr:
    """A pointer: an array and offsets into it (``ptr + offsets``)."""

    def __init__(self, base: np.ndarray, offs=0):
        self.base, self.offs = base, offs

    def __add__(self, offs):
        return _Ptr(self.base, self.offs + np.asarray(offs))


class _TL:
    """The ``tl`` operations of vLLM's EPLB kernel, on numpy."""

    int64 = np.int64
    constexpr = object
    pid = 0

    def program_id(self, axis):
        return _TL.pid

    def arange(self, start, stop):
        return _arr(np.arange(start, stop, dtype=np.int32))

    def load(self, ptr: _Ptr, mask=True, other=0):
        offs = np.asarray(ptr.offs)
        mask = np.broadcast_to(np.asarray(mask, bool), offs.shape)
        safe = np.where(mask, offs, 0).clip(0, ptr.base.size - 1)
        return _arr(np.where(mask, ptr.base[safe], other))

    def store(self, ptr: _Ptr, value, mask=True):
        offs = np.asarray(ptr.offs)
        mask = np.broadcast_to(np.asarray(mask, bool), offs.shape)
        ptr.base[offs[mask]] = np.broadcast_to(np.asarray(value), offs.shape)[mask]

    def atomic_add(self, ptr: _Ptr, value, mask=True):
        offs = np.asarray(ptr.offs)
        mask = np.broadcast_to(np.asarray(mask, bool), offs.shape)
        np.add.at(ptr.base, offs[mask], np.broadcast_to(np.asarray(value), offs.shape)[mask])

    def where(self, c, a, b):
        return _arr(np.where(c, a, b))

    def maximum(self, a, b):
        return _arr(np.maximum(a, b))


class _Kernel:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        def launch(*args, **meta):
            n = grid(meta)[0] if callable(grid) else grid[0]
            args = [_Ptr(a.view(-1).numpy()) if isinstance(a, torch.Tensor) else a for a in args]
            for pid in range(n):
                _TL.pid = pid
                self.fn(*args, **meta)
        return launch


def _triton_stub():
    return stub("vllm.triton_utils", tl=_TL(), triton=SimpleNamespace(jit=_Kernel, cdiv=lambda a, b: -(-a // b)))


def _stubs(platform_cuda: bool) -> dict:
    names = ("vllm.config", "vllm.config.utils", "vllm.distributed.parallel_state", "vllm.distributed.stateless_coordinator",
             "vllm.distributed.utils", "vllm.logger", "vllm.model_executor.models.interfaces",
             "vllm.utils.gpu_sync_debug", "vllm.utils.torch_utils", "vllm.distributed.eplb.async_worker",
             "vllm.distributed.eplb.eplb_communicator", "vllm.distributed.eplb.eplb_utils",
             "vllm.distributed.eplb.rebalance_execute", "vllm.model_executor.layers.fused_moe.router.fused_moe_router",
             "vllm.v1.worker.ubatching")
    out = {n: stub(n) for n in names}
    out["vllm.config.parallel"] = stub("vllm.config.parallel", EPLBPolicyOption=__import__("typing").Literal["default"])
    out["vllm.utils.torch_utils"].PIN_MEMORY = False
    out["vllm.utils.gpu_sync_debug"].gpu_sync_allowed = contextlib.nullcontext
    out["vllm.platforms"] = stub("vllm.platforms", current_platform=SimpleNamespace(
        is_cuda_alike=lambda: platform_cuda, is_xpu=lambda: False, is_rocm=lambda: False))
    out["vllm.triton_utils"] = _triton_stub()
    out["vllm.envs"] = stub("vllm.envs", VLLM_PLUGINS=None)
    return out


@contextlib.contextmanager
def vllm():
    """vLLM's loaded modules: ``.eplb_state``, ``.policy``, ``.default``, ``.base_router``, ``.plugins``."""
    with loaded("vllm", _stubs(platform_cuda=True)) as load:
        yield SimpleNamespace(eplb_state=load("vllm.distributed.eplb.eplb_state"),
                              policy=load("vllm.distributed.eplb.policy"),
                              default=load("vllm.distributed.eplb.policy.default"),
                              base_router=load("vllm.model_executor.layers.fused_moe.router.base_router"),
                              plugins=load("vllm.plugins"))


def vllm_physical_ids(v, topk_ids: np.ndarray, l2p: np.ndarray, count: np.ndarray) -> np.ndarray:
    """vLLM's kernel on one rank: ``topk_ids [T, k]`` logical, ``l2p [E, W]``, ``count [E]``."""
    ids = torch.as_tensor(topk_ids, dtype=torch.int64)
    load_view = torch.zeros(int(l2p.max()) + 1, dtype=torch.int32)
    out = v.base_router._eplb_map_and_record_triton(ids, torch.as_tensor(l2p, dtype=torch.int64),
                                                    torch.as_tensor(count, dtype=torch.int64), load_view,
                                                    torch.ones(1, dtype=torch.int32), None)
    return out.numpy()
