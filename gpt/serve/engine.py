"""Batched decoding for the server: the sequences of every request to one model share one batch and one KV cache.

A thread per model runs the loop of gpt.inference.decoding.stream (left padding, prefill, one decode_step per token, the
context sliding by half past block_size), with what a server adds: sequences join and leave between steps, and each
samples with its own settings and its own torch.Generator (gpt.inference.sampling.sample_next on its row), so a request
gets the text it would get alone, the text scripts/generate.py prints for the same seed and settings. A sequence that
joins, or a context that slides, rebuilds the batch's cache with one prefill of every row's context (what stream does
after a slide); finished rows are dropped at the next rebuild, or once they are half the batch.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from gpt.errors import UserError
from gpt.inference.decoding import decode_step, left_pad, prefill, slide
from gpt.inference.sampling import sample_rows
from gpt.inference.text import TextStream
from gpt.model import GPT
from gpt.model.kv_cache import KVCache
from gpt.tokenizers.tokenizer import Tokenizer

log = logging.getLogger("gpt.serve")


@dataclass(frozen=True)
class Sampling:
    """One sequence's settings, with generate.py's meaning (temperature 0 is greedy); stop_tokens end it unseen."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_tokens: frozenset[int] = frozenset()


@dataclass
class Output:
    """What one step gave one sequence: new text (whole characters, none of a stop string), the token sampled
    (None for a stop token, not part of the text), and once it ended why: stop, length, or error (with the message)."""

    text: str
    token: int | None
    finish_reason: str | None = None
    error: str | None = None


class _Pieces(list):
    """TextStream's output: the text it writes, kept until the step hands it over."""

    def write(self, text: str) -> None:
        self.append(text)

    def flush(self) -> None:
        pass


class Sequence:
    """One prompt being continued: its tokens, where its context starts, its generator, its text so far."""

    def __init__(self, prompt: list[int], sampling: Sampling, tokenizer: Tokenizer,
                 deliver: Callable[[Output], None], device: torch.device | str = "cpu") -> None:
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        self.ids = list(prompt)
        self.prompt_tokens = len(prompt)
        self.start = 0  # where the context begins (gpt.inference.decoding.slide moves it)
        self.sampling = sampling
        self.generator = torch.Generator(device=device).manual_seed(sampling.seed)
        self._pieces = _Pieces()
        self._text = TextStream(tokenizer, self._pieces, list(sampling.stop))
        self.generated = 0  # tokens sampled, a stop token included
        self.finish_reason: str | None = None
        self.cancelled = False  # the client went away: dropped at the next step, nothing more delivered
        self.deliver = deliver

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.cancelled

    def take(self, token: int) -> Output:
        """Add one sampled token by generate.py's rules: a stop token or a stop string ends the sequence (finish
        reason stop), max_tokens ends it (length); held-back text is written when it ends."""
        self.generated += 1
        if token in self.sampling.stop_tokens:
            self._text.close()
            self.finish_reason = "stop"
        else:
            self.ids.append(token)
            if not self._text.add(token):
                self.finish_reason = "stop"
            elif self.generated >= self.sampling.max_tokens:
                self._text.close()
                self.finish_reason = "length"
        text = "".join(self._pieces)
        self._pieces.clear()
        return Output(text, None if token in self.sampling.stop_tokens else token, self.finish_reason)


class QueueFull(Exception):
    """The engine's queue holds max_queue sequences already."""


def can_pad(model: GPT) -> bool:
    """Whether the model decodes prompts of different lengths in one batch (left padding): a design may refuse."""
    device = next(model.parameters()).device
    idx, key_mask, positions = left_pad([[0], [0, 0]], device)
    try:
        prefill(model, idx, positions, key_mask, KVCache(model.config, 2, device))
    except UserError:
        return False
    return True


