"""Log-likelihoods of continuations given contexts, batched: what multiple-choice benchmarks and lm-eval ask of a model.

Text is split into tokens as lm-evaluation-harness's Hugging Face model does, so the numbers are comparable:
spaces that end the context move to the start of the continuation; the continuation's tokens are those of
encode(context + continuation) past encode(context); an empty context becomes the end-of-text token; a pair
longer than block_size + 1 tokens keeps its last block_size + 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpt.errors import UserError
from gpt.tokenizers.tokenizer import Tokenizer

Pair = tuple[list[int], list[int]]  # context tokens, continuation tokens


def encode_pair(tokenizer: Tokenizer, context: str, continuation: str) -> Pair:
    """Context and continuation tokens, split where lm-evaluation-harness splits them (see the module doc)."""
    if context == "":
        if tokenizer.eot_token is None:
            raise UserError("a request with an empty context needs an end-of-text token; this character-level "
                            "tokenizer has none", hint="give every request some context")
        return [tokenizer.eot_token], tokenizer.encode(continuation)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer.encode(context + continuation)
    context_ids = tokenizer.encode(context)
    return context_ids, whole[len(context_ids):]


@torch.no_grad()
def loglikelihoods(model: nn.Module, pairs: list[Pair], *, vocab_limit: int | None = None, batch_size: int = 8,
                   device: torch.device | str = "cpu", autocast: contextlib.AbstractContextManager | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[tuple[float, bool]]:
    """Per pair: the summed log-probability of the continuation tokens (float64) and whether each was the argmax.

    Pairs run longest first, batch_size at a time, right-padded (causal attention: padding never reaches a real
    position). ``vocab_limit`` leaves out padded vocabulary rows past the tokenizer's.
    """
    block = model.config.block_size
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
    model.eval()
    for start in range(0, len(order), batch_size):
        group = order[start : start + batch_size]
        inputs, targets = zip(*(window(pairs[i], block) for i in group))
        x = torch.zeros(len(group), max(map(len, inputs)), dtype=torch.long)  # (B, T), right-padded with 0
        for row, ids in enumerate(inputs):
            x[row, : len(ids)] = torch.tensor(ids)
        with autocast or contextlib.nullcontext():
            logits, _ = model(x.to(device))  # (B, T, vocab)
        for row, (i, ids, cont) in enumerate(zip(group, inputs, targets)):
            scored = logits[row, len(ids) - len(cont) : len(ids), :vocab_limit].double()  # (len(cont), vocab)
            logp = F.log_softmax(scored, dim=-1)
            target = torch.tensor(cont, device=logp.device)
            results[i] = (logp.gather(-1, target[:, None]).sum().item(), bool((logp.argmax(-1) == target).all()))
        if progress is not None:
            progress(min(start + batch_size, len(order)), len(order))
    return results


def window(pair: Pair, block_size: int) -> tuple[list[int], list[int]]:
    """The model input (at most block_size tokens) whose last len(continuation) positions predict the continuation."""
    context, continuation = pair
    if not continuation:
        raise UserError("a request has an empty continuation (nothing to score)")
    if len(continuation) > block_size:
        raise UserError(f"a continuation of {len(continuation)} tokens is longer than the model's context "
                        f"({block_size} tokens)", hint="score shorter continuations")
    whole = (context + continuation)[-(block_size + 1) :]
    return whole[:-1], continuation
