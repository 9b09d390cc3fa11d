"""Autoregressive decoding: prefill the prompt, then one token per step against the KV cache.

``prefill`` and ``decode_step`` are the two model calls, kept apart so each can be compiled on its own
(the prompt's shape varies, a decode step's does not: the cache reads fixed shapes, so ``compiled_decode_step``
compiles it once, gpt-fast's decode_one_token). ``stream`` builds the loop on them: left padding
for prompts of different lengths, a context window that slides past block_size, stop tokens. At the end, what
turns logits into a token (temperature, top-k, nucleus; one row or rows with settings of their own, as the server
samples); the model itself knows nothing of either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from gpt.errors import ConfigError
from gpt.inference.plain_step import plain_step
from gpt.kernels.backends import compute_dtype, pin_for
from gpt.model import GPT
from gpt.model import kv_cache as kv
from gpt.model.kv_cache import KVCache
from gpt.tokenizers.tokenizer import Tokenizer


@torch.no_grad()
def prefill(model: GPT, idx: Tensor, positions: Tensor, key_mask: Tensor | None, cache: KVCache | None) -> Tensor:
    """Run the prompts idx (B, T) at positions (B, T), filling the cache if given; the next token's logits (B, vocab).

    key_mask (B, T) is False on left padding (None: no padding). Only the last position goes through the head.
    """
    logits, _ = model(idx, positions=positions, key_mask=key_mask, cache=cache, last_only=True)
    return logits[:, -1, :]


@torch.no_grad()
def decode_step(model: GPT, token: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
    """Feed one token per row, token and positions (B, 1), against the cached keys; the next logits (B, vocab)."""
    logits, _ = model(token, positions=positions, cache=cache)
    return logits[:, -1, :]


def compiled_decode_step(**options) -> Callable[[GPT, Tensor, Tensor, KVCache], Tensor]:
    """decode_step under torch.compile with fullgraph=True: one compilation serves every step of every sequence of
    the same batch size (a one-token step reads every cache slot, the token count is a tensor). ``options`` go to
    torch.compile (backend, mode, options: e.g. {"cpp_wrapper": True} on a CPU, see cpu_compile_options)."""
    return torch.compile(decode_step, fullgraph=True, **options)


def cpu_compile_options() -> dict:
    """compiled_decode_step's options on a CPU: inductor's C++ wrapper calls the step's kernels without a Python
    line and size check per kernel, which a profile of the default model's compiled step showed; compiling takes
    longer (docs/benchmarks.md)."""
    return {"options": {"cpp_wrapper": True}}


def steady(step: Callable) -> contextlib.AbstractContextManager:
    """Around every compiled decode step of a cache but its first: Dynamo skips its guard checks (a sixth of the
    default model's compiled step on a CPU). The first step checked them for this model, cache and batch, and no
    value a guard reads changes before the next prefill (a new cache, whose first step is checked again); where
    several compilations exist, Dynamo still checks what tells them apart. Eager steps: nothing."""
    if step is decode_step:
        return contextlib.nullcontext()
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


SMALL_STEP = 1 << 20  # weights x rows of a step's largest matrix product below which it runs on one CPU thread


class OneThread:
    """A reusable context manager: torch runs on one thread inside it, on as many as before after it."""

    def __init__(self) -> None:
        self._before: list[int] = []

    def __enter__(self) -> OneThread:
        self._before.append(torch.get_num_threads())
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self._before.pop())


def step_threads(model: GPT, rows: int) -> contextlib.AbstractContextManager:
    """Around a one-token step of ``rows`` sequences on a CPU: one thread when its largest matrix product is small
    (SMALL_STEP), else torch's threads. Such a step is a hundred operations of microseconds each, none worth
    splitting, and a split waits for the other thread at its end: on the shared 2-core machine the default model's
    cached steps ran 4 to 12x faster on one thread than on two (docs/benchmarks.md). Prefills (and recomputation)
    keep every thread; so do larger models' steps, whose matrix products stream megabytes of weights."""
    device = next(model.parameters()).device
    largest = max((m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)), default=0)
    if device.type != "cpu" or torch.get_num_threads() == 1 or largest * rows >= SMALL_STEP:
        return contextlib.nullcontext()
    return OneThread()


