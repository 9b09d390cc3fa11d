"""Precision set-up: gpt.device.configure_matmul turns TF32 on for CUDA and leaves other devices alone."""

import pytest
import torch

from gpt.device import configure_matmul


@pytest.fixture
def restore_matmul_flags():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


def test_tf32_only_on_cuda(restore_matmul_flags):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    configure_matmul(torch.device("cpu"))
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    configure_matmul(torch.device("cuda"))  # sets torch's flags; needs no GPU to do so
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.allow_tf32
