"""The attention-kernel registry: one name per formulation, so a config string picks the implementation."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


class AttentionKernel(Protocol):
    """``kernel(q, k, v, *, causal, mask, dropout_p, scale, window[, softcap, bias, sink]) -> Tensor``.

    q: (B, H, Tq, D); k: (B, Hkv, Tk, D); v: (B, Hkv, Tk, Dv), Dv usually D (the diff design gives Dv = 2D,
    mla Dv < D: q and k carry the decoupled rotary features too), with H divisible by Hkv (query
    head h reads key/value head h // (H // Hkv)). mask: optional bool, broadcastable to (B, H, Tq, Tk), True =
    "may attend".
    causal: query i (counted from the end, so Tq < Tk aligns bottom-right: position p = i + Tk - Tq)
    sees keys j <= p. window: with causal, only keys p - window < j <= p (a sliding window).
    scale defaults to 1/sqrt(D). A query row that may attend nowhere returns zeros (and zero
    gradients). dropout_p is applied to the attention weights; callers pass 0 outside training.
    Returns (B, H, Tq, Dv).

    Score variants, only for kernels that declare them (EXTENSIONS; callers pass them only when set):
    softcap: scores s -> softcap * tanh(s / softcap) (Gemma 2); bias: a float tensor broadcastable to
    (B, H, Tq, Tk) added to the (capped) scores (ALiBi); sink: (H,) a logit per head that joins each
    row's softmax and takes its share of the weight, but has no value (attention sinks).
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


DEVICE_TYPES = ("cpu", "cuda", "mps")
CONTRACT = ("gqa", "window", "mask", "dropout")  # what every kernel is expected to do (the default declaration)
EXTENSIONS = ("softcap", "bias", "sink")  # score variants a kernel opts into (the keywords it then accepts)
OPTIONS = CONTRACT + EXTENSIONS
OPTION_WORDS = {
    "gqa": "grouped-query attention (fewer key/value heads)",
    "window": "sliding window",
    "mask": "boolean attention mask",
    "dropout": "dropout on the attention weights",
    "softcap": "logit soft-capping",
    "bias": "additive score bias",
    "sink": "attention sink logit",
}
DEVICE_WORDS = {"cpu": "CPU", "cuda": "a CUDA GPU", "mps": "MPS"}


@dataclass(frozen=True)
class KernelSpec:
    """What a kernel can do, declared where it is registered; the defaults are the AttentionKernel contract
    without the score variants (EXTENSIONS), which a kernel must declare to be given them.

    A test compares each declaration with what ``python -m gpt.attention`` measures, so a wrong one fails.
    """

    trains_on: tuple[str, ...] = DEVICE_TYPES  # device types where it has a backward pass
    options: tuple[str, ...] = CONTRACT  # which of OPTIONS its keyword arguments implement
    backends: tuple[str, ...] = ()  # names its ``backend=`` keyword accepts (attention.backend=<name>)
    why: str = ""  # one line: why something is missing, quoted in refusals (e.g. "a torch limitation")

    def __post_init__(self) -> None:
        for field, values, valid in (("trains_on", self.trains_on, DEVICE_TYPES), ("options", self.options, OPTIONS)):
            unknown = sorted(set(values) - set(valid))
            if unknown:
                raise ValueError(f"KernelSpec.{field}: unknown {', '.join(unknown)}; valid: {', '.join(valid)}")

    def supports(self, option: str) -> bool:
        """Whether the kernel implements ``option`` (one of OPTIONS)."""
        if option not in OPTIONS:
            raise ValueError(f"unknown attention option {option!r}; valid: {', '.join(OPTIONS)}")
        return option in self.options

    def trains(self, device_type: str) -> bool:
        """Whether the kernel has a backward pass on this device type."""
        return device_type in self.trains_on


_KERNELS: dict[str, AttentionKernel] = {}
_SPECS: dict[str, KernelSpec] = {}


def register(
    name: str,
    *,
    override: bool = False,
    backends: tuple[str, ...] = (),
    trains_on: tuple[str, ...] = DEVICE_TYPES,
    options: tuple[str, ...] = CONTRACT,
    why: str = "",
) -> Callable[[AttentionKernel], AttentionKernel]:
    """Decorator adding a kernel under ``name``; ``attention=<name>`` then selects it.

    The keywords declare what it can do (see KernelSpec); leave them out for a kernel with the whole contract
    and no score variants.
    """
    declared = KernelSpec(trains_on=tuple(trains_on), options=tuple(options), backends=tuple(backends), why=why)

    def add(kernel: AttentionKernel) -> AttentionKernel:
        if name in _KERNELS and not override:
            raise ValueError(f"attention kernel {name!r} is already registered (pass override=True to replace it)")
        _KERNELS[name] = kernel
        _SPECS[name] = declared
        return kernel

    return add


def unregister(name: str) -> None:
    """Remove a kernel (a test's or a notebook's experiment); unknown names are an error."""
    get(name)
    del _KERNELS[name], _SPECS[name]


def get(name: str, backend: str | None = None) -> AttentionKernel:
    """The kernel registered under ``name``, with its backend pinned when ``backend`` is given."""
    try:
        kernel = _KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown attention kernel {name!r}; valid: {', '.join(available())}") from None
    if backend is None:
        return kernel
    valid = _SPECS[name].backends
    if backend not in valid:
        raise ValueError(f"attention {name!r} has no backend {backend!r}; valid: {', '.join(valid) or 'none'}")
    return functools.partial(kernel, backend=backend)


def spec(name: str) -> KernelSpec:
    """What the kernel registered under ``name`` declared it can do."""
    get(name)
    return _SPECS[name]


def backends(name: str) -> tuple[str, ...]:
    """The backends a kernel can pin (empty for most)."""
    return spec(name).backends


def available() -> list[str]:
    """Names of all registered kernels, sorted."""
    return sorted(_KERNELS)


def lacks(name: str, option: str) -> str:
    """One line saying that a kernel has no ``option``, with its declared reason."""
    reason = spec(name).why
    return f"attention={name} has no {OPTION_WORDS[option]}" + (f" ({reason})" if reason else "")


def no_backward(name: str, device_type: str) -> str:
    """One line saying that a kernel cannot train on a device type, with its declared reason."""
    reason = spec(name).why
    where = DEVICE_WORDS.get(device_type, device_type)
    return f"attention={name} has no backward pass on {where}" + (f" ({reason})" if reason else "")
