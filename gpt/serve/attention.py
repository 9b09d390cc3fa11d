"""The attention the page draws: one token's weights over its context, for every layer and head, as
gpt.inference.visualize.attention_maps computes them (the maps of scripts/visualize_attention.py: any kernel, any
design), with what each design of the model says its maps show (its Design.view, from the design registry).

The context is the one the model used: a token of the prompt saw the prompt's tokens before it; a later token saw
the window gpt.inference.decoding.slide left when it was fed (the last block_size // 2 tokens after each slide).
"""

from __future__ import annotations

import torch

from gpt.errors import UserError
from gpt.inference.decoding import slide
from gpt.inference.visualize import attention_maps, design_views, token_labels
from gpt.interpret import heads
from gpt.interpret.lens import top_tokens
from gpt.serve.protocol import APIError

MAX_PICTURE_BYTES = 256 * 2**20  # the maps of one context (layers x heads x T x T floats) are computed whole
MAX_LENS_LOGITS = 2**27  # the logit lens of one context (stages x positions x vocabulary), one stage in memory at
# a time: GPT-2's 13 stages x 50,257 tokens reach it at 205 positions
ROLE_REPEAT, ROLE_BATCH, ROLE_SEED = 32, 4, 0  # the head roles' probe: 4 rows of 32 random tokens repeated once


def context_start(prompt_tokens: int, length: int, block_size: int) -> int:
    """Where the context began when the sequence was ``length`` tokens long, by the rule of
    gpt.inference.decoding.stream: the prompt whole (at most block_size tokens), then a slide by half each time it
    outgrew block_size."""
    starts = [0]
    for n in range(prompt_tokens, length + 1):
        slide([range(n)], starts, block_size)  # only the row's length matters
    return starts[0]


def token_picture(served, ids: list[int], prompt_tokens: int, position: int, lens: bool = False) -> dict:
    """The weights of the token at ``position`` over its context: (n_layer, n_head, context) as nested lists,
    with the context's token labels, and what to read from them; with ``lens``, the logit lens of that context."""
    model, config = served.model, served.model.config
    if not ids or not all(isinstance(t, int) and 0 <= t < served.tokenizer.vocab_size for t in ids):
        raise APIError(400, "ids must be a non-empty list of token ids of this model", "ids")
    if not 1 <= prompt_tokens <= min(len(ids), config.block_size):
        raise APIError(400, f"prompt_tokens must be between 1 and {min(len(ids), config.block_size)}",
                       "prompt_tokens")
    if not 0 <= position < len(ids):
        raise APIError(400, f"position must be between 0 and {len(ids) - 1}", "position")
    start = context_start(prompt_tokens, max(position + 1, prompt_tokens), config.block_size)
    context = ids[start : position + 1]
    need = config.n_layer * config.n_head * len(context) ** 2 * 4
    if need > MAX_PICTURE_BYTES:
        raise APIError(400, f"the maps of a {len(context)}-token context need {need / 2**20:.0f} MiB; the page "
                       f"draws contexts up to {MAX_PICTURE_BYTES / 2**20:.0f} MiB", "position")
    lens_need = (config.n_layer + 1) * len(context) * config.vocab_size
    if lens and lens_need > MAX_LENS_LOGITS:
        raise APIError(400, f"the logit lens of a {len(context)}-token context is {lens_need:,} logits; the server "
                       f"computes at most {MAX_LENS_LOGITS:,} (pick an earlier token, or leave lens out)", "lens")
    idx = torch.tensor([context], device=next(model.parameters()).device)
    with served.engine.lock:  # the recorder swaps the layers' kernels: no decoding step may run meanwhile
        maps = attention_maps(model, idx)[:, :, -1, :]  # (n_layer, n_head, T): the last token's row
        stages = top_tokens(model, idx) if lens else None  # hooks attached: likewise
    sums = maps.sum(-1)
    notes = []  # what the weights themselves show, beside what the designs say they show (the registry's views)
    if maps.min() < 0:
        notes.append("some weights are negative (drawn in blue)")
    if (sums < 0.99).any():
        notes.append(f"the weights of a head sum to as little as {sums.min():.2f}: the rest goes to no token")
    return {"model": served.name, "position": position, "context_start": start,
            "tokens": token_labels(served.tokenizer, context), "layers": config.n_layer, "heads": config.n_head,
            "weights": [[[round(float(w), 4) for w in head] for head in layer] for layer in maps.tolist()],
            "views": design_views(config), "notes": notes, "roles": head_roles(served) or None,
            **({"lens": lens_rows(served.tokenizer, stages)} if lens else {})}


