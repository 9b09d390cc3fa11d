"""The probe tasks: each draws (inputs, targets) batches from a numpy Generator, offline, the targets -1 everywhere but
the answer positions (the loss and the accuracy read those alone).

Semantics follow the papers' generators (read, not copied): multi-query associative recall from Zoology (Arora et
al. 2023, ``zoology/data/multiquery_ar.py``); MAD's six (Poli et al. 2024, ``mad/data/instances.py``); induction on a
repeated random sequence (Olsson et al. 2022); passkey retrieval (Mohtashami and Jaggi 2023), trained at one length
and scored at several (its layout is gpt.evaluation.positions.place_passkey, which scores a trained model's passkey
on corpus text too). gpt/probes/mad.py holds MAD's six, gpt/probes/corpus.py the corpus task (bits per byte by
length), gpt/probes/registry.py names them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpt.errors import ConfigError
from gpt.evaluation.positions import place_passkey

IGNORE = -1  # gpt.model.gpt.GPT's cross-entropy ignore_index


@dataclass
class TaskSettings:
    """The tasks' sizes (the ``probes`` node holds these too)."""

    seq_len: int = 64  # training context of every task (MQAR's too); passkey is scored at multiples of it
    vocab: int = 1024  # MQAR's vocabulary: keys from [1, vocab/2), values from [vocab/2, vocab) (Zoology: 8192)
    mqar_pairs: list[int] = field(default_factory=lambda: [4, 8, 16])  # one MQAR task per number of key-value pairs
    power_a: float = 0.01  # MQAR's query gaps: p(gap = g) ~ g^(a - 1), g = 1 .. space (Zoology's default)
    small_vocab: int = 32  # MAD's recall and copying tasks, induction and passkey: tokens besides the special ones
    noise_fraction: float = 0.2  # noisy recall: chance each pair is replaced by noise tokens (MAD's default)
    motif: int = 3  # fuzzy recall: keys and values are 1 .. motif tokens long
    copy_tokens: int = 8  # selective copying: tokens to copy; compression: the sequence is half the context
    memory_keys: int = 64  # memorisation: a fixed key -> value map of this many keys, learned in the weights
    passkey_digits: int = 4  # passkey: digits of the key, each from 10 tokens
    passkey_lengths: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # scored at these x seq_len
    corpus_lengths: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # corpus: bits per byte at x seq_len


