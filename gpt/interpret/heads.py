"""Head roles and head ablation: previous-token, duplicate-token and induction scores on repeated random tokens
(Olsson et al. 2022), and what zeroing heads does to the loss.

A score is a head's mean weight on the one key its role predicts, over the queries that have one (the diagonal
stripe, as the induction score is usually computed); TransformerLens' detect_head with error_measure="mul" divides
by the weight of every row instead, rows without a target too, which gives lower numbers for the same head."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt.errors import ConfigError, UserError
from gpt.interpret.cache import check_tokens, run_with_cache
from gpt.interpret.hooks import ablate_heads, hooks

ROLES = ("previous_token", "duplicate_token", "induction")


def repeated_tokens(pool: Tensor, length: int, batch: int, seed: int) -> Tensor:
    """(batch, 2 * length) rows of ``length`` random tokens drawn from the ids in ``pool``, then the same again.

    Within a repeat no token comes twice when the pool has enough: with a character model's 62 letters and digits
    drawn freely, a token has other earlier occurrences, and a perfect one-token induction head's weight splits
    between them (its score 0.58 on average for repeats of 64, 0.36 for 128, where it should be 1)."""
    generator = torch.Generator().manual_seed(seed)
    if length <= len(pool):
        first = torch.stack([pool[torch.randperm(len(pool), generator=generator)[:length]] for _ in range(batch)])
    else:
        first = pool[torch.randint(0, len(pool), (batch, length), generator=generator)]
    return torch.cat([first, first], dim=1)


def token_pool(tokenizer, vocab_size: int) -> Tensor:
    """Ids to draw random tokens from, tokens the model reads whole in text: a character model's ASCII letters and
    digits; a subword model's words (a letter or underscore, then letters, digits or underscores, at least two
    characters, with or without a leading space), not its single bytes, which its text holds inside longer tokens.
    The whole vocabulary where fewer than 20 qualify."""
    word = _alnum if tokenizer.kind == "char" else _word
    pool = [i for i in range(vocab_size) if word(tokenizer, i)]
    return torch.tensor(pool) if len(pool) >= 20 else torch.arange(vocab_size)


_WORD = re.compile(r" ?[A-Za-z_][A-Za-z0-9_]+")


def _decoded(tokenizer, i: int) -> str | None:
    try:
        return tokenizer.decode([i])
    except Exception:  # an id the tokenizer cannot decode alone (an added token, a part of a character)
        return None


def _alnum(tokenizer, i: int) -> bool:
    text = _decoded(tokenizer, i)
    return text is not None and len(text) == 1 and text.isascii() and text.isalnum()


def _word(tokenizer, i: int) -> bool:
    text = _decoded(tokenizer, i)
    return text is not None and _WORD.fullmatch(text) is not None


def in_context_loss(model: nn.Module, tokens: Tensor) -> float:
    """Olsson et al.'s in-context loss on text windows (B, T + 1): the mean loss of the last quarter of positions
    minus that of the first tenth (negative where the context helps)."""
    losses = token_losses(model, tokens)
    T = losses.size(1)
    return float(losses[:, -max(1, T // 4):].mean() - losses[:, :max(1, T // 10)].mean())


def repeat_length(model: nn.Module, length: int | None, pool: Tensor | None = None) -> int:
    """The repeated half's length: half the context, at most the pool's size (no token twice in a repeat), unless
    asked (and then it must fit twice)."""
    limit = model.config.block_size // 2
    if length is None:
        return limit if pool is None else min(limit, len(pool))
    if not 2 <= length <= limit:
        raise UserError(f"repeat length {length} does not fit: two repeats must fit the context of "
                        f"{model.config.block_size} tokens (2..{limit})")
    return length


def role_scores(pattern: Tensor, length: int) -> dict[str, Tensor]:
    """Each head's mean weight on its role's key, from patterns (B, H, 2n, 2n) of repeated tokens (n = length): the
    previous token (every query but the first), the same token one repeat back, the token after it (induction)."""
    T = pattern.size(-1)
    rows = torch.arange(T)
    second = torch.arange(length, T)
    return {"previous_token": pattern[:, :, rows[1:], rows[1:] - 1].mean(dim=(0, 2)),
            "duplicate_token": pattern[:, :, second, second - length].mean(dim=(0, 2)),
            "induction": pattern[:, :, second, second - length + 1].mean(dim=(0, 2))}


def detect(model: nn.Module, length: int | None = None, batch: int = 16, seed: int = 0,
           pool: Tensor | None = None) -> dict[str, Tensor]:
    """Role scores (n_layer, n_head) of every head on ``batch`` sequences of repeated random tokens (from ``pool``;
    None: the whole vocabulary)."""
    pool = torch.arange(model.config.vocab_size) if pool is None else pool
    length = repeat_length(model, length, pool)
    tokens = repeated_tokens(pool, length, batch, seed)
    with evaluating(model):
        _, cache = run_with_cache(model, tokens, "blocks.*.attn.hook_pattern")
    per_layer = [role_scores(cache.pattern(layer).float().cpu(), length) for layer in range(model.config.n_layer)]
    return {role: torch.stack([scores[role] for scores in per_layer]) for role in ROLES}


def token_losses(model: nn.Module, tokens: Tensor, ablate: list[tuple[int, int]] = (), how: str = "zero") -> Tensor:
    """Cross-entropy (B, T - 1) of each next token, with the heads in ``ablate`` (layer, head) ablated ``how``
    (zeroed, or their mean over the batch and positions: hooks.ablate_heads)."""
    tokens = check_tokens(model, tokens, targets=True)
    check_heads(model, ablate)
    with evaluating(model), hooks(model, ablate_heads(list(ablate), how) if ablate else []), torch.no_grad():
        logits, _ = model(tokens[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2).to(torch.promote_types(logits.dtype, torch.float32)), tokens[:, 1:],
                           reduction="none")


def second_repeat_loss(model: nn.Module, tokens: Tensor, length: int, ablate: list[tuple[int, int]] = (),
                       how: str = "zero") -> float:
    """Mean loss on the tokens of the second repeat that an earlier occurrence predicts (all but its first)."""
    return float(token_losses(model, tokens, ablate, how)[:, length:].mean())


def ablation_effects(model: nn.Module, tokens: Tensor, start: int = 0, how: str = "zero") -> Tensor:
    """(n_layer, n_head): the mean loss (from position ``start`` on) with each head ablated ``how``, minus without."""
    base = float(token_losses(model, tokens)[:, start:].mean())
    config = model.config
    return torch.tensor([[float(token_losses(model, tokens, [(layer, head)], how)[:, start:].mean()) - base
                          for head in range(config.n_head)] for layer in range(config.n_layer)])


def induction_ablation(model: nn.Module, scores: Tensor, tokens: Tensor, length: int, threshold: float = 0.5,
                       previous: Tensor | None = None) -> dict:
    """The done-when experiment: the heads whose induction score passes ``threshold``, zeroed together, against as
    many other heads zeroed together, and the loss on the second repeat before and after each. Other heads are the
    lowest-scoring ones of the same layers first, then of the others, leaving out the previous-token heads the
    circuit reads from (``previous`` scores past ``threshold`` in an earlier layer): zeroing those breaks the
    circuit too, so they measure it, not a bystander. The same rule with them in is reported beside
    (``other_heads_any``). Heads are zeroed; ``mean_ablated`` gives the same three with each head's output replaced
    by its mean instead, which keeps a head's constant offset and removes only what it says about each token."""
    found = [(layer, head) for layer, head in torch.nonzero(scores > threshold).tolist()]
    feeding = [] if previous is None or not found else [
        (layer, head) for layer, head in torch.nonzero(previous > threshold).tolist()
        if layer < min(layer for layer, _ in found) and (layer, head) not in found]
    any_others = other_heads(scores, found, [])
    others = other_heads(scores, found, feeding)
    base = second_repeat_loss(model, tokens, length)
    ablated: dict[str, dict] = {"zero": {}, "mean": {}}
    for how, into in ablated.items():
        for name, heads in (("induction", found), ("others", others), ("others_any", any_others)):
            into[name] = second_repeat_loss(model, tokens, length, heads, how) - base if found and heads else None
    mean, ablated = ablated["mean"], ablated["zero"]
    return {"threshold": threshold, "induction_heads": found, "other_heads": others, "feeding_heads": feeding,
            "other_heads_any": any_others, "loss_second_repeat": base,
            "loss_first_repeat": float(token_losses(model, tokens)[:, :length - 1].mean()),
            "ablated_induction": ablated["induction"], "ablated_others": ablated["others"],
            "ablated_others_any": ablated["others_any"], "mean_ablated": mean}


