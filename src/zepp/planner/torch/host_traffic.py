"""A check, on any device, that torch code would be captured by a CUDA graph: no host reads, no
tensors made from host data, no operation whose output size is read from the data.

``forbid_host_traffic()`` is a context manager (a ``TorchDispatchMode``) that raises
``HostTraffic`` at the first aten operation of that kind, naming the operation and the line of
zepp that called it. It sees every operation below autograd, on the CPU and the meta device too,
so the capture-safe planning path (``sync=False``) can be checked where no GPU is present. On a
GPU these are what fail inside ``torch.cuda.graph``:

- ``_local_scalar_dense``: ``.item()``, ``int(t)``, ``bool(t)`` (a device-to-host read);
- ``lift_fresh``: ``torch.tensor`` / ``torch.as_tensor`` of Python or numpy data, ``t[[1, 2]]``,
  ``t[i] = python_value`` (a host-to-device copy of pageable memory);
- ``nonzero``, ``masked_select``, the ``unique`` family, ``repeat_interleave`` without
  ``output_size``, indexing by a boolean mask: the output's size is read from the data.

What it cannot see: an operation that reads back inside its own CUDA kernel on one device and
not on another (``torch.bincount`` sizes its output from the data's maximum on CUDA; the
planner's ``_ops.counts`` uses it on the CPU alone), and copies between devices (on one device
there are none to see).
"""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten operations that read the data back to the host or copy host data to the device
_FORBIDDEN = frozenset({
    "aten._local_scalar_dense.default", "aten.lift_fresh.default", "aten.lift_fresh_copy.default",
    "aten.nonzero.default", "aten.masked_select.default", "aten.equal.default", "aten.is_nonzero.default",
    "aten._unique.default", "aten._unique2.default", "aten.unique_dim.default",
    "aten.unique_consecutive.default",
})


class HostTraffic(AssertionError):
    """An operation that a CUDA graph cannot capture ran inside ``forbid_host_traffic()``."""


def _is_mask(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _forbidden(name: str, args, kwargs) -> bool:
    if name in _FORBIDDEN:
        return True
    if name.startswith("aten.repeat_interleave.Tensor"):  # sized from the repeats' sum unless given
        return kwargs.get("output_size") is None
    if name.startswith(("aten.index.", "aten.index_put")):  # a boolean mask is a nonzero
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(_is_mask(i) for i in (indices or ()))
    return False


def _caller() -> str:
    """The innermost zepp frame of the current stack, as ``path:line  code``."""
    for frame in reversed(traceback.extract_stack()):
        if "/zepp/" in frame.filename and not frame.filename.endswith("host_traffic.py"):
            return f"{frame.filename.split('/zepp/')[-1]}:{frame.lineno}  {frame.line}"
    return "outside zepp"


class forbid_host_traffic(TorchDispatchMode):
    """``with forbid_host_traffic(): ...`` raises ``HostTraffic`` at the first operation a CUDA
    graph cannot capture (see the module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if _forbidden(name, args, kwargs):
            raise HostTraffic(f"{name} at {_caller()}: a CUDA graph cannot capture it")
        return func(*args, **kwargs)
