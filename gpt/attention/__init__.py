"""Attention kernels behind one registry: ``available()``, ``get(name)``, ``@register(name)``."""

from gpt.attention.registry import AttentionKernel, available, get, register
from gpt.attention import kernels as _kernels  # noqa: F401  (registers the built-in kernels)

__all__ = ["AttentionKernel", "available", "get", "register"]
