"""Hook points: named places in the forward pass where a function may read or replace an activation.

A HookPoint is a module with no parameters (state dicts are unchanged) that the model calls on an activation; with no
function attached it returns its input. Functions are attached with ``add`` and taken off with ``remove``, which keep
the owning module's ``hooked`` flag true while any of its hook points has one: the model's forward methods test that
flag once and skip their hook points altogether while it is false, so a pass with nothing attached costs what it
would without them. gpt.interpret names them as TransformerLens does (``blocks.0.attn.hook_q``) and attaches
functions; this module knows nothing of names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

HookFn = Callable[[Tensor, "HookPoint"], Any]  # fn(activation, hook) -> a replacement, or None to leave it


class HookPoint(nn.Module):
    """Identity unless functions are attached; each sees the activation (heads-first tensors as (B, T, H, D), the
    layout TransformerLens uses) and may return a replacement of the same shape."""

    def __init__(self, heads: bool = False, owner: nn.Module | None = None) -> None:
        super().__init__()
        self.fns: list[HookFn] = []  # attached functions, in order; change them with add and remove
        self.heads = heads  # the model's tensor is (B, H, T, D): functions see it transposed to (B, T, H, D)
        self.name = ""  # set by gpt.interpret when it names the model's hook points
        self.__dict__["owner"] = owner  # the module whose forward calls this one: a plain reference, not a child

    def add(self, fn: HookFn) -> None:
        """Attach fn: it is called, after those attached before it, on every activation passing here."""
        self.fns.append(fn)
        self._update_owner()

    def remove(self, fn: HookFn) -> None:
        """Take fn off again (one attachment of it)."""
        self.fns.remove(fn)
        self._update_owner()

    def _update_owner(self) -> None:
        owner = self.__dict__["owner"]
        if owner is not None:
            owner.hooked = any(point.fns for point in owner.children() if isinstance(point, HookPoint))

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x) if self.fns else x

    def forward(self, x: Tensor) -> Tensor:
        for fn in self.fns:
            seen = x.transpose(1, 2) if self.heads else x
            out = fn(seen, self)
            if out is not None:
                if out.shape != seen.shape:
                    raise ValueError(f"hook {self.name or 'function'} returned shape {tuple(out.shape)}, "
                                     f"expected {tuple(seen.shape)}")
                x = out.transpose(1, 2) if self.heads else out
        return x

    def extra_repr(self) -> str:
        return f"{len(self.fns)} hook(s)" if self.fns else ""


def add_hook_points(module: nn.Module, *names: str, heads: bool = False) -> None:
    """Give ``module`` a HookPoint child under each name, and a ``hooked`` flag (false until a function is attached
    to one of them) for its forward to test. Each point is also kept in the instance's own attributes, so the
    forward pass finds it without nn.Module.__getattr__ (about 1.5 us a lookup, ten times the idle call)."""
    module.hooked = False
    for name in names:
        setattr(module, name, HookPoint(heads=heads, owner=module))  # a child module: named_modules, .to(), copies
        module.__dict__[name] = module._modules[name]
