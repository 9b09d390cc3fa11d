"""The attention-kernel registry: one name per formulation, so a config string picks the implementation."""

from __future__ import annotations

from typing import Callable, Protocol

from torch import Tensor


class AttentionKernel(Protocol):
    """``kernel(q, k, v, *, causal, mask, dropout_p, scale) -> Tensor``.

    q: (B, H, Tq, D); k, v: (B, Hkv, Tk, D) with H divisible by Hkv (query head h reads key/value
    head h // (H // Hkv)). mask: optional bool, broadcastable to (B, H, Tq, Tk), True = "may attend".
    causal: query i (counted from the end, so Tq < Tk aligns bottom-right) sees keys j <= i + Tk - Tq.
    scale defaults to 1/sqrt(D). A query row that may attend nowhere returns zeros. Returns (B, H, Tq, D).
    """

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        causal: bool = True,
        mask: Tensor | None = None,
        dropout_p: float = 0.0,
        scale: float | None = None,
    ) -> Tensor: ...


_KERNELS: dict[str, AttentionKernel] = {}


def register(name: str, *, override: bool = False) -> Callable[[AttentionKernel], AttentionKernel]:
    """Decorator adding a kernel under ``name``; ``attention=<name>`` then selects it."""

    def add(kernel: AttentionKernel) -> AttentionKernel:
        if name in _KERNELS and not override:
            raise ValueError(f"attention kernel {name!r} is already registered (pass override=True to replace it)")
        _KERNELS[name] = kernel
        return kernel

    return add


def get(name: str) -> AttentionKernel:
    """The kernel registered under ``name``."""
    try:
        return _KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown attention kernel {name!r}; valid: {', '.join(available())}") from None


def available() -> list[str]:
    """Names of all registered kernels, sorted."""
    return sorted(_KERNELS)
