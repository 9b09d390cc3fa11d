"""Batched decoding for the server: the sequences of every request to one model share one decode step.

A thread per model runs the loop of gpt.inference.decoding.stream (prefill, one decode_step per token, the context
sliding by half past block_size) over the slots of a cache pool (gpt.serve.cache_pool): the sequences joining in one
step are prefilled together straight into free slots (one left-padded forward; a prefix cache hit or a chunk of a
long prompt alone; one whose prompt shares blocks with a prefill in flight waits for them, a step or a few, and
finds them in the prefix cache), every step then decodes all slots in use at once, a finished or cancelled one
gives its slot back at once; nothing is rebuilt. Each samples with its own settings and its own torch.Generator
(gpt.inference.decoding.sample_rows), so a request gets the text it would get alone, the text scripts/generate.py
prints for the same seed and settings. A context that slides is prefilled again, as stream does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from gpt.errors import UserError
from gpt.inference.decoding import left_pad, prefill, sample_rows
from gpt.inference.text import TextStream
from gpt.model import GPT
from gpt.model.kv_cache import KVCache, endless, refusal
from gpt.serve.cache_pool import SlotPool, SoloPool, pooled, sized
from gpt.serve.prefix_cache import PrefixCache, cacheable, layer_tensors
from gpt.serve.speculate import guesses_for, keep, speculable, verify
from gpt.tokenizers.tokenizer import Tokenizer

log = logging.getLogger("gpt.serve")
RATE_SECONDS = 10.0  # the window /metrics' tokens per second is measured over
SHUTTING_DOWN = "the server is shutting down"  # why sequences still decoding end when the server stops
WAIT_STEPS = 16  # steps a sequence may wait for a prefill in flight to publish the blocks its prompt shares


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
        self.waited = 0  # steps it waited for blocks a prefill in flight computes (Engine._waits)
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


@dataclass
class _Filling:
    """A sequence being prefilled: its one-row cache (None until it is prefilled alone), its context, how many
    of its tokens the cache holds, and the keys of the blocks it will put in the prefix cache."""

    seq: Sequence
    cache: KVCache | None
    context: list[int]
    done: int
    keys: frozenset[int] = frozenset()


class QueueFull(Exception):
    """The engine's queue holds max_queue sequences already."""


