"""MAD's six tasks (Poli et al. 2024, ``mad/data/instances.py``), in MAD's multi-query form: every answer a task
defines is scored, not a final probe alone.

Recall tasks: keys from the first half of ``small_vocab``, values from the second; a key keeps its value within a
sequence; the answer positions are the values of keys seen earlier. The copying tasks and memorisation align inputs
and targets as MAD does (the answer at a blank or insert token); the recall tasks predict the next token.
Compression is recast for a decoder: MAD decodes the sequence from the compression token's state alone (an
autoencoder); here the decoder reproduces the sequence after the compression token, from blank inputs.
"""

from __future__ import annotations

import numpy as np

from gpt.errors import ConfigError
from gpt.probes.tasks import IGNORE, Task, shifted, without_replacement


class InContextRecall(Task):
    """Key-value pairs over the whole context; a repeated key's value is an answer."""

    name = "in_context_recall"
    noise = 0.0

    @property
    def vocab_size(self) -> int:
        return self.s.small_vocab + (16 if self.noise else 0)  # MAD's noise vocabulary: 16 tokens of its own

    def check(self) -> None:
        if self.s.small_vocab < 4 or self.s.seq_len < 4 or self.s.seq_len % 2:
            raise ConfigError(f"{self.name} needs probes.small_vocab >= 4 and an even probes.seq_len >= 4, got "
                              f"{self.s.small_vocab} and {self.s.seq_len}")

    def sample(self, rng, n, length=None):
        L, half = length or self.length, self.s.small_vocab // 2
        pairs = L // 2 + 1
        keys = rng.integers(0, half, size=(n, pairs))
        values = half + rng.integers(0, self.s.small_vocab - half, size=(n, half))  # each key's value
        value = np.take_along_axis(values, keys, axis=1)
        real = rng.random((n, pairs)) >= self.noise  # MAD: a pair replaced by two noise tokens, with this chance
        earlier = np.tril(keys[:, :, None] == keys[:, None, :], -1) & real[:, None, :]
        answer_pair = earlier.any(axis=2) & real
        seq = np.stack([keys, value], axis=2).reshape(n, 2 * pairs)
        noise = self.s.small_vocab + rng.integers(0, 16, size=(n, 2 * pairs))
        seq = np.where(real.repeat(2, axis=1), seq, noise)[:, :L + 1]
        answer = np.stack([np.zeros_like(answer_pair), answer_pair], axis=2).reshape(n, 2 * pairs)[:, :L + 1]
        return shifted(seq, answer)


class NoisyRecall(InContextRecall):
    """In-context recall with pairs replaced by noise tokens (probes.noise_fraction of them)."""

    name = "noisy_recall"

    @property
    def noise(self) -> float:  # type: ignore[override]
        return self.s.noise_fraction

    def check(self) -> None:
        super().check()
        if not 0 < self.s.noise_fraction < 1:
            raise ConfigError(f"probes.noise_fraction must be in (0, 1), got {self.s.noise_fraction}")


class FuzzyRecall(Task):
    """Keys and values of 1 .. probes.motif tokens (distinct tokens each, as MAD's permutations); a repeated key's
    value tokens are answers. Sequences are left-padded to the length with a pad token."""

    name = "fuzzy_recall"

    @property
    def vocab_size(self) -> int:
        return self.s.small_vocab + 1  # the pad token

    def check(self) -> None:
        if not 1 <= self.s.motif <= self.s.small_vocab // 2 or 4 * self.s.motif > self.s.seq_len:
            raise ConfigError(f"fuzzy_recall: probes.motif={self.s.motif} must be in [1, small_vocab/2] and 4 motifs "
                              f"must fit in probes.seq_len={self.s.seq_len}")

    def sample(self, rng, n, length=None):
        L, half, m = length or self.length, self.s.small_vocab // 2, self.s.motif
        seq = np.full((n, L + 1), self.s.small_vocab)
        answer = np.zeros((n, L + 1), dtype=bool)
        for row in range(n):
            tokens, marks, kv = [], [], {}
            while True:
                k_size, v_size = rng.integers(1, m + 1, size=2)
                key = tuple(rng.choice(half, size=k_size, replace=False).tolist())
                value = kv.get(key) or tuple((half + rng.choice(self.s.small_vocab - half, size=v_size,
                                                                replace=False)).tolist())
                if len(tokens) + len(key) + len(value) > L + 1:
                    break
                tokens += [*key, *value]
                marks += [False] * len(key) + [key in kv] * len(value)
                kv[key] = value
            seq[row, L + 1 - len(tokens):] = tokens
            answer[row, L + 1 - len(tokens):] = marks
        return shifted(seq, answer)


