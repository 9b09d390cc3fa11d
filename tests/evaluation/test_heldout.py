"""The full held-out pass: every target scored once, losses equal to a position-by-position float64 reference,
bits per byte counting the text's own UTF-8 bytes."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from gpt.evaluation.heldout import byte_lengths, full_pass, window_plan
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.tokenizers.tokenizer import CharTokenizer

TEXT = "héllo wörld, the quick brown fox — jumps over the lazy dog.\n" * 3


@given(st.integers(0, 200), st.integers(1, 16), st.data())
def test_every_target_is_scored_exactly_once_with_the_context_its_window_allows(n, block, data):
    stride = data.draw(st.integers(1, block))
    scored = []
    for a, b, first in window_plan(n, block, stride):
        assert 0 <= a < b <= n - 1 and b - a <= block and 0 <= first < b - a
        scored += list(range(a + 1 + first, b + 1))
        if a > 0:  # a later window: its first scored target sees at least block - stride earlier tokens
            assert first >= block - stride
    assert scored == list(range(1, n)) if n >= 2 else scored == []


@pytest.fixture(scope="module")
def model_and_tokens():
    tokenizer = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=tokenizer.vocab_size,
                          dropout=0.0)).double()
    return model, tokenizer, np.array(tokenizer.encode(TEXT), dtype=np.uint16)


def reference_nats(model, tokens, block, stride) -> list[float]:
    """Each target's loss from its own forward pass over exactly the context its window gives it, in float64."""
    nats = []
    for a, b, first in window_plan(len(tokens), block, stride):
        for j in range(a + 1 + first, b + 1):
            context = torch.tensor(tokens[a:j], dtype=torch.long)[None]
            logits, _ = model(context)
            nats.append(-F.log_softmax(logits[0, -1].double(), -1)[int(tokens[j])].item())
    return nats


@pytest.mark.parametrize("stride", [16, 5])
def test_full_pass_matches_a_position_by_position_float64_reference(model_and_tokens, stride):
    model, tokenizer, tokens = model_and_tokens
    result = full_pass(model, tokens, tokenizer, block_size=16, batch_size=3, stride=stride)
    nats = reference_nats(model, tokens, 16, stride)
    assert result.tokens == len(tokens) - 1 == len(nats)
    assert result.loss == pytest.approx(sum(nats) / len(nats), abs=1e-10)
    assert result.ppl == pytest.approx(math.exp(result.loss))
    assert result.bytes == len(TEXT.encode()) - len(TEXT[0].encode())  # every character but the first
    assert result.bpb == pytest.approx(sum(nats) / math.log(2) / result.bytes, rel=1e-12)
    assert result.windows == len(window_plan(len(tokens), 16, stride))


def test_the_batch_size_does_not_change_the_result(model_and_tokens):
    model, tokenizer, tokens = model_and_tokens
    one = full_pass(model, tokens, tokenizer, block_size=16, batch_size=1)
    many = full_pass(model, tokens, tokenizer, block_size=16, batch_size=64)
    assert one.loss == pytest.approx(many.loss, abs=1e-12) and one.bytes == many.bytes


def test_end_of_text_and_padding_ids_stand_for_no_bytes():
    class WithEOT(CharTokenizer):
        eot_token = 2

    lengths = byte_lengths(WithEOT(["a", "é", "<eot>"]), vocab_size=5)
    assert lengths.tolist() == [1, 2, 0, 0, 0]


def test_a_stride_outside_the_window_is_refused(model_and_tokens):
    model, tokenizer, tokens = model_and_tokens
    with pytest.raises(ValueError, match="stride must be in"):
        full_pass(model, tokens, tokenizer, block_size=16, stride=17)
