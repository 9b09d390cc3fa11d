"""Precision set-up: gpt.device.configure_matmul turns TF32 on for CUDA and leaves other devices alone."""

import torch

from gpt.device import configure_matmul


def test_tf32_only_on_cuda(monkeypatch):
    precisions = []  # recorded, not applied: torch's global matmul setting must not leak into other tests
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precisions.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # put back as it was after the test
    configure_matmul(torch.device("cpu"))
    assert precisions == [] and not torch.backends.cudnn.allow_tf32
    configure_matmul(torch.device("cuda"))  # sets torch's flags; needs no GPU to do so
    assert precisions == ["high"] and torch.backends.cudnn.allow_tf32