class SelectiveCopying(Task):
    """probes.copy_tokens tokens scattered among blanks, a copy token, then blanks at which the tokens are
    answered in order."""

    name = "selective_copying"

    @property
    def vocab_size(self) -> int:
        return self.s.small_vocab + 2  # blank, copy

    def check(self) -> None:
        if self.s.copy_tokens < 1 or self.s.seq_len <= 2 * self.s.copy_tokens + 1:
            raise ConfigError(f"selective_copying: probes.seq_len={self.s.seq_len} must exceed twice "
                              f"probes.copy_tokens={self.s.copy_tokens} plus one")

    def sample(self, rng, n, length=None):
        L, c, V = length or self.length, self.s.copy_tokens, self.s.small_vocab
        blank, copy = V, V + 1
        body = L - c - 1
        to_copy = rng.integers(0, V, size=(n, c))
        where = np.sort(without_replacement(rng, n, body, c), axis=1)
        inputs = np.full((n, L), blank)
        np.put_along_axis(inputs, where, to_copy, axis=1)
        inputs[:, body] = copy
        targets = np.full((n, L), IGNORE)
        targets[:, body + 1:] = to_copy
        return inputs, targets


class Compression(Task):
    """A random sequence of (seq_len - 1) / 2 tokens, a compression token, then blanks at which the sequence is
    answered in order (MAD's compression, recast for a decoder: see the module's docstring)."""

    name = "compression"

    @property
    def vocab_size(self) -> int:
        return self.s.small_vocab + 2  # blank, compression

    def check(self) -> None:
        if self.s.seq_len < 3:
            raise ConfigError(f"compression needs probes.seq_len >= 3, got {self.s.seq_len}")

    def sample(self, rng, n, length=None):
        L, V = length or self.length, self.s.small_vocab
        k = (L - 1) // 2
        source = rng.integers(0, V, size=(n, k))
        inputs = np.full((n, L), V)
        inputs[:, :k], inputs[:, k] = source, V + 1
        targets = np.full((n, L), IGNORE)
        targets[:, k + 1:2 * k + 1] = source
        return inputs, targets


class Memorization(Task):
    """A fixed map of probes.memory_keys keys to values (a bijection drawn once per seed): (key, insert) pairs,
    the key's value answered at the insert token. Nothing in the context tells it: the weights must."""

    name = "memorization"

    @property
    def vocab_size(self) -> int:
        return 2 * self.s.memory_keys + 1  # keys, values, insert

    def check(self) -> None:
        if self.s.memory_keys < 2 or self.s.seq_len < 2:
            raise ConfigError(f"memorization needs probes.memory_keys >= 2 and probes.seq_len >= 2, got "
                              f"{self.s.memory_keys} and {self.s.seq_len}")
        self.map = np.arange(self.s.memory_keys)

    def constants(self, seed: int) -> None:
        K = self.s.memory_keys
        self.map = K + np.random.default_rng([seed, 7]).permutation(K)

    def sample(self, rng, n, length=None):
        L, K = length or self.length, self.s.memory_keys
        keys = rng.integers(0, K, size=(n, (L + 1) // 2))
        inputs = np.stack([keys, np.full_like(keys, 2 * K)], axis=2).reshape(n, -1)[:, :L]
        targets = np.stack([np.full_like(keys, IGNORE), self.map[keys]], axis=2).reshape(n, -1)[:, :L]
        return inputs, targets


TASKS = {t.name: t for t in (InContextRecall, NoisyRecall, FuzzyRecall, SelectiveCopying, Compression, Memorization)}
