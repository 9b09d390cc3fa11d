"""Conversations as training rows: ChatML's template, its tokens added to a base model's tokenizer, each
conversation's token ids with the mask of what is learned (the assistant's replies and their <|im_end|>), and
conversations packed into rows of the context without one seeing another.

The ids are those the stored Jinja template gives (gpt.inference.chat_template renders it and encodes the text between
special tokens piece by piece; tests/data/test_chat_data.py checks both agree token by token), so training, the server,
scripts/chat.py and transformers' apply_chat_template all format a conversation the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpt.data.conversations import Messages, read_conversations
from gpt.errors import UserError
from gpt.model.config import GPTConfig
from gpt.tokenizers import tokenizer as tok
from gpt.tokenizers.bpe import CHAT_TOKENS

START, END = CHAT_TOKENS
# ChatML, as transformers' models write it; the one string the checkpoint, the server and exports carry
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
    "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def with_chat_tokens(tokenizer: tok.Tokenizer) -> tok.Tokenizer:
    """The tokenizer with ChatML's tokens (added after its vocabulary when it lacks them; a trained BPE reserves
    them) and the ChatML template in its description."""
    meta = tokenizer.to_meta()
    missing = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
    if missing and meta["kind"] == "bpe":
        raise UserError("this BPE tokenizer does not reserve ChatML's <|im_start|> and <|im_end|>",
                        hint="train one with scripts/train_tokenizer.py (it reserves them), or use char or gpt2")
    added = [*meta.get("added_tokens", []), *missing]
    return tok.from_meta(meta | ({"added_tokens": added, "vocab_size": tokenizer.vocab_size + len(missing)}
                                 if missing else {}) | {"chat_template": CHATML_TEMPLATE})


def encode_conversation(tokenizer: tok.Tokenizer, messages: Messages) -> tuple[list[int], list[bool]]:
    """The ids of a conversation as the template renders it, and per token whether it is learned: the text of each
    assistant reply and the <|im_end|> that ends it (the model learns to stop), nothing of the prompts."""
    start, end = tokenizer.special_tokens[START], tokenizer.special_tokens[END]
    newline = tokenizer.encode("\n")
    ids, learned = [], []
    for m in messages:
        piece = tokenizer.encode(f"{m['role']}\n{m['content']}")  # the text between two special tokens, as one
        train = m["role"] == "assistant"
        head = common_prefix(piece, tokenizer.encode(f"{m['role']}\n")) if train else len(piece)
        ids += [start, *piece, end, *newline]
        learned += [False] * (1 + head) + [train] * (len(piece) - head) + [train] + [False] * len(newline)
    return ids, learned


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def encoded(tokenizer: tok.Tokenizer, conversations: list[Messages], source: str) -> list[tuple[list[int], list[bool]]]:
    """Each conversation's ids and mask; text the tokenizer cannot encode is one error naming the conversation."""
    out = []
    for i, messages in enumerate(conversations):
        try:
            out.append(encode_conversation(tokenizer, messages))
        except UserError as err:
            raise UserError(f"{source}, conversation {i + 1}: {err}", hint=err.hint) from None
    return out


@dataclass
class Packed:
    """Rows of ``block_size`` tokens, each holding whole conversations (cut to the context if longer): inputs,
    targets (-1: not learned), each token's position within its conversation and its conversation's number."""

    inputs: np.ndarray  # (R, T) int64
    targets: np.ndarray  # (R, T) int64
    positions: np.ndarray  # (R, T) int64
    segments: np.ndarray  # (R, T) int64: tokens attend within their segment; padding has one segment per token
    cut: int  # conversations cut to the context
    learned: int  # target tokens


def pack(examples: list[tuple[list[int], list[bool]]], block_size: int) -> Packed:
    """Conversations (ids, learned) placed in order into rows, a new row when the next does not fit."""
    rows: list[list[tuple[list[int], list[int]]]] = [[]]
    used, cut = 0, 0
    for ids, learned in examples:
        if len(ids) - 1 > block_size:
            ids, learned, cut = ids[: block_size + 1], learned[: block_size + 1], cut + 1
        x = ids[:-1]
        y = [t if keep else -1 for t, keep in zip(ids[1:], learned[1:])]
        if used + len(x) > block_size:
            rows.append([])
            used = 0
        rows[-1].append((x, y))
        used += len(x)
    R, T = len(rows), block_size
    inputs, targets = np.zeros((R, T), np.int64), np.full((R, T), -1, np.int64)
    positions = np.zeros((R, T), np.int64)
    segments = np.tile(np.arange(T, dtype=np.int64) + T, (R, 1))  # padding: alone
    for r, row in enumerate(rows):
        at = 0
        for s, (x, y) in enumerate(row):
            n = len(x)
            inputs[r, at:at + n], targets[r, at:at + n] = x, y
            positions[r, at:at + n], segments[r, at:at + n] = np.arange(n), s
            at += n
    return Packed(inputs, targets, positions, segments, cut, int((targets >= 0).sum()))


