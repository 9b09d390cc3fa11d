"""Streaming past the context (StreamingLLM): a RoPE model whose cache is a window's ring, with sink tokens or not,
decodes past block_size without sliding, each step equal to the full forward with the window-and-sinks mask, and
its cache's bytes constant."""

from __future__ import annotations

import pytest
import torch

from gpt.inference.decoding import decode_step, prefill, stream
from gpt.inference.generate import streaming
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.model.kv_cache import KVCache, endless

SHAPE = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11, designs=["rope"])


def sinks_of(n: int) -> dict:
    """The stream design with n sink tokens (none for 0)."""
    return dict(designs=["rope", "stream"], design_options={"stream": {"sinks": n}}) if n else {}


@pytest.mark.parametrize("sinks", [0, 2])
def test_decoding_past_block_size_equals_the_full_forward_in_constant_memory(sinks):
    torch.manual_seed(0)
    config = GPTConfig(**{**SHAPE, **sinks_of(sinks)}, window=6)
    model, ids = GPT(config).eval(), torch.randint(0, 11, (1, 64))  # four times block_size
    full, _ = model(ids, positions=torch.arange(64)[None])
    cache = KVCache(config, 1, "cpu")
    prefill(model, ids[:, :3], torch.arange(3)[None], None, cache)
    held, steps = set(), []
    for t in range(3, 64):
        steps.append(decode_step(model, ids[:, t:t + 1], torch.tensor([[t]]), cache))
        held.add(cache.held_bytes())
    assert endless(config) and cache.length == 64
    torch.testing.assert_close(torch.stack(steps, 1)[0], full[0, 3:], atol=1e-5, rtol=0)
    assert held == {config.n_layer * 2 * (6 + sinks) * 16 * 4}  # keys and values of the ring and the sinks, fp32


def test_greedy_streaming_never_slides_and_follows_the_full_forward():
    """stream() with this run's window and sinks (generate.py's window= and sinks=) over a model trained
    without them: 48 tokens from a 3-token prompt, each the argmax of the full forward over all that came before."""
    torch.manual_seed(1)
    trained = GPT(GPTConfig(**SHAPE)).eval()
    model = streaming(trained, 6, 2)
    assert model.config.window == 6 and model.config.design_options["stream"] == {"sinks": 2}
    assert not endless(trained.config)
    prompt = torch.tensor([[1, 2, 3]])
    tokens = torch.cat([prompt, *stream(model, prompt, 48, temperature=0)], dim=1)
    logits, _ = model(tokens[:, :-1], positions=torch.arange(tokens.size(1) - 1)[None])
    assert torch.equal(logits[0, 2:].argmax(-1), tokens[0, 3:])


def test_a_model_with_learned_positions_or_no_window_still_slides():
    assert not endless(GPTConfig(**{**SHAPE, "designs": []}, window=6))
    assert not endless(GPTConfig(**SHAPE))
    assert not endless(GPTConfig(**SHAPE, window=16))  # a window as long as the context keeps no ring
