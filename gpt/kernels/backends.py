"""Which of torch's SDPA backends attention=sdpa may use, decided in one place for every caller.

``choose`` is the rule: the user's pin (attention.backend=flash|efficient|math|cudnn) everywhere; left to torch,
torch chooses, except for a cached decode step on CUDA (queries fewer than keys, the key length growing by one a
step), which is limited to the fused flash and memory-efficient kernels (math as the last resort): left to itself
SDPA picked cuDNN there on an H200, whose forward spent about 1.4 ms of CPU per call as the key length grew, and
bf16 decoding was 9x slower than fp32 (issue 30; any pinned backend brought it back).

The rule is applied at two places, never inside a compiled graph: the sdpa kernel applies it per call in eager
mode; code that calls a torch.compile'd model applies it around the call (``Pin``), because torch fixes the
backend when it traces. A context manager inside the compiled region (the kernel's pin with its warnings
capture) split the graph at every layer and halved compiled training speed on a GPU (issue 30).
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
HALF = (torch.float16, torch.bfloat16)  # the dtypes flash attention takes on CUDA


def choose(pinned: str | None, device_type: str, dtype: torch.dtype, t_q: int,
           t_k: int) -> tuple[SDPBackend, ...] | None:
    """The backends SDPA may use for queries (.., t_q, D) against keys (.., t_k, D) of ``dtype``; None: torch's
    own choice. ``pinned``: the user's attention.backend (None when unset)."""
    if pinned is not None:
        if pinned not in SDPA_BACKENDS:
            raise ValueError(f"unknown sdpa backend {pinned!r}; valid: {', '.join(SDPA_BACKENDS)}")
        return (SDPA_BACKENDS[pinned],)
    if device_type == "cuda" and t_q < t_k:  # a cached decode step: a fused kernel, never cuDNN's per-shape plans
        fused = (SDPBackend.FLASH_ATTENTION,) if dtype in HALF else ()
        return (*fused, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    return None


class Pin:
    """A reusable context manager: SDPA limited to ``allowed`` inside it (nothing changes for None).

    Entered around a call into a compiled model, it decides the backend the compiled graph bakes in; a fresh
    torch.nn.attention.sdpa_kernel is entered each time, so one Pin serves every step.
    """

    def __init__(self, allowed: tuple[SDPBackend, ...] | None) -> None:
        self.allowed = allowed
        self._open: list = []

    def __enter__(self) -> Pin:
        if self.allowed is not None:
            context = sdpa_kernel(list(self.allowed))
            context.__enter__()
            self._open.append(context)
        return self

    def __exit__(self, *exc) -> None:
        if self.allowed is not None:
            self._open.pop().__exit__(*exc)


def pin_for(attention: str, backend: str | None, device: torch.device, dtype: torch.dtype,
            decoding: bool = False) -> Pin:
    """The Pin for calls of a model with attention=``attention`` (only sdpa has backends) in one phase: training and
    full forwards (``decoding`` False), or cached decode steps. ``dtype``: what the kernel sees (autocast's)."""
    if attention != "sdpa":
        return Pin(None)
    return Pin(choose(backend, device.type, dtype, 1 if decoding else 2, 2))


def compute_dtype(device: torch.device, fallback: torch.dtype) -> torch.dtype:
    """The dtype attention computes in here: autocast's when it is on for this device, else ``fallback``."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return fallback
