"""Device set-up: gpt.device.configure_matmul turns TF32 on for CUDA and leaves other devices alone;
gpt.device.keep_freed_memory stops a CPU run from faulting its activations in again at every step."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from gpt.device import MALLOC_SETTINGS, configure_matmul

# glibc with mallinfo2 (2.33 and later), whose accounting the tests read
GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")

# A training step's large block (activations) under glibc: where it comes from while alive (mmapped bytes, glibc's
# mallinfo2) and how much heap is kept once it is freed. At 64 MiB it is beyond the 32 MiB up to which glibc's own
# threshold adapts, so by default it is mapped for the step and unmapped after, to be faulted in again next step.
STEP = """
import ctypes, sys, torch
from gpt.device import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                                                     "fordblks keepcost").split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
applied = keep_freed_memory(torch.device(sys.argv[1]))
block = torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
mapped = libc.mallinfo2().hblkhd
del block
print(applied, mapped >> 20, libc.mallinfo2().fordblks >> 20)
"""


def test_tf32_only_on_cuda(monkeypatch):
    precisions = []  # recorded, not applied: torch's global matmul setting must not leak into other tests
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precisions.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # put back as it was after the test
    configure_matmul(torch.device("cpu"))
    assert precisions == [] and not torch.backends.cudnn.allow_tf32
    configure_matmul(torch.device("cuda"))  # sets torch's flags; needs no GPU to do so
    assert precisions == ["high"] and torch.backends.cudnn.allow_tf32


def step(device: str, **env: str) -> tuple[bool, int, int]:
    """In a fresh process: whether keep_freed_memory applied, the MiB mapped apart from the heap while a step's 64 MiB
    block lives, and the free MiB the heap keeps after it."""
    clean = {k: v for k, v in os.environ.items() if k not in MALLOC_SETTINGS}
    done = subprocess.run([sys.executable, "-c", STEP, device], capture_output=True, text=True, cwd=ROOT,
                          env={**clean, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    applied, mapped, kept = done.stdout.split()
    return applied == "True", int(mapped), int(kept)


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only (2.33 or later)")
def test_cpu_steps_reuse_freed_memory_instead_of_mapping_it_anew():
    applied, mapped, kept = step("cpu")
    assert applied and mapped < 64 and kept >= 64, (mapped, kept)  # from the heap, and kept there for the next step
    applied, mapped, kept = step("cuda")  # any other device: glibc's defaults stay
    assert not applied and mapped >= 64 and kept < 64, (mapped, kept)  # mapped for the step, unmapped after


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only (2.33 or later)")
def test_a_users_own_allocator_settings_win():
    applied, mapped, kept = step("cpu", MALLOC_TRIM_THRESHOLD_="131072")
    assert not applied and mapped >= 64 and kept < 64, (mapped, kept)