def lens_rows(tokenizer, stages: list[dict]) -> list[dict]:
    """gpt.interpret.lens.top_tokens' stages as the page shows them: each position's top next token, as id, label
    and probability."""
    return [{"stage": s["stage"], "ids": s["ids"], "tokens": token_labels(tokenizer, s["ids"]),
             "probs": [round(p, 4) for p in s["probs"]]} for s in stages]


def head_roles(served) -> dict:
    """Each head's previous-token, duplicate-token and induction score ({role: [layer][head]}, gpt.interpret.heads)
    on ROLE_BATCH rows of ROLE_REPEAT random tokens repeated once, computed at the model's first picture and kept:
    the page labels its grid with them. Empty for a model whose design shows no pattern."""
    if served.head_roles is None:
        model = served.model
        pool = heads.token_pool(served.tokenizer, model.config.vocab_size)
        length = min(ROLE_REPEAT, model.config.block_size // 2, len(pool))
        try:
            with served.engine.lock:  # the scores' kernels are swapped in: no decoding step may run meanwhile
                scores = heads.detect(model, length, ROLE_BATCH, ROLE_SEED, pool)
        except UserError:  # no pattern to score
            scores = {}
        served.head_roles = {role: [[round(float(v), 3) for v in layer] for layer in s.tolist()]
                             for role, s in scores.items()}
    return served.head_roles


MAX_API_WEIGHTS = 2**20  # the most weights one completions request may ask for (choices x tokens x layers x
# heads x keys)


def chosen(field, config) -> tuple[list[int], list[int]]:
    """The request's ``attention`` field's layers and heads (all when not given), or a 400 naming the bad one."""
    picked = []
    for name, count in (("layers", config.n_layer), ("heads", config.n_head)):
        values = getattr(field, name)
        values = list(range(count)) if values is None else values
        if not values or len(set(values)) != len(values) or not all(0 <= v < count for v in values):
            raise APIError(400, f"attention.{name} must be distinct numbers from 0 to {count - 1} (this model has "
                           f"{count}), or left out for all", f"attention.{name}")
        picked.append(values)
    return picked[0], picked[1]


def check_request(served, field, prompts: list[list[int]], max_tokens: int, stream: bool) -> None:
    """Refuse, before any decoding, an ``attention`` request the server would not answer: streamed, a sequence
    that could outgrow one context (the weights are those of one forward pass over it), or too many weights."""
    config = served.model.config
    layers, heads = chosen(field, config)
    if stream:
        raise APIError(400, "attention is returned with stream=false only", "attention")
    longest = max(len(p) for p in prompts) + max_tokens
    if longest > config.block_size:
        raise APIError(400, f"attention needs the prompt and max_tokens to fit one context of {config.block_size} "
                       f"tokens; this request may reach {longest}", "attention")
    need = len(prompts) * max_tokens * len(layers) * len(heads) * longest
    if need > MAX_API_WEIGHTS:
        raise APIError(400, f"attention of this request is up to {need:,} weights; the server returns at most "
                       f"{MAX_API_WEIGHTS:,} (ask fewer layers, heads, tokens or choices)", "attention")


def completion_attention(served, field, prompt: list[int], new: list[int]) -> dict:
    """The weights each new token was chosen with: for each token of ``new``, the row of the query before it over
    the keys up to that query, in the chosen layers and heads ([token][layer][head][key])."""
    layers, heads = chosen(field, served.model.config)
    ids = (prompt + new)[:-1] if new else prompt
    idx = torch.tensor([ids], device=next(served.model.parameters()).device)
    with served.engine.lock:  # the recorder swaps the layers' kernels: no decoding step may run meanwhile
        maps = attention_maps(served.model, idx)[layers][:, heads]  # (layers, heads, T, T)
    rows = range(len(prompt) - 1, len(prompt) - 1 + len(new))
    return {"layers": layers, "heads": heads, "tokens": token_labels(served.tokenizer, ids),
            "weights": [[[[round(float(w), 4) for w in head[q, :q + 1]] for head in layer] for layer in maps]
                        for q in rows], "views": design_views(served.model.config)}