class Engine:
    """Decodes the sequences submitted for one model, as many at once as max_batch (the pool's slots), on a thread of
    its own."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, max_batch: int = 32, max_queue: int = 64,
                 autocast: Callable[[], AbstractContextManager] = nullcontext, name: str = "model",
                 prefix_blocks: int = 0, prefill_chunk: int = 0, speculate: int = 0) -> None:
        if refusal(model.config):  # every sequence decodes in a KV cache here: refuse before serving anyone
            raise UserError(f"the server decodes with a KV cache, which this model cannot: {refusal(model.config)}",
                            hint="sample it with scripts/generate.py kv_cache=false")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.max_queue, self.autocast = max_batch, max_queue, autocast
        self.device = next(model.parameters()).device
        self.lock = threading.Lock()  # one forward pass of the model at a time (attention pictures take it too)
        self.pool = (SlotPool if pooled(model) else SoloPool)(model, max_batch, self.device)
        self.endless = endless(model.config)  # a window's ring: decoding runs past block_size, never slides
        cacheable_ = isinstance(self.pool, SlotPool) and cacheable(KVCache(model.config, 1, self.device))
        self.prefix = PrefixCache(prefix_blocks) if prefix_blocks and cacheable_ else None  # None: no prefix cache
        # tokens of prompts prefilled per step, between decode steps (0: whole prompts); a ring cannot take chunks
        rings = any(kind.window is not None for kind in KVCache(model.config, 1, self.device).slots.values())
        self.prefill_chunk = 0 if rings else prefill_chunk
        self._filling: list[_Filling] = []  # sequences being prefilled, in order
        # guesses per prompt-lookup step for a greedy sequence alone in the pool (gpt.serve.speculate); 0: none
        self.speculate = speculate if isinstance(self.pool, SlotPool) and speculable(self.pool) else 0
        self.drafted = self.accepted = 0  # guesses verified, and kept
        self.steps = 0  # model calls so far (prefills and decode steps)
        self.tokens = 0  # tokens sampled so far
        self.prompt_tokens = 0  # tokens prefilled so far
        self.refused = 0  # sequences refused with QueueFull
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of the steps of the last RATE_SECONDS
        self._cond = threading.Condition()
        self._waiting: deque[Sequence] = deque()
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
                raise QueueFull(SHUTTING_DOWN)
            if len(self._waiting) + len(sequences) > self.max_queue:
                self.refused += len(sequences)
                raise QueueFull(f"{len(self._waiting)} sequences are waiting (max_queue={self.max_queue})")
            self._waiting.extend(sequences)
            self._cond.notify()

    def cancel(self, sequences: list[Sequence]) -> None:
        """Stop decoding these sequences (their client went away); their slots are given back before the next step."""
        with self._cond:
            for seq in sequences:
                seq.cancelled = True
            self._cond.notify()

    def load(self) -> dict[str, int]:
        """How many sequences wait for a slot, how many are being decoded, and the model calls so far (fewer calls
        than tokens served is batching at work)."""
        with self._cond:
            return {"waiting": sum(not s.cancelled for s in self._waiting),
                    "decoding": sum(not s.done for s in self.pool.rows) + len(self._filling), "steps": self.steps}

    def metrics(self) -> dict[str, float]:
        """load() and what /metrics reports besides: slots, tokens and their rate, prompt tokens, refusals."""
        now = time.monotonic()
        with self._cond:
            recent = [(t, n) for t, n in self._recent if t > now - RATE_SECONDS]
            return {"waiting": sum(not s.cancelled for s in self._waiting),
                    "running": sum(not s.done for s in self.pool.rows) + len(self._filling),
                    "slots_used": len(self.pool.rows) + len(self._filling),
                    "slots": self.pool.slots, "tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
                    "tokens_per_s": sum(n for _, n in recent) / RATE_SECONDS, "steps": self.steps,
                    "refused": self.refused, "prefix_hit_rate": self.prefix.hit_rate if self.prefix else 0.0,
                    "prefix_reused_tokens": self.prefix.reused if self.prefix else 0,
                    "prefix_blocks": len(self.prefix.blocks) if self.prefix else 0,
                    "speculated": self.drafted, "speculation_accepted": self.accepted,
                    "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0}

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the tokens the waiting sequences may ask for (their max_tokens) at
        the recent tokens per second, between 1 and 60."""
        with self._cond:
            wanted = sum(s.sampling.max_tokens for s in self._waiting if not s.cancelled)
        return max(1, min(60, round(wanted / max(self.metrics()["tokens_per_s"], 1.0))))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self.pool.rows and not self._filling:
                    self._cond.wait()
                if self._stopping:
                    break
                joined = self._admit()
            try:
                self._step(joined)
            except Exception as err:  # a bug or a model that cannot run this batch: fail its sequences, go on serving
                log.exception("decoding step failed")
                self._fail([*self.pool.rows, *joined], f"decoding failed: {type(err).__name__}: {err}")
        with self._cond:
            self._fail([*self.pool.rows, *self._waiting], SHUTTING_DOWN)
            self._waiting.clear()

    def _admit(self) -> list[Sequence]:
        """Take waiting sequences while the pool has free slots (called holding the condition's lock); slots of
        finished or cancelled sequences are given back first."""
        for row in reversed(range(len(self.pool.rows))):
            if self.pool.rows[row].done:
                self.pool.release(row)
        joined: list[Sequence] = []
        while self._waiting and len(joined) < self.pool.free - len(self._filling):
            seq = self._waiting.popleft()
            if not seq.done:  # cancelled, or failed while it waited for a prefill in flight
                joined.append(seq)
        return joined

    def _step(self, joined: list[Sequence]) -> None:
        """One decode step for the slots in use, then prefills (of sequences joining or whose context slides) up to
        prefill_chunk tokens, so a long prompt does not stall the others; one token for each row decoded and each
        prefill completed."""
        pool, block = self.pool, self.model.config.block_size
        refill = []
        for row in reversed(range(len(pool.rows))):
            seq = pool.rows[row]
            if len(seq.ids) - seq.start > block and not self.endless:  # stream's slide: its last block_size // 2
                # tokens, prefilled again (a window's ring never slides: it decodes on past block_size, as stream)
                seq.start = len(seq.ids) - block // 2
                refill.append(pool.release(row))
        waiting = []  # joining sequences that wait for blocks a prefill in flight computes (one joined just now too)
        for seq in [*reversed(refill), *joined]:
            if self._waits(seq):
                waiting.append(seq)
            else:
                self._filling.append(self._begin(seq))
        if waiting:  # first in line again, to find those blocks in the prefix cache next step
            with self._cond:
                self._waiting.extendleft(reversed(waiting))
        self._filling = [f for f in self._filling if not f.seq.cancelled]
        if self.speculate and not self._filling and pool.rows and pool.rows[0].sampling.temperature == 0.0:
            guesses = guesses_for(pool, pool.rows[0].ids, self.speculate)
            if guesses:
                self._speculate(guesses)
                return
        logits = []
        if pool.rows:
            with self.lock, self.autocast():
                logits.append(pool.decode(self.model))
            self.steps += 1
        logits += self._prefill()
        if logits:
            self._sample(list(pool.rows), torch.cat(logits)[:, : self.tokenizer.vocab_size])

    def _speculate(self, guesses: list[int]) -> None:
        """One forward pass checks the guesses; the greedy sequence gets the ones its argmax agrees with and the
        model's token after them, each delivered as a step would deliver it."""
        seq = self.pool.rows[0]
        with self.lock, self.autocast():
            logits = verify(self.model, self.pool, guesses)
        self.steps += 1
        chosen = logits[:, : self.tokenizer.vocab_size].argmax(dim=-1).tolist()
        kept = 0
        while kept < len(guesses) and chosen[kept] == guesses[kept]:
            kept += 1
        self.drafted, self.accepted = self.drafted + len(guesses), self.accepted + kept
        keep(self.pool, 1 + len(guesses), 1 + kept)
        emitted = [*guesses[:kept], chosen[kept]]
        self.pool.feed(emitted[-1:])
        outputs = []
        for token in emitted:
            if seq.done:
                break
            outputs.append(seq.take(token))
        self._count(len(outputs))
        if seq.done:
            self._keep_prefix(0)
            self.pool.release(0)
        for output in outputs:
            seq.deliver(output)

    def _waits(self, seq: Sequence) -> bool:
        """Whether a joining sequence's first block the prefix cache lacks is one a prefill in flight will put there:
        it then waits a step (WAIT_STEPS at most, first in line) and finds it, rather than computing it again, so
        prompts that share a system prompt and arrive together compute it once (vLLM and SGLang share it too)."""
        if self.prefix is None or seq.start != 0 or seq.waited >= WAIT_STEPS:
            return False
        coming = frozenset().union(*(f.keys for f in self._filling if not f.seq.cancelled))
        for key, _, _ in PrefixCache.hashes(seq.ids[:-1]):
            if key not in self.prefix.blocks:
                if key in coming:
                    seq.waited += 1
                    return True
                return False
        return False

    def _begin(self, seq: Sequence) -> _Filling:
        """A sequence to prefill (as generate.py does), its context's cached prefix already in a cache of its own;
        without one, its cache is made when it is prefilled alone (else it joins the step's batched prefill)."""
        context = seq.ids[seq.start:]
        cache, cached, keys = None, 0, frozenset()
        if self.prefix is not None and seq.start == 0:  # a slid context's positions no longer match a prompt's
            cached, blocks = self.prefix.lookup(context)
            keys = frozenset(key for key, _, _ in PrefixCache.hashes(context))
            if cached:
                cache = self._one_row(len(context))
                self.prefix.fill(cache, blocks)
        self.prompt_tokens += len(context)
        return _Filling(seq, cache, context, cached, keys)

    def _one_row(self, tokens: int) -> KVCache:
        """A one-row cache for a sequence prefilled alone: as long as its context when it goes to the pool's slots
        (cache_pool.sized), else (SoloPool decodes in it) block_size."""
        cache = KVCache(self.model.config, 1, self.device)
        return sized(cache, tokens) if isinstance(self.pool, SlotPool) else cache

    def _prefill(self) -> list[Tensor]:
        """Prefill up to prefill_chunk tokens (0: every context whole), in order: contexts that start from nothing
        and fit the budget left go into one batched prefill straight into their slots (SlotPool.prefill; one that
        fits a chunk but not what is left waits for the next step), others (a prefix cache hit, a prompt longer than
        a chunk, SoloPool's) alone, chunk by chunk; the next-token logits of those completed, in the order
        their rows entered the pool."""
        budget = self.prefill_chunk or sum(len(f.context) - f.done for f in self._filling)
        logits, batch = [], []
        for filling in list(self._filling):
            left = len(filling.context) - filling.done
            if budget <= 0:
                break
            if filling.cache is None and left <= (self.prefill_chunk or left) and self._joins(batch, filling):
                if left <= budget:  # a prompt that fits one chunk waits for the next step's batch rather than
                    batch.append(filling)  # being split into a prefill of its own
                    budget -= left
                continue
            n = min(budget, left)
            budget -= n
            if filling.cache is None:
                filling.cache = self._one_row(len(filling.context))
            done = self._advance(filling, n)
            if done is not None:
                logits.append(done)
                self._filling.remove(filling)
        if batch:
            with self.lock, self.autocast():
                logits.append(self.pool.prefill(self.model, [f.context for f in batch], [f.seq for f in batch]))
            self.steps += 1
            first = len(self.pool.rows) - len(batch)
            for row, filling in enumerate(batch, first):
                self._filling.remove(filling)
                if self.prefix is not None and filling.seq.start == 0:
                    self.prefix.store(filling.context, self.pool.row_layers(row))
        return logits

    def _joins(self, batch: list[_Filling], filling: _Filling) -> bool:
        """Whether a context may join the step's batched prefill: the pool's stores are slots, and contexts of
        different lengths may be padded (not sink tokens' stores: their first positions would be padding)."""
        return isinstance(self.pool, SlotPool) and (self.pool.paddable or not batch or
                                                    len(batch[0].context) == len(filling.context))

    def _advance(self, filling: _Filling, n: int) -> Tensor | None:
        """Prefill the next n tokens of a context alone; once it is complete, its cache goes to a free slot and its
        next token's logits (1, vocab) are returned."""
        idx, _, positions = left_pad([filling.context], self.device)
        end = min(filling.done + n, len(filling.context))
        with self.lock, self.autocast():
            logits = prefill(self.model, idx[:, filling.done:end], positions[:, filling.done:end], None,
                             filling.cache)
        self.steps += 1
        filling.done = end
        if end < len(filling.context):
            return None
        if self.prefix is not None and filling.seq.start == 0:
            self.prefix.store(filling.context, layer_tensors(filling.cache))
        self.pool.insert(filling.seq, filling.cache, end, filling.context[-1])
        return logits

    def _sample(self, rows: list[Sequence], logits: Tensor) -> None:
        """Each row's next token from its logits (B, vocab) and its own generator, rows with the same settings drawn
        together (gpt.inference.decoding.sample_rows); the outputs delivered, finished rows' slots given back."""
        groups: dict[tuple, list[int]] = {}
        for i, seq in enumerate(rows):
            s = seq.sampling
            groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
        tokens = [0] * len(rows)
        for (temperature, top_k, top_p), members in groups.items():
            drawn = sample_rows(logits[members], temperature, top_k, top_p, [rows[i].generator for i in members])
            for i, token in zip(members, drawn.flatten().tolist()):
                tokens[i] = token
        self.pool.feed(tokens)
        self._count(len(rows))
        outputs = [(seq, seq.take(token)) for seq, token in zip(rows, tokens) if not seq.cancelled]
        for row in reversed(range(len(rows))):
            if rows[row].done:
                self._keep_prefix(row)
                self.pool.release(row)
        for seq, output in outputs:
            seq.deliver(output)

    def _count(self, tokens: int) -> None:
        """Count tokens sampled now (the totals, and the rate /metrics reports)."""
        self.tokens += tokens
        now = time.monotonic()
        with self._cond:
            self._recent.append((now, tokens))
            while self._recent and self._recent[0][0] < now - RATE_SECONDS:
                self._recent.popleft()

    def _keep_prefix(self, row: int) -> None:
        """A finished sequence's blocks (its generated tokens too) go to the prefix cache: a chat's next turn repeats
        them. Not a cancelled one's, nor a context that slid (its positions start past 0)."""
        seq = self.pool.rows[row]
        if self.prefix is not None and seq.start == 0 and not seq.cancelled:
            held = self.pool.held[row]
            self.prefix.store(seq.ids[:held], self.pool.row_layers(row), tail=True)

    def _fail(self, sequences: list[Sequence], message: str) -> None:
        """End these sequences (and those being prefilled) with an error output and empty the pool."""
        sequences = [*sequences, *(f.seq for f in self._filling)]
        self._filling = []
        for seq in sequences:
            if not seq.done:
                seq.finish_reason = "error"
                seq.deliver(Output("", None, "error", message))
        while self.pool.rows:
            self.pool.release(len(self.pool.rows) - 1)
