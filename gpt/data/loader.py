"""Random contiguous windows from the prepared token files, read through a memory map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gpt import tokenizer as tok
from gpt.data.prepare import read_meta
from gpt.errors import UserError


class TokenData:
    """The train and val token streams of one prepared data set, and its tokenizer."""

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir)
        meta = read_meta(self.dir)
        if meta is None:
            raise UserError(f"no prepared data in {self.dir} (meta.json missing)", hint="run scripts/prepare.py first")
        self.meta = meta
        self.tokenizer = tok.from_meta(meta["tokenizer"])
        self.splits = {
            split: np.memmap(self.dir / f"{split}.bin", dtype=np.dtype(meta["dtype"]), mode="r")
            for split in ("train", "val")
        }

    def check_block_size(self, block_size: int) -> None:
        for split, data in self.splits.items():
            if len(data) < block_size + 1:
                raise UserError(
                    f"the {split} split of {self.dir} has {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}",
                    hint="use more text or a smaller model.block_size",
                )

    def batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        """batch_size random windows: inputs x and next-token targets y, both (batch_size, block_size)."""
        return self.windows(split, self.random_starts(split, batch_size, block_size, generator), block_size, device)

    def random_starts(self, split: str, batch_size: int, block_size: int, generator: torch.Generator) -> list[int]:
        """Start offsets of batch_size random windows; drawing them is all that advances the generator."""
        return torch.randint(len(self.splits[split]) - block_size, (batch_size,), generator=generator).tolist()

    def windows(self, split: str, starts: list[int], block_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The windows at ``starts``: inputs x and next-token targets y, both (len(starts), block_size)."""
        data = self.splits[split]
        window = np.stack([data[s : s + block_size + 1] for s in starts]).astype(np.int64)
        xy = torch.from_numpy(window)
        x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
