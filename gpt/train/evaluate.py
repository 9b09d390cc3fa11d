"""Evaluation during training: the mean loss of each split over the same fixed batches at every evaluation."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpt.data.loader import TokenData
from gpt.train import distributed
from gpt.train.distributed import Ranks


@torch.no_grad()
def estimate_loss(model: nn.Module, data: TokenData, *, batches: int, batch_size: int, block_size: int, seed: int,
                  device: torch.device, autocast: contextlib.AbstractContextManager, ranks: Ranks,
                  stop: Callable[[], bool] = lambda: False) -> dict[str, float] | None:
    """Mean loss over ``batches`` random batches of each split, the same ones every time (seeded), shared by ranks.
    None when ``stop()`` turned true (a stop signal): checked before every batch on one rank, so a long evaluation
    is left within a batch's time; with several ranks between the splits, where they agree on it."""
    model.eval()
    generator = torch.Generator().manual_seed(seed + 1)
    losses: dict[str, float] | None = {}
    for split in ("train", "val"):
        total = torch.zeros(3, device=device)  # loss sum, batch count, ranks that were asked to stop
        for i in range(batches):
            if ranks.world_size == 1 and stop():
                break
            starts = data.random_starts(split, batch_size, block_size, generator)  # every rank draws every batch
            if i % ranks.world_size != ranks.rank:
                continue
            x, y, *extra = data.windows(split, starts, block_size, device)  # chat data: positions, mask
            with autocast:
                _, loss = model(x, y, **(extra[0] if extra else {}))
            total[0] += loss.float()
            total[1] += 1
        total[2] = float(stop())
        distributed.all_reduce_sum(total, ranks)
        if total[2].item() > 0:
            losses = None
            break
        losses[split] = (total[0] / total[1]).item()
    model.train()
    return losses


def val_metrics(loss: float, split_meta: dict[str, Any]) -> dict[str, float | None]:
    """Perplexity exp(loss) and bits per byte of a split's loss (nats per token), the latter estimated with the
    split's own bytes per token from meta.json: loss / ln 2 * tokens / bytes (None when meta.json lacks them)."""
    tokens, n_bytes = split_meta.get("tokens"), split_meta.get("bytes")
    return {"ppl": math.exp(min(loss, 700.0)),
            "bpb": loss / math.log(2) * tokens / n_bytes if tokens and n_bytes else None}
