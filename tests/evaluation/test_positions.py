"""Long-context evaluation (gpt/evaluation/positions.py): loss by position against a hand computation, past
block_size for RoPE, refused for learned positions; the passkey layout the probe and the corpus passkey share."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt.errors import ConfigError
from gpt.evaluation.positions import IGNORE, loss_by_position, passkey, passkey_examples, place_passkey
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.tokenizers.tokenizer import CharTokenizer

CHARS = list("\n =ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh0123456789")


def model(pos: str = "rope", block_size: int = 8) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=block_size, vocab_size=len(CHARS),
                         designs=[] if pos == "learned" else [pos])).eval()


def test_loss_by_position_matches_a_hand_computation_past_block_size():
    """Windows of 24 tokens for a RoPE model of block_size 8: each position's loss by hand (log-softmax of a model of
    block_size 24 with the same weights, which RoPE's function does not depend on), bucket means by hand."""
    short, tokens = model(block_size=8), np.random.default_rng(1).integers(0, len(CHARS), size=200)
    long = model(block_size=24)
    long.load_state_dict(short.state_dict())
    got = loss_by_position(short, tokens, 24, windows=3, buckets=4, batch_size=2, device=torch.device("cpu"))
    starts = [0, 88, 175]  # 3 windows spread evenly over the 200 - 24 - 1 = 175 possible starts
    per_position = np.zeros(24)
    for s in starts:
        with torch.no_grad():
            logits, _ = long(torch.from_numpy(tokens[s:s + 24])[None])
        logp = torch.log_softmax(logits[0].double(), dim=-1)
        for i in range(24):
            per_position[i] -= float(logp[i, tokens[s + i + 1]]) / 3
    assert got["windows"] == 3 and got["length"] == 24
    assert [(b["start"], b["end"]) for b in got["buckets"]] == [(0, 6), (6, 12), (12, 18), (18, 24)]
    for b in got["buckets"]:
        assert b["loss"] == pytest.approx(per_position[b["start"]:b["end"]].mean(), abs=1e-6)
    assert got["loss"] == pytest.approx(per_position.mean(), abs=1e-6)


def test_lengths_past_a_learned_position_table_are_refused():
    with pytest.raises(ConfigError, match="length 16 is past the model's block_size 8 .* learned table"):
        loss_by_position(model("learned"), np.zeros(100, dtype=np.int64), 16, 2, 2, 2, torch.device("cpu"))


def test_the_passkey_layout_puts_the_key_at_its_depth_and_scores_only_the_final_digits():
    seq = np.full((2, 21), 7)
    inputs, targets = place_passkey(seq, np.array([1, 2]), np.array([3]), np.array([[4, 5], [6, 4]]),
                                    np.array([0, 5]))
    assert inputs.tolist() == [[1, 2, 4, 5] + [7] * 14 + [3, 4],  # key and digits at 0; query, first digit at 18
                               [7] * 5 + [1, 2, 6, 4] + [7] * 9 + [3, 6]]  # ... at 5
    assert (targets[:, :-2] == IGNORE).all() and targets[:, -2:].tolist() == [[4, 5], [6, 4]]


def test_passkey_sequences_on_text_carry_the_key_line_twice_and_a_model_is_scored_per_length():
    tokenizer = CharTokenizer(CHARS)
    text = np.array(tokenizer.encode("abc defgh\n" * 40), dtype=np.int64)
    inputs, targets = passkey_examples(tokenizer, text, 64, 5, 4, "\nPASSKEY = ", np.random.default_rng(0))
    key = tokenizer.encode("\nPASSKEY = ")
    for row, target in zip(inputs, targets):
        digits = tokenizer.decode([int(t) for t in target[-4:]])
        assert digits.isdigit() and tokenizer.decode(row.tolist()).count("\nPASSKEY = " + digits) == 1
        assert row[-4 - len(key) + 1:].tolist() == key + [int(t) for t in target[-4:-1]]
    net = model(block_size=16)
    result = passkey(net, tokenizer, text, [32, 64], 6, 4, "\nPASSKEY = ", 0, 4, torch.device("cpu"))
    assert set(result["lengths"]) == {"32", "64"}
    for length, scores in result["lengths"].items():  # by hand: the same sequences, the argmax at the last 4
        x, y = passkey_examples(tokenizer, text, int(length), 6, 4, "\nPASSKEY = ",
                                np.random.default_rng([0, int(length)]))
        with torch.no_grad():
            logits, _ = net(torch.from_numpy(x), positions=torch.arange(int(length)).expand(6, -1))
        right = (logits.argmax(-1)[:, -4:] == torch.from_numpy(y[:, -4:])).double()
        assert scores == {"digits": float(right.mean()), "keys": float(right.min(dim=1).values.mean())}
