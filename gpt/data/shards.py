"""Fixed-size token shards, written append-only so that an interrupted preparation can continue from a checkpoint.

A split's token stream is cut into files ``<split>_000000.bin``, ``<split>_000001.bin``, ... of exactly
``shard_tokens`` tokens (the last holds the rest); a document may continue from one shard into the next.
``state()`` records the shards done, how far the open one got (after an fsync) and the largest id so far;
a writer built from that state truncates the open shard back to it and carries on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np


class ShardWriter:
    """Appends one split's tokens to numbered shard files of ``shard_tokens`` tokens each."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int,
                 state: dict[str, Any] | None = None) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, np.dtype(dtype), shard_tokens
        self.shards: list[dict[str, Any]] = list(state["shards"]) if state else []
        self.current = state["current"] if state else 0  # tokens already in the open shard
        self.completed = 0  # shards finished since the last state(), so the caller knows when to checkpoint
        self.max_token = state.get("max_token", -1) if state else -1  # the largest id written (-1: none yet)
        path = self.path(len(self.shards))
        if state:  # drop whatever was written after the checkpoint
            with open(path, "ab") as f:
                f.truncate(self.current * self.dtype.itemsize)
        else:
            path.unlink(missing_ok=True)
        for stale in folder.glob(f"{split}_*.bin"):
            if int(stale.stem.rsplit("_", 1)[1]) > len(self.shards):
                stale.unlink()
        self.file = open(path, "ab")

    def path(self, index: int) -> Path:
        return self.folder / f"{self.split}_{index:06d}.bin"

    def append(self, ids: np.ndarray) -> None:
        """Write ``ids`` (already of this writer's dtype), starting a new shard whenever one fills."""
        if ids.size:
            self.max_token = max(self.max_token, int(ids.max()))
        while ids.size:
            room = self.shard_tokens - self.current
            ids[:room].tofile(self.file)
            self.current += min(room, ids.size)
            ids = ids[room:]
            if self.current == self.shard_tokens:
                self.close_shard()

    def close_shard(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.shards.append({"file": self.path(len(self.shards)).name, "tokens": self.current})
        self.current, self.completed = 0, self.completed + 1
        self.file = open(self.path(len(self.shards)), "ab")

    def state(self) -> dict[str, Any]:
        """Shards done and tokens in the open shard, made durable first: what a restart continues from."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.completed = 0
        return {"shards": list(self.shards), "current": self.current, "max_token": self.max_token}

    def finish(self) -> list[dict[str, Any]]:
        """Close the open shard (dropped if empty, unless the split has no shard at all) and list every shard."""
        if self.current or not self.shards:
            self.close_shard()
        self.file.close()
        self.path(len(self.shards)).unlink(missing_ok=True)
        return self.shards
