"""Peak bytes of live tensors, counted exactly on any device (CPU included) by watching every operation.

The resident set of a CPU process (what gpt.bench.isolate gauges) also holds the allocator's free
lists and fragmentation, so it drifts from run to run; this counts the storages tensors hold, which is
what a plan in gpt.memory predicts and what torch.cuda.max_memory_allocated() reports on a GPU (less
the allocator's rounding). Temporaries inside a single fused kernel are not seen.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpt.device import autocast
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.train.config import TrainConfig
from gpt.train.optim import make_optimizer
from gpt.train.parallelize import apply_activation_checkpointing


class TensorMemory(TorchDispatchMode):
    """Inside ``with TensorMemory() as memory:`` every tensor an operation returns is counted while it lives.

    ``memory.peak`` is the largest total seen after any operation, ``memory.current`` the total at the last
    allocation (or reset_peak);
    ``reset_peak()`` starts a new peak from the current total; ``track(tensors)`` adds tensors made before.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}  # storage address -> (weak reference, bytes)
        self.current = 0
        self.peak = 0

    def track(self, tensors: Any) -> None:
        """Count tensors that exist already (made before the mode was entered), e.g. a model's parameters."""
        self._count(tensors)

    def reset_peak(self) -> None:
        self._sweep()
        self.peak = self.current

    def _count(self, tensors: Any) -> None:
        """Add the storages among ``tensors`` not counted yet; only a new storage can raise the peak."""
        new = []
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                storage = t.untyped_storage()
                known = self.live.get(storage.data_ptr())
                if known is None or known[0].expired():
                    new.append(storage)
        if new:
            self._sweep()  # frees before this allocation lower the total it adds to
            for storage in new:
                self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
            self.current = sum(nbytes for _, nbytes in self.live.values())
            self.peak = max(self.peak, self.current)

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[key]
        self.current = sum(nbytes for _, nbytes in self.live.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        self._count(out)
        return out


def measure_training_peak(config: GPTConfig, batch_size: int, seq_len: int, precision: str = "fp32",
                          checkpointing: bool = False, seed: int = 0) -> int:
    """Peak bytes of live tensors during the second training step (AdamW state exists) of ``config`` on CPU.

    Everything (model, optimizer, batch) is made inside the counter, so every byte is seen; the trainer's
    order is kept: forward under autocast, backward, AdamW step, gradients set to None.
    """
    device = torch.device("cpu")
    with TensorMemory() as memory:
        torch.manual_seed(seed)
        model = GPT(config)
        if checkpointing:
            apply_activation_checkpointing(model)
        optimizer = make_optimizer(model, TrainConfig(), device)
        tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1))
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        for _ in range(2):
            memory.reset_peak()
            with autocast(device, precision):
                logits, loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del logits, loss
    return memory.peak
