"""A guard that makes a tensor created without its device fail on the CPU, as it would on a card.

On a CUDA machine a tensor made with no `device=` lands on the CPU and breaks the first op that meets the model's
tensors; on a CPU-only machine both are the CPU and nothing shows. Here torch's default device is `meta` (no data),
so such a tensor cannot be read (`.tolist()`, `int()`, numpy) and cannot meet a real one, and every op is checked:
its tensors on one device (a CPU scalar aside, as torch allows on a card) and its random generator on the device
of what it draws. The model and every tensor the engine makes with its device stay on the CPU and compute as
usual.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


class DeviceMixError(AssertionError):
    """An op met tensors of two devices, or drew from a generator of another device."""


def _devices(tensors) -> set[torch.device]:
    return {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}


class DeviceCheck(TorchFunctionMode):
    """Fails an op whose tensors are on several devices or whose generator is not on its output's device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        # .to() and friends move a tensor between devices on purpose; everything else computes on one
        if getattr(func, "__name__", "") not in ("to", "cpu", "cuda", "copy_", "new_tensor", "__get__", "__set__"):
            found = _devices(tensors)
            if len(found) > 1:
                raise DeviceMixError(f"{getattr(func, '__name__', func)} mixes devices {sorted(map(str, found))}")
        out = func(*args, **kwargs)
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator):
            drawn = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)] + tensors
            where = {t.device.type for t in drawn}
            if where and where != {gen.device.type}:
                raise DeviceMixError(f"{getattr(func, '__name__', func)} draws on {sorted(where)} from a "
                                     f"{gen.device.type} generator")
        return out


@contextmanager
def strict_devices():
    """Inside: torch's default device is `meta` and every op is checked (DeviceCheck)."""
    torch.set_default_device("meta")
    try:
        with DeviceCheck():
            yield
    finally:
        torch.set_default_device(None)
