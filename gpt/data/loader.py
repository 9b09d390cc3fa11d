"""Contiguous windows from the prepared token shards, read through memory maps.

Each split is one token stream cut into shard files; a window may run from one shard into the next, so
the stream reads exactly as if it were one file (offsets are global).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gpt import tokenizer as tok
from gpt.data.meta import open_meta
from gpt.errors import UserError


class TokenStream:
    """One split's shards as a single read-only sequence of token ids: len() and slicing with a step of 1."""

    def __init__(self, folder: Path, shards: list[dict], dtype: np.dtype) -> None:
        self.maps = [np.memmap(folder / s["file"], dtype=dtype, mode="r") for s in shards if s["tokens"]]
        sizes = [len(m) for m in self.maps]  # equal to the recorded counts: gpt.data.meta.check_shards
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])  # shard i starts at offsets[i]
        self.dtype = np.dtype(dtype)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise IndexError("a token stream is sliced with step 1 only")
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        if stop <= self.offsets[first + 1]:  # within one shard: a view of its memory map
            return self.maps[first][start - self.offsets[first] : stop - self.offsets[first]]
        parts, at, shard = [], start, first
        while at < stop:
            end = min(stop, int(self.offsets[shard + 1]))
            parts.append(self.maps[shard][at - self.offsets[shard] : end - self.offsets[shard]])
            at, shard = end, shard + 1
        return np.concatenate(parts)


class TokenData:
    """The train and val token streams of one prepared data set, and its tokenizer."""

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir)
        self.meta = meta = open_meta(self.dir)  # schema, shard sizes and token ids checked (UserError)
        self.tokenizer = tok.from_meta(meta["tokenizer"])
        dtype = np.dtype(meta["dtype"])
        self.splits = {split: TokenStream(self.dir, meta["splits"][split]["shards"], dtype)
                       for split in ("train", "val")}

    def check_block_size(self, block_size: int) -> None:
        for split, data in self.splits.items():
            if len(data) < block_size + 1:
                raise UserError(
                    f"the {split} split of {self.dir} has {len(data)} tokens, "
                    f"fewer than block_size + 1 = {block_size + 1}",
                    hint="use more text or a smaller model.block_size",
                )

    def random_starts(self, split: str, batch_size: int, block_size: int, generator: torch.Generator) -> list[int]:
        """Start offsets of batch_size random windows; drawing them is all that advances the generator."""
        return torch.randint(len(self.splits[split]) - block_size, (batch_size,), generator=generator).tolist()

    def windows(self, split: str, starts: list[int], block_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The windows at ``starts``: inputs x and next-token targets y, both (len(starts), block_size)."""
        data = self.splits[split]
        window = np.stack([data[s : s + block_size + 1] for s in starts]).astype(np.int64)  # (B, block_size + 1)
        xy = torch.from_numpy(window)
        x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
