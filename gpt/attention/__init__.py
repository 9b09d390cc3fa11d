"""Attention kernels behind one registry: ``available()``, ``get(name)``, ``@register(name)``.

Built in: manual, einsum, heads, sdpa (gpt.attention.kernels) and flex (gpt.attention.flex). Also
here: rotary position embeddings (rope), the general MultiHeadAttention module, and
check_trainable, which refuses a kernel that cannot train on a device before training starts.
"""

from gpt.attention.registry import AttentionKernel, available, backends, get, register
from gpt.attention import kernels as _kernels  # noqa: F401  (registers manual, einsum, heads, sdpa)
from gpt.attention import flex as _flex  # noqa: F401  (registers flex)
from gpt.attention.support import check_trainable
from gpt.attention.module import MultiHeadAttention

__all__ = ["AttentionKernel", "MultiHeadAttention", "available", "backends", "check_trainable", "get", "register"]