def left_pad(rows: list[list[int]], device: torch.device | str) -> tuple[Tensor, Tensor | None, Tensor]:
    """Token ids (B, T) padded on the left, the key mask (None when nothing is padded) and positions (B, T).

    Each row's first real token gets position 0, so a padded row sees exactly what it would see alone.
    """
    width = max(len(r) for r in rows)
    idx = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
    if all(len(r) == width for r in rows):
        return idx, None, torch.arange(width, device=device).expand(len(rows), width)
    key_mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows], device=device)
    return idx, key_mask, (key_mask.cumsum(dim=-1) - 1).clamp(min=0)


def slide(rows: list[list[int]], starts: list[int], block_size: int) -> bool:
    """Move the start of every row whose context outgrew block_size so its last block_size // 2 tokens remain.

    Returns whether any row moved (its cached keys then no longer match its positions).
    """
    slid = False
    for i, row in enumerate(rows):
        if len(row) - starts[i] > block_size:
            starts[i], slid = len(row) - block_size // 2, True
    return slid


@torch.no_grad()
def stream(
    model: GPT,
    prompts: Tensor | list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    stop_token: int | None = None,
    kv_cache: bool = True,
    vocab_limit: int | None = None,
    step: Callable[[GPT, Tensor, Tensor, KVCache], Tensor] = decode_step,
) -> Iterator[Tensor]:
    """Yield the next token of every prompt as a (B, 1) tensor, one step at a time.

    prompts: a (B, T) tensor, or token-id lists of different lengths (left-padded into one batch).
    Context: when a row's context would exceed block_size, its oldest tokens are dropped so that the
    last block_size // 2 remain (the window slides by half), the same with or without the cache and
    whatever the other rows do. A model whose cache is a window's ring (kv_cache.endless: StreamingLLM's sliding
    window, with sink tokens or not) never slides: with the cache it decodes on past block_size in constant memory;
    without it each step recomputes everything from the first token (the reference the cache equals).
    With kv_cache the context is prefilled once and each step then feeds
    one token per row; after a slide the cache is rebuilt. Stops once every row produced stop_token.
    vocab_limit: only ids below it are sampled (a vocabulary padded past the tokenizer's, e.g. 50304 > 50257).
    step: the decoding step (decode_step, or compiled_decode_step()). decode_step runs a model without designs as
    straight tensor calls with the same logits (gpt.inference.plain_step).
    """
    check_sampling(temperature, top_k, top_p)
    device = next(model.parameters()).device
    rows = prompts.tolist() if isinstance(prompts, Tensor) else [list(p) for p in prompts]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every prompt needs at least one token")
    starts = [0] * len(rows)  # where each row's context begins
    finished = torch.zeros(len(rows), dtype=torch.bool, device=device)
    cache: KVCache | None = None  # the first step always prefills, so next_token is set before a decode
    next_token = positions = torch.empty(0, dtype=torch.long, device=device)
    checked = False  # whether this cache's first decode step ran with Dynamo's guards (see steady)
    decode_pin = pin_for(model.config.attention, model.config.attention_backend, device,  # held by a compiled step too
                         compute_dtype(device, next(model.parameters()).dtype), decoding=True)
    endless = kv.endless(model.config)  # a window's ring runs past block_size without sliding
    threads = step_threads(model, len(rows))
    eager = step is decode_step  # the general eager step, or GPT-2's layers as straight calls (plain_step): no guards
    if eager and kv_cache:
        step = plain_step(model, decode_step) or decode_step
    for _ in range(max_new_tokens):
        slid = not endless and slide(rows, starts, model.config.block_size)
        if cache is None or slid:  # prefill (every step without a cache: recompute the context)
            idx, key_mask, positions = left_pad([row[start:] for row, start in zip(rows, starts)], device)
            cache = KVCache(model.config, len(rows), device) if kv_cache else None
            logits = prefill(model, idx, positions, key_mask, cache)
            checked = False
        else:  # decode: one new token per row against the cached keys
            positions = positions[:, -1:] + 1
            with decode_pin, threads, steady(step) if checked and not eager else contextlib.nullcontext():
                logits = step(model, next_token, positions, cache)
            checked = True
        next_token = sample_next(logits[:, :vocab_limit], temperature, top_k, top_p, generator)  # (B, 1)
        if not (endless and kv_cache):  # the context a later prefill needs; an endless cache never prefills again
            for row, token in zip(rows, next_token.flatten().tolist()):
                row.append(token)
        yield next_token
        if stop_token is not None:
            finished |= next_token.squeeze(1) == stop_token
            if finished.all():
                return


