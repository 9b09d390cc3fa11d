"""Device and precision choice: auto picks cuda, then mps, then cpu; bf16 autocast where supported; TF32 on CUDA."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
from dataclasses import dataclass

import torch

from gpt.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # autocast dtype of each reduced precision


@dataclass
class DeviceConfig:
    """The ``device=`` config group: where to run."""

    type: str = "auto"  # auto | cpu | cuda | cuda:N | mps


def resolve_device(name: str) -> torch.device:
    """The torch.device for a config name, or a UserError when that device is not present."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}", hint="use device=auto, cpu, cuda or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device=cuda was asked for but no CUDA GPU is available", hint="use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("device=mps was asked for but MPS is not available here", hint="use device=auto or device=cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"unsupported device {name!r}", hint="use device=auto, cpu, cuda or mps")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """auto: bf16 on a CUDA GPU that supports it, fp32 elsewhere. Refuses what the device cannot do."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise UserError(f"precision=fp16 needs a CUDA GPU (device is {device.type})", hint="use precision=fp32 or bf16")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("this GPU does not support bf16", hint="use precision=fp16 or fp32")
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context for a resolved precision (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def configure_for_training(device: torch.device) -> None:
    """What training and its benchmark both set before the first step: TF32 matmuls on CUDA, and on a CPU the
    memory a step frees kept for the next."""
    configure_matmul(device)
    keep_freed_memory(device)


def configure_matmul(device: torch.device) -> None:
    """On CUDA, let float32 matmuls and cuDNN convolutions use TF32 tensor cores (a 10-bit mantissa: faster,
    accurate enough for training); elsewhere nothing changes."""
    if device.type != "cuda":
        return
    # torch's legacy switches, on purpose: mixing them with the newer fp32_precision ones makes
    # torch.get_float32_matmul_precision() raise, which torch.compile calls.
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


# glibc's mallopt parameters (malloc.h) and the environment variables that set them; a user's own choice wins
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                   "GLIBC_TUNABLES", "LD_PRELOAD")


def keep_freed_memory(device: torch.device) -> bool:
    """On CPU with glibc, keep the memory a training step frees for the next step instead of returning it to the
    OS. By default glibc unmaps large blocks on free and trims the heap, so every step faults its activations in
    again, page by page (about 6,000 page faults and 20 ms of system time per step of the default model, a few
    percent of the step: docs/benchmarks.md). Nothing changes where the user set glibc's malloc variables or
    preloads another allocator, on other C libraries, or off the CPU. Returns whether it applied."""
    if device.type != "cpu" or sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(name) for name in MALLOC_SETTINGS):
        return False
    libc = ctypes.CDLL("libc.so.6")
    # blocks up to 1 GiB come from the heap (glibc's own default stops at 32 MiB), and the heap is never trimmed
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) or libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mmap_ok and libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1))
