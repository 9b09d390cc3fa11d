"""train.passkey: a fraction of every training micro-batch's rows turned into passkey sequences, so a model learns to
copy a key from far back while it learns the corpus (as long-context training mixes retrieval data in).

Each such row is its own training window with the evaluation's passkey placed in it (gpt.evaluation.positions:
``long.key``'s default line and 4 digits at a random depth, the line again at the end), its loss on the final digits
only; the other rows are the corpus's windows as they were. The digits and depths come from the run's seed and the
rows' window starts alone, so the mix adds no state: a resumed run draws the very same sequences. By default a
passkey row's 4 digits count as 4 tokens of the batch's mean loss (about 1% of it with a quarter of the rows);
train.passkey_weight gives the passkey rows' mean loss that share of the step's loss instead, the text rows' the rest.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from gpt.errors import ConfigError, UserError
from gpt.evaluation.config import LongConfig
from gpt.evaluation.positions import IGNORE, draw_passkey, passkey_tokens
from gpt.tokenizers.tokenizer import Tokenizer

DIGITS, KEY = LongConfig.digits, LongConfig.key  # the format task=passkey scores by default


class PasskeyMix:
    """The first round(fraction * batch_size) rows of each micro-batch become passkey sequences."""

    def __init__(self, fraction: float, batch_size: int, block_size: int, tokenizer: Tokenizer, seed: int,
                 weight: float | None = None) -> None:
        self.rows, self.seed, self.weight = round(fraction * batch_size), seed, weight
        if self.rows == 0:
            raise ConfigError(f"train.passkey={fraction} gives no passkey row in a micro-batch of "
                              f"train.batch_size={batch_size}", hint=f"train.passkey >= {0.5 / batch_size:.3g}, or 0")
        try:
            self.key, self.digit_ids = passkey_tokens(tokenizer, block_size, DIGITS, KEY)
        except UserError as err:  # the key's characters or a digit not in the vocabulary, or no room for it
            raise ConfigError(f"train.passkey: {err.args[0]}", hint=f"{err.hint or 'another corpus'}; or "
                              "train.passkey=0") from None

    def apply(self, x: torch.Tensor, y: torch.Tensor, tokens, starts: list[int]) -> None:
        """Turn the first rows of the micro-batch ``x``, ``y`` (windows of ``tokens`` at ``starts``) into passkey
        sequences, in place."""
        length = x.size(1)
        windows = np.stack([np.asarray(tokens.read(s, s + length + 1), dtype=np.int64) for s in starts[:self.rows]])
        rng = np.random.default_rng([self.seed, *starts[:self.rows]])
        inputs, targets = draw_passkey(windows, self.key, self.digit_ids, DIGITS, rng)
        x[:self.rows] = torch.from_numpy(inputs).to(x.device)
        y[:self.rows] = torch.from_numpy(targets).to(y.device)

    def loss(self, logits: torch.Tensor, y: torch.Tensor, loss: torch.Tensor | None) -> torch.Tensor:
        """The step's loss: the model's own (every target alike), or with a weight, the passkey rows' mean loss
        weighted by it and the other rows' by the rest (the Trainer then asks the model for no loss of its own)."""
        if self.weight is None:
            return loss
        flat = logits.float().flatten(0, 1)
        losses = F.cross_entropy(flat, y.flatten(), ignore_index=IGNORE, reduction="none").view_as(y)
        passkey = losses[:self.rows].sum() / (y[:self.rows] != IGNORE).sum()
        text = losses[self.rows:].sum() / (y[self.rows:] != IGNORE).sum().clamp(min=1)
        return self.weight * passkey + (1 - self.weight) * text