class Engine:
    """Decodes the sequences submitted for one model, as many at once as max_batch, on a thread of its own."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, max_batch: int = 32, max_queue: int = 64,
                 autocast: Callable[[], AbstractContextManager] = nullcontext, name: str = "model") -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.max_queue, self.autocast = max_batch, max_queue, autocast
        self.device = next(model.parameters()).device
        self.lock = threading.Lock()  # one forward pass of the model at a time (attention pictures take it too)
        self.pads = can_pad(model)
        self.steps = 0  # model calls so far (prefills and decode steps)
        self._cond = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._rows: list[Sequence] = []  # the batch, in the order of the cache's rows
        self._cache: KVCache | None = None
        self._positions = self._next = torch.empty(0, dtype=torch.long)  # (B, 1) each: the last position, token
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"engine {name}", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Finish the current step, end every sequence with an error, and stop the thread."""
        self.halt()
        self._thread.join(timeout=30)

    def halt(self) -> None:
        """stop() without waiting for the thread (safe in a signal handler: the condition's lock is re-entrant)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue the sequences of one request, all or none (QueueFull when they do not fit)."""
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) + len(sequences) > self.max_queue:
                raise QueueFull(f"{len(self._waiting)} sequences are waiting (max_queue={self.max_queue})")
            self._waiting.extend(sequences)
            self._cond.notify()

    def cancel(self, sequences: list[Sequence]) -> None:
        """Stop decoding these sequences (their client went away); they leave the batch at the next step."""
        for seq in sequences:
            seq.cancelled = True

    def load(self) -> dict[str, int]:
        """How many sequences wait for a place in the batch, how many are being decoded, and the model calls so far
        (fewer calls than tokens served is batching at work)."""
        with self._cond:
            return {"waiting": sum(not s.cancelled for s in self._waiting),
                    "decoding": sum(not s.done for s in self._rows), "steps": self.steps}

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not any(not s.done for s in self._rows):
                    self._cond.wait()
                if self._stopping:
                    break
                joined = self._admit()
            try:
                self._step(joined)
            except Exception as err:  # a bug or a model that cannot run this batch: fail its sequences, go on serving
                log.exception("decoding step failed")
                self._fail(self._rows, f"decoding failed: {type(err).__name__}: {err}")
        with self._cond:
            self._fail([*self._rows, *self._waiting], "the server is shutting down")
            self._waiting.clear()

    def _admit(self) -> bool:
        """Move waiting sequences into the batch while there is room (called holding the condition's lock).

        A model that cannot left-pad takes a sequence only when its context is as long as the batch's."""
        live = [s for s in self._rows if not s.done]
        joined = False
        while self._waiting and len(live) < self.max_batch:
            seq = self._waiting[0]
            if not seq.cancelled and not self.pads and live and len(seq.ids) != len(live[0].ids) - live[0].start:
                break
            self._waiting.popleft()
            if not seq.cancelled:
                self._rows.append(seq)
                live.append(seq)
                joined = True
        return joined

    def _step(self, joined: bool) -> None:
        """One model call for the batch (a prefill when its rows changed or a context slid, else a decode step),
        then one token for each live row."""
        rows = self._rows
        starts = [s.start for s in rows]
        slid = slide([s.ids for s in rows], starts, self.model.config.block_size)
        for seq, start in zip(rows, starts):
            seq.start = start
        dead = sum(s.done for s in rows)
        # a finished row stops growing, so it never slides: a full cache (its context the longest) rebuilds too
        full = self._cache is not None and self._cache.length >= self.model.config.block_size
        if self._cache is None or joined or slid or full or 2 * dead >= len(rows):
            self._rows = rows = [s for s in rows if not s.done]
            if not rows:
                self._cache = None
                return
            logits = self._prefill(rows)
        else:
            self._positions = self._positions + 1
            with self.lock, self.autocast():
                logits = decode_step(self.model, self._next, self._positions, self._cache)
        self.steps += 1
        self._sample(rows, logits[:, : self.tokenizer.vocab_size])

    def _prefill(self, rows: list[Sequence]) -> Tensor:
        """A new cache holding every row's context (left-padded); the next token's logits (B, vocab)."""
        idx, key_mask, positions = left_pad([s.ids[s.start:] for s in rows], self.device)
        self._cache = KVCache(self.model.config, len(rows), self.device)
        with self.lock, self.autocast():
            logits = prefill(self.model, idx, positions, key_mask, self._cache)
        self._positions = positions[:, -1:]
        return logits

    def _sample(self, rows: list[Sequence], logits: Tensor) -> None:
        """Each live row's next token from its logits (B, vocab) and its own generator, rows with the same settings
        drawn together (gpt.inference.sampling.sample_rows); the outputs delivered."""
        groups: dict[tuple, list[int]] = {}
        for i, seq in enumerate(rows):
            if not seq.done:  # a finished row stays until the next rebuild; what it is fed does not matter
                s = seq.sampling
                groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
        tokens = [seq.ids[-1] for seq in rows]
        for (temperature, top_k, top_p), members in groups.items():
            drawn = sample_rows(logits[members], temperature, top_k, top_p, [rows[i].generator for i in members])
            for i, token in zip(members, drawn.flatten().tolist()):
                tokens[i] = token
        self._next = torch.tensor(tokens, device=self.device).view(-1, 1)
        outputs = [(rows[i], rows[i].take(tokens[i])) for members in groups.values() for i in members]
        for seq, output in outputs:
            seq.deliver(output)

    def _fail(self, sequences: list[Sequence], message: str) -> None:
        """End these sequences with an error output and start the next batch afresh."""
        for seq in sequences:
            if not seq.done:
                seq.finish_reason = "error"
                seq.deliver(Output("", None, "error", message))
        self._rows, self._cache = [], None
