"""Device and precision choice: auto picks cuda, then mps, then cpu; bf16 autocast where supported; TF32 on CUDA."""

from __future__ import annotations

import contextlib
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


def configure_matmul(device: torch.device) -> None:
    """On CUDA, let float32 matmuls and cuDNN convolutions use TF32 tensor cores (a 10-bit mantissa: faster,
    accurate enough for training); elsewhere nothing changes. Training and its benchmark both call this."""
    if device.type != "cuda":
        return
    # torch's legacy switches, on purpose: mixing them with the newer fp32_precision ones makes
    # torch.get_float32_matmul_precision() raise, which torch.compile calls.
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
