"""The attention-kernel registry: one name per formulation, so a config string picks the implementation."""

from __future__ import annotations

import functools
from typing import Callable, Protocol

from torch import Tensor


class AttentionKernel(Protocol):
    """``kernel(q, k, v, *, causal, mask, dropout_p, scale, window) -> Tensor``.

    q: (B, H, Tq, D); k, v: (B, Hkv, Tk, D) with H divisible by Hkv (query head h reads key/value
    head h // (H // Hkv)). mask: optional bool, broadcastable to (B, H, Tq, Tk), True = "may attend".
    causal: query i (counted from the end, so Tq < Tk aligns bottom-right: position p = i + Tk - Tq)
    sees keys j <= p. window: with causal, only keys p - window < j <= p (a sliding window).
    scale defaults to 1/sqrt(D). A query row that may attend nowhere returns zeros (and zero
    gradients). dropout_p is applied to the attention weights; callers pass 0 outside training.
    Returns (B, H, Tq, D).
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
        window: int | None = None,
    ) -> Tensor: ...


_KERNELS: dict[str, AttentionKernel] = {}
_BACKENDS: dict[str, tuple[str, ...]] = {}


def register(
    name: str, *, override: bool = False, backends: tuple[str, ...] = ()
) -> Callable[[AttentionKernel], AttentionKernel]:
    """Decorator adding a kernel under ``name``; ``attention=<name>`` then selects it.

    ``backends``: names the kernel accepts as a ``backend=`` keyword (``attention.backend=<name>``).
    """

    def add(kernel: AttentionKernel) -> AttentionKernel:
        if name in _KERNELS and not override:
            raise ValueError(f"attention kernel {name!r} is already registered (pass override=True to replace it)")
        _KERNELS[name] = kernel
        _BACKENDS[name] = tuple(backends)
        return kernel

    return add


def get(name: str, backend: str | None = None) -> AttentionKernel:
    """The kernel registered under ``name``, with its backend pinned when ``backend`` is given."""
    try:
        kernel = _KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown attention kernel {name!r}; valid: {', '.join(available())}") from None
    if backend is None:
        return kernel
    if backend not in _BACKENDS[name]:
        raise ValueError(f"attention {name!r} has no backend {backend!r}; valid: {', '.join(_BACKENDS[name]) or 'none'}")
    return functools.partial(kernel, backend=backend)


def backends(name: str) -> tuple[str, ...]:
    """The backends a kernel can pin (empty for most)."""
    get(name)
    return _BACKENDS[name]


def available() -> list[str]:
    """Names of all registered kernels, sorted."""
    return sorted(_KERNELS)
