"""The corpus probe (Press et al. 2022, Figure 1's shape): a design trained on windows of the corpus at the card's
context T (probes.seq_len), scored by held-out bits per byte at each probes.corpus_lengths multiple of it:
``corpus@1x``, ``corpus@2x``, ... Lower is better; the card tests it in that direction.

The model is built with the longest length's context, so a learned position table (GPT-2's wpe) holds rows past T
that training never reaches (no gradient, only AdamW's decay): past T it meets positions it never learned, as
Press et al. evaluated learned and sinusoidal positions. Training windows come from the train split, validation and
test windows from the val split (two streams of the run's seed). The loss is gpt.evaluation.positions' per-token
cross-entropy, the bytes gpt.evaluation.heldout's, as scripts/eval.py scores a checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from gpt.errors import ConfigError, UserError
from gpt.probes.tasks import Task, TaskSettings

PLACEHOLDER_VOCAB = 256  # the vocabulary a plan assumes before the data is opened (validation only: no run uses it)


class Corpus(Task):
    """Next-token prediction on the corpus: every position is an answer; scored in bits per byte by length."""

    name = "corpus"
    lower_is_better = True

    def __init__(self, s: TaskSettings, data=None) -> None:
        self.data = data  # a gpt.data.loader.TokenData, or None while the plan is only validated
        super().__init__(s)

    @property
    def vocab_size(self) -> int:
        return self.data.tokenizer.vocab_size if self.data is not None else PLACEHOLDER_VOCAB

    def metrics(self) -> dict[str, int]:
        return {f"corpus@{k}x": k * self.s.seq_len for k in self.s.corpus_lengths}

    def check(self) -> None:
        lengths = self.s.corpus_lengths
        if not lengths or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in lengths):
            raise ConfigError(f"probes.corpus_lengths must be positive multiples of probes.seq_len, got {lengths}",
                              hint="e.g. probes.corpus_lengths=[1,2,4,8]")
        if len(set(lengths)) != len(lengths):
            raise ConfigError(f"probes.corpus_lengths names a length twice: {lengths}")
        if self.data is not None:
            need = max(self.metrics().values()) + 1
            for split, tokens in self.data.splits.items():
                if len(tokens) < need + 1:
                    raise UserError(f"the {split} split of {self.data.dir} has {len(tokens)} tokens, fewer than "
                                    f"one corpus window of {need}", hint="shorter probes.corpus_lengths or "
                                    "probes.seq_len, or more text")

    def windows(self, split: str, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` windows of ``length + 1`` tokens at random offsets of ``split``: inputs and next-token targets."""
        if self.data is None:
            raise ConfigError("the corpus task has no data opened (gpt.probes.corpus.open_corpus)")
        tokens = self.data.splits[split]
        starts = rng.integers(0, len(tokens) - length - 1, size=n)
        xy = np.stack([np.asarray(tokens.read(int(a), int(a) + length + 1), dtype=np.int64) for a in starts])
        return xy[:, :-1].copy(), xy[:, 1:].copy()

    def sample(self, rng, n, length=None):
        return self.windows("train", rng, n, length or self.length)

    def held_out(self, rng, n, length=None):
        return self.windows("val", rng, n, length or self.length)

    def score(self, model: torch.nn.Module, inputs: np.ndarray, targets: np.ndarray, device: torch.device,
              batch_size: int) -> float:
        """Bits per byte: the summed cross-entropy of every target, in bits, over the UTF-8 bytes they stand for."""
        from gpt.evaluation.heldout import byte_lengths
        from gpt.evaluation.positions import token_losses

        table = torch.from_numpy(byte_lengths(self.data.tokenizer, model.config.vocab_size))
        nats = 0.0
        size = 0
        for start in range(0, len(inputs), batch_size):
            x = torch.from_numpy(inputs[start:start + batch_size]).to(device)
            y = torch.from_numpy(targets[start:start + batch_size]).to(device)
            nats += float(token_losses(model, x, y).sum())
            size += int(table[y.cpu()].sum())
        if not size:
            raise UserError("the corpus's held-out windows hold no bytes to score (only special tokens)")
        return nats / math.log(2) / size


def open_corpus(data_config) -> object:
    """The card's corpus (gpt.data.loader.TokenData), prepared first if it is not (as scripts/train.py does)."""
    from gpt.data.loader import TokenData
    from gpt.data.prepare import prepare

    return TokenData(Path(prepare(data_config, log=lambda message: None)))