def generate(model: GPT, idx: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
    """idx (B, T) extended by up to max_new_tokens sampled tokens; keyword arguments as for stream()."""
    new = list(stream(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx, *new], dim=1)


def generate_batch(model: GPT, prompts: list[list[int]], max_new_tokens: int, **kwargs) -> list[list[int]]:
    """Prompts of different lengths in one batch: each prompt followed by its sampled tokens."""
    new = torch.cat(list(stream(model, prompts, max_new_tokens, **kwargs)), dim=1).tolist()
    return [list(p) + n for p, n in zip(prompts, new)]


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """Token ids of a prompt; an empty prompt starts from end-of-text (BPE) or a newline (characters)."""
    if prompt:
        return tokenizer.encode(prompt)
    if tokenizer.eot_token is not None:
        return [tokenizer.eot_token]
    if "\n" in getattr(tokenizer, "stoi", {}):
        return tokenizer.encode("\n")
    return [0]


# --- logits to a token: temperature, top-k and nucleus (top-p) filtering, greedy or random choice -------------

def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse sampling settings that have no meaning, naming the setting."""
    if not temperature >= 0:  # NaN too
        raise ConfigError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and not top_k > 0:
        raise ConfigError(f"top_k must be a positive integer or null, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def filter_logits(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Set to -inf every logit outside the top k, and outside the smallest set whose probability exceeds top_p."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits.float(), dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p. The first always stays, also when
        # top_p is so small (subnormal) that it rounds to 0 in float32 and "0 >= top_p" would drop it too.
        drop_sorted = (cumulative - torch.softmax(sorted_logits.float(), dim=-1)) >= top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """The distribution a token is drawn from (temperature > 0): softmax of the filtered logits / temperature."""
    # The best logit is 0 before dividing, so a tiny temperature sends the others to -inf, never to +inf; one below
    # float32's smallest normal (a subnormal, which float32 reads as 0) is taken as that smallest normal: the same
    # all but greedy choice, where dividing by 0 made NaN probabilities.
    logits = logits.float()
    logits = logits - logits.max(dim=-1, keepdim=True).values
    logits = filter_logits(logits / max(temperature, torch.finfo(torch.float32).tiny), top_k, top_p)
    return torch.softmax(logits, dim=-1)


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row from (B, vocab) logits; temperature 0 means greedy. Returns (B, 1)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(probabilities(logits, temperature, top_k, top_p), num_samples=1, generator=generator)


def sample_rows(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generators: list[torch.Generator]) -> Tensor:
    """Like sample_next, but row i draws with generators[i]: each row gets the token sample_next would give it alone
    with that generator (a server's requests, batched, each with its own seed). Returns (B, 1)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = probabilities(logits, temperature, top_k, top_p)  # (B, vocab), computed once for the rows
    return torch.cat([torch.multinomial(probs[i : i + 1], 1, generator=g) for i, g in enumerate(generators)])
