"""Device set-up: gpt.device.configure_matmul turns TF32 on for CUDA and leaves other devices alone;
gpt.device.keep_freed_memory stops a CPU run from faulting its activations in again at every step."""

import os
import platform
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from gpt.device import MALLOC_SETTINGS, configure_matmul

GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"

# what a training step does to glibc: several large blocks (activations) allocated, touched and freed, step by step
STEPS = """
import resource, sys, torch
from gpt.device import keep_freed_memory
applied = keep_freed_memory(torch.device(sys.argv[1]))
def step():
    blocks = [torch.empty(8 << 20, dtype=torch.uint8).fill_(1) for _ in range(6)]  # 48 MiB, as activations
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_tf32_only_on_cuda(monkeypatch):
    precisions = []  # recorded, not applied: torch's global matmul setting must not leak into other tests
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precisions.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # put back as it was after the test
    configure_matmul(torch.device("cpu"))
    assert precisions == [] and not torch.backends.cudnn.allow_tf32
    configure_matmul(torch.device("cuda"))  # sets torch's flags; needs no GPU to do so
    assert precisions == ["high"] and torch.backends.cudnn.allow_tf32


def steps(device: str, **env: str) -> tuple[bool, int]:
    """Whether keep_freed_memory applied in a fresh process, and the page faults of ten steps after the first."""
    clean = {k: v for k, v in os.environ.items() if k not in MALLOC_SETTINGS}
    done = subprocess.run([sys.executable, "-c", STEPS, device], capture_output=True, text=True, cwd=ROOT,
                          env={**clean, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    applied, faults = done.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_cpu_steps_reuse_freed_memory_instead_of_faulting_it_in_again():
    applied, faults = steps("cpu")
    untouched, glibc_faults = steps("cuda")  # any other device: glibc's defaults stay
    assert applied and not untouched
    pages = 10 * 48 * 2**20 // 4096  # what ten steps touch: every page faults in again under glibc's defaults
    assert glibc_faults > pages // 2 and faults < pages // 10, (faults, glibc_faults)


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_a_users_own_allocator_settings_win():
    applied, faults = steps("cpu", MALLOC_TRIM_THRESHOLD_="131072")
    assert not applied and faults > 10 * 48 * 2**20 // 4096 // 2