def batch(packed: Packed, rows: list[int], device: torch.device) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Rows as the model's inputs and targets, with positions restarting at each conversation and the mask that
    keeps each token's attention inside its own conversation (the kernel adds the causal rule)."""
    x = torch.from_numpy(packed.inputs[rows]).to(device)  # (B, T)
    y = torch.from_numpy(packed.targets[rows]).to(device)  # (B, T)
    segments = torch.from_numpy(packed.segments[rows]).to(device)  # (B, T)
    positions = torch.from_numpy(packed.positions[rows]).to(device)  # (B, T)
    same = segments[:, None, :, None] == segments[:, None, None, :]  # (B, 1, T, T)
    return x, y, {"positions": positions, "key_mask": same}


class ChatData:
    """Conversations for supervised fine-tuning, in the shape the Trainer reads token data: a tokenizer, two splits,
    random draws of rows and the rows as batches. Held-out conversations give the validation loss."""

    def __init__(self, cfg: Any, base: tok.Tokenizer, seed: int, log: Any = print) -> None:
        self.dir = Path(cfg.data)
        self.tokenizer = with_chat_tokens(base)
        conversations, skipped = read_conversations(cfg.data, cfg.format, cfg.skip_bad)
        if skipped.count:
            log(f"skipped {skipped.count} bad record(s) of {cfg.data} (chat.skip_bad=true); the first: {skipped.first}")
        examples = encoded(self.tokenizer, conversations, cfg.data)
        if cfg.val_data:
            val_conversations, _ = read_conversations(cfg.val_data, cfg.format, cfg.skip_bad)
            self.encoded = {"train": examples, "val": encoded(self.tokenizer, val_conversations, cfg.val_data)}
            self.counts = {"train": len(conversations), "val": len(val_conversations)}
        else:  # a seeded share of the conversations is held out
            order = np.random.default_rng(seed).permutation(len(examples))
            n_val = max(1, round(len(examples) * cfg.val_fraction)) if len(examples) > 1 else 0
            val = [examples[i] for i in order[:n_val]] or examples
            self.encoded = {"train": [examples[i] for i in order[n_val:]], "val": val}
            self.counts = {split: len(e) for split, e in self.encoded.items()}
        self.packed: dict[str, Packed] = {}
        self.meta: dict[str, Any] = {"splits": {"train": {}, "val": {}}}
        self.log = log
        self.init_weights: tuple | None = None  # init_from's (config, weights, tokenizer), set by gpt.train.build

    def check_block_size(self, block_size: int) -> None:
        """Pack both splits into rows of the model's context (said once: rows, conversations cut)."""
        self.packed = {split: pack(examples, block_size) for split, examples in self.encoded.items()}
        self.splits = {split: packed.inputs.reshape(-1) for split, packed in self.packed.items()}  # samples' prompts
        for split, packed in self.packed.items():
            if packed.learned == 0:
                raise UserError(f"the {split} conversations of {self.dir} leave no assistant token inside the "
                                f"context of {block_size} tokens", hint="use a larger model.block_size")
        train, val = self.packed["train"], self.packed["val"]
        self.log(f"chat data: {self.counts['train']} conversations in {len(train.inputs)} rows of "
                 f"{block_size} tokens ({train.learned:,} learned tokens), {self.counts['val']} held out"
                 + (f"; {train.cut + val.cut} cut to the context" if train.cut + val.cut else ""))

    def random_starts(self, split: str, batch_size: int, block_size: int, generator: torch.Generator) -> list[int]:
        """Rows of one batch, drawn with replacement (the samplers' and evaluation's draws)."""
        return torch.randint(len(self.packed[split].inputs), (batch_size,), generator=generator).tolist()

    def windows(self, split: str, starts: list[int], block_size: int,
                device: torch.device) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return batch(self.packed[split], starts, device)


def add_token_rows(config: GPTConfig, state: dict[str, Tensor], base: tok.Tokenizer,
                   chat: tok.Tokenizer) -> tuple[GPTConfig, dict[str, Tensor]]:
    """A base model's weights for the chat tokenizer: the embedding (and an untied head) grown to its vocabulary
    where needed, the new tokens' rows set to the mean of the base vocabulary's rows (a token the model has never
    seen starts as the average one); every other weight unchanged."""
    new_ids = [i for name, i in chat.special_tokens.items() if name not in base.special_tokens]
    if not new_ids:
        return config, state
    size = max(config.vocab_size, chat.vocab_size)
    state = dict(state)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        if key in state:
            weight = state[key]  # (V, C)
            mean = weight[: base.vocab_size].mean(0)  # (C,)
            grown = torch.cat([weight, mean.expand(size - len(weight), -1)]) if size > len(weight) else weight.clone()
            grown[new_ids] = mean
            state[key] = grown
    return dataclasses.replace(config, vocab_size=size), state
