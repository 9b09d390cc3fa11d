"""Attention kernels behind one registry: ``available()``, ``get(name)``, ``@register(name, ...)``, ``spec(name)``.

Built in: manual, einsum, heads, sdpa (gpt.kernels.kernels) and flex (gpt.kernels.flex). Each
declares what it can do when it registers (a KernelSpec); check_trainable and check_options read
that to refuse, before training starts, a kernel that cannot do what the config asks. Also here: the general
MultiHeadAttention module. The attention designs (RoPE, QK-norm, MLA, ...) are gpt.designs.
"""

from gpt.kernels import flex as _flex  # noqa: F401  (registers flex)
from gpt.kernels import kernels as _kernels  # noqa: F401  (registers manual, einsum, heads, sdpa)
from gpt.kernels.module import MultiHeadAttention
from gpt.kernels.registry import AttentionKernel, KernelSpec, available, backends, get, register, spec
from gpt.kernels.support import check_options, check_trainable

__all__ = [
    "AttentionKernel", "KernelSpec", "MultiHeadAttention", "available", "backends", "check_options", "check_trainable",
    "get", "register", "spec",
]