def other_heads(scores: Tensor, found: list[tuple[int, int]], leave_out: list[tuple[int, int]]) -> list[tuple]:
    """As many heads as ``found``, none of them or of ``leave_out``: the lowest induction scores of the found heads'
    layers first, then of the other layers (fewer where the model has no more)."""
    layers = {layer for layer, _ in found}
    rest = sorted((tuple(pair) for pair in torch.cartesian_prod(torch.arange(scores.size(0)),
                                                                torch.arange(scores.size(1))).tolist()
                   if tuple(pair) not in found and tuple(pair) not in leave_out),
                  key=lambda p: (p[0] not in layers, float(scores[p[0], p[1]])))
    return rest[:len(found)]


def parse_heads(names: list[str]) -> list[tuple[int, int]]:
    """["L1H2", ...] -> [(1, 2), ...]; anything else a ConfigError."""
    heads = []
    for name in names:
        match = re.fullmatch(r"L(\d+)H(\d+)", str(name))
        if match is None:
            raise ConfigError(f"ablate: {name!r} is not a head; write heads as L<layer>H<head>, e.g. L1H2")
        heads.append((int(match[1]), int(match[2])))
    return heads


def check_heads(model: nn.Module, heads) -> None:
    """Refuse a (layer, head) the model does not have."""
    config = model.config
    for layer, head in heads:
        if not (0 <= layer < config.n_layer and 0 <= head < config.n_head):
            raise UserError(f"head L{layer}H{head} is out of range: the model has {config.n_layer} layers and "
                            f"{config.n_head} heads (L0H0..L{config.n_layer - 1}H{config.n_head - 1})")


class evaluating:
    """The model in eval mode (no dropout) for the block, as it was after."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was = model, model.training

    def __enter__(self) -> nn.Module:
        self.model.eval()
        return self.model

    def __exit__(self, *exc) -> None:
        self.model.train(self.was)
