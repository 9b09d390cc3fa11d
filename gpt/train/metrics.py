"""Throughput figures: model FLOPs per token, peak FLOP/s of known GPUs, MFU, peak memory."""

from __future__ import annotations

import resource
import sys
import time

import torch

from gpt.model.config import GPTConfig

# Dense (no sparsity) peak tensor-core FLOP/s per GPU, from the vendors' data sheets. fp32 means TF32
# matmuls, which is what training in fp32 uses on these GPUs (TF32 is switched on for CUDA).
# Matched against torch.cuda.get_device_name() in order, so more specific names come first.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12}),  # SXM / HBM3
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}),
]


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one device at a precision, or None where unknown (CPU, MPS, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return peak_flops_for_name(name, precision)


def peak_flops_for_name(name: str, precision: str) -> float | None:
    for key, peaks in PEAK_FLOPS:
        if key.lower() in name.lower():
            return peaks.get(precision)
    return None


def flops_per_token(cfg: GPTConfig, n_params: int, seq_len: int | None = None) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus the attention score matmuls.

    The attention term, 12 * n_layer * n_embd * seq_len (default block_size), counts q @ k^T and
    att @ v (2 matmuls, 2 FLOPs per multiply-add, 3x for forward + backward) at that context length.
    """
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * (seq_len or cfg.block_size)


def mfu(tokens_per_sec_per_device: float, cfg: GPTConfig, n_params: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak (None where the peak is unknown)."""
    if peak is None:
        return None
    return tokens_per_sec_per_device * flops_per_token(cfg, n_params) / peak


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory so far: allocated by PyTorch on CUDA, else the peak resident size of the process."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


class Throughput:
    """Tokens per second: between two log lines, and over the whole invocation but its first step
    (compilation and warm-up would distort it) unless that step is the only one."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.steps = 0  # steps run by this invocation
        self.seconds = 0.0  # their time, the first step's left out
        self.first_seconds = 0.0  # the first step's time
        self._window_start, self._window_steps = time.time(), 0

    def step_done(self, seconds: float) -> None:
        self.steps += 1
        self._window_steps += 1
        if self.steps > 1:
            self.seconds += seconds
        else:
            self.first_seconds = seconds

    def window_rate(self) -> float:
        """Tokens/s since the last call (or the last restart of the window), then start a new window."""
        rate = self._window_steps * self.tokens_per_step / max(time.time() - self._window_start, 1e-9)
        self.restart_window()
        return rate

    def restart_window(self) -> None:
        """Begin a new window (after an evaluation, whose time is not training time)."""
        self._window_start, self._window_steps = time.time(), 0

    def run_rate(self) -> float:
        if self.steps == 1 and self.first_seconds > 0:
            return self.tokens_per_step / self.first_seconds
        return (self.steps - 1) * self.tokens_per_step / self.seconds if self.seconds > 0 else 0.0

    def eta_seconds(self, steps_left: int) -> float:
        return steps_left * self.seconds / max(self.steps - 1, 1)