class Task:
    """A probe: its vocabulary, its training length, the lengths it is scored at (metric name -> length), and
    sample(rng, n, length) -> (inputs, targets), two (n, length) int64 arrays."""

    name = ""
    lower_is_better = False  # accuracy: higher is better (the corpus task's bits per byte: lower)

    def __init__(self, s: TaskSettings) -> None:
        self.s = s
        self.length = s.seq_len
        self.check()

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def metrics(self) -> dict[str, int]:
        """Each score's name and the length it is measured at (one, the training length, for most tasks)."""
        return {self.name: self.length}

    def check(self) -> None:
        """Refuse settings the task cannot be built with, naming the setting."""

    def constants(self, seed: int) -> None:
        """Draw what every sequence of a run shares (memorisation's map), from the run's seed."""

    def sample(self, rng: np.random.Generator, n: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def held_out(self, rng: np.random.Generator, n: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Validation and test sequences: drawn as the training ones (the corpus task: from the val split)."""
        return self.sample(rng, n, length)


def shifted(seq: np.ndarray, answer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next-token inputs and targets from (n, L + 1) sequences: the target of position i is seq[i + 1] where
    ``answer[i + 1]`` marks an answer, else IGNORE."""
    return seq[:, :-1].copy(), np.where(answer[:, 1:], seq[:, 1:], IGNORE)


def without_replacement(rng: np.random.Generator, n: int, size: int, k: int,
                        logp: np.ndarray | None = None) -> np.ndarray:
    """(n, k) draws from range(size) without replacement (weighted by exp(logp), sequentially, as numpy's
    choice(replace=False, p=...)): the Gumbel top-k trick, one sort per row."""
    keys = rng.gumbel(size=(n, size)) + (0.0 if logp is None else logp)
    return np.argsort(-keys, axis=1, kind="stable")[:, :k]


class MQAR(Task):
    """Zoology's multi-query associative recall: ``pairs`` key-value pairs, then each key queried once at a gap
    drawn from a power law; the filler is random tokens; the answer is the value after each queried key."""

    def __init__(self, s: TaskSettings, pairs: int) -> None:
        self.pairs = pairs
        self.name = f"mqar@{pairs}"
        super().__init__(s)

    @property
    def vocab_size(self) -> int:
        return self.s.vocab

    def check(self) -> None:
        s, p = self.s, self.pairs
        if p < 1:
            raise ConfigError(f"probes.mqar_pairs: {p} pairs; each MQAR task needs at least 1")
        if 4 * p > s.seq_len or s.seq_len % 2:
            raise ConfigError(f"probes.mqar_pairs: {p} key-value pairs and their {p} queries need an even context of "
                              f"at least {4 * p} tokens, probes.seq_len is {s.seq_len}",
                              hint=f"at most {s.seq_len // 4} pairs, or a longer probes.seq_len")
        if s.vocab // 2 - 1 < p:
            raise ConfigError(f"probes.vocab={s.vocab} holds {max(0, s.vocab // 2 - 1)} keys, fewer than {p} pairs",
                              hint=f"probes.vocab >= {2 * p + 2} (Zoology uses 8192)")
        if not 0 < s.power_a <= 1:
            raise ConfigError(f"probes.power_a must be in (0, 1], got {s.power_a}")

    def sample(self, rng, n, length=None):
        V, p, L = self.s.vocab, self.pairs, length or self.length
        context = 2 * p
        keys = 1 + without_replacement(rng, n, V // 2 - 1, p)
        values = V // 2 + without_replacement(rng, n, V - V // 2, p)
        space = (L - context) // 2
        logp = (self.s.power_a - 1) * np.log(np.arange(1, space + 1))
        gaps = without_replacement(rng, n, space, p, logp)
        seq = rng.integers(0, V, size=(n, L + 1))  # Zoology's random_non_queries filler
        answer = np.zeros((n, L + 1), dtype=bool)
        rows = np.arange(n)[:, None]
        seq[:, 0:context:2], seq[:, 1:context:2] = keys, values
        seq[rows, context + 2 * gaps] = keys
        seq[rows, context + 2 * gaps + 1] = values
        answer[rows, context + 2 * gaps + 1] = True
        inputs, targets = shifted(seq, answer)
        after = context + 2 * gaps + 1  # Zoology's inputs hold filler there, not the answer (labels only)
        inside = after < L
        inputs[rows.repeat(p, 1)[inside], after[inside]] = rng.integers(0, V, size=int(inside.sum()))
        return inputs, targets


class Induction(Task):
    """Induction heads: a random sequence, then the same sequence again; from the second copy's second token on,
    each token is the one that followed the previous occurrence of the token before it."""

    name = "induction"

    @property
    def vocab_size(self) -> int:
        return self.s.small_vocab

    def check(self) -> None:
        if self.s.seq_len < 4:
            raise ConfigError(f"induction needs probes.seq_len >= 4, got {self.s.seq_len}")

    def sample(self, rng, n, length=None):
        L = length or self.length
        half = (L + 2) // 2  # the two copies cover the L + 1 tokens
        first = rng.integers(0, self.s.small_vocab, size=(n, half))
        seq = np.concatenate([first, first], axis=1)[:, :L + 1]
        answer = np.zeros(seq.shape, dtype=bool)
        answer[:, half + 1:] = True  # the second copy's first token has no earlier context to copy from
        return shifted(seq, answer)


class Passkey(Task):
    """Passkey retrieval: filler tokens, a key marker and ``passkey_digits`` digits at a random depth, more filler,
    a query marker, then the digits again (the answers). Trained at seq_len, scored at each passkey_lengths
    multiple: ``passkey@<k>x``."""

    name = "passkey"

    @property
    def vocab_size(self) -> int:
        return self.s.small_vocab + 12  # filler tokens, ten digits, the key and the query markers

    def metrics(self) -> dict[str, int]:
        return {f"passkey@{k}x": k * self.s.seq_len for k in self.s.passkey_lengths}

    def check(self) -> None:
        s = self.s
        if any(k < 1 for k in s.passkey_lengths) or not s.passkey_lengths:
            raise ConfigError(f"probes.passkey_lengths must be positive multiples of seq_len, got {s.passkey_lengths}")
        if s.passkey_digits < 1 or 2 * s.passkey_digits + 3 > s.seq_len:
            raise ConfigError(f"passkey: {s.passkey_digits} digits twice and two markers do not fit in probes.seq_len="
                              f"{s.seq_len}", hint=f"probes.passkey_digits <= {(s.seq_len - 3) // 2}")

    def sample(self, rng, n, length=None):
        L, d, F = length or self.length, self.s.passkey_digits, self.s.small_vocab
        key_mark, query_mark = F + 10, F + 11
        seq = rng.integers(0, F, size=(n, L + 1))
        digits = F + rng.integers(0, 10, size=(n, d))
        depth = rng.integers(0, L + 1 - 2 * d - 1 - 1, size=n)  # where the key marker goes, before the query
        return place_passkey(seq, np.array([key_mark]), np.array([query_mark]), digits, depth)
