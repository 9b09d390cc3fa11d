"""Causal linear attention (gpt/designs/linear.py): the chunked form with a carried state equals the whole sequence,
decoding keeps a state of fixed size, the pictures reproduce the layer, and what it cannot combine with is refused."""

import pytest
import torch

from conftest import perturbed_model
from gpt import GPTConfig
from gpt.designs.linear import causal_linear_attention, linear_weights
from gpt.errors import ConfigError
from gpt.model.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, designs=["linear"])


def test_chunks_with_a_carried_state_equal_the_whole_sequence_and_padding_adds_nothing():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 10, 8, generator=g)  # (B, H, T, D)
    k, v = torch.randn(2, 2, 10, 8, generator=g), torch.randn(2, 2, 10, 8, generator=g)  # (B, Hkv, T, D): GQA
    whole, (S, z) = causal_linear_attention(q, k, v)
    first, state = causal_linear_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6])
    parts = [first]
    for t in range(6, 10):  # one token at a time, as decoding does
        y, state = causal_linear_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state=state)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, dim=2), whole)
    torch.testing.assert_close(state[0], S)
    torch.testing.assert_close(state[1], z)
    assert S.shape == (2, 2, 8, 8) and z.shape == (2, 2, 8)
    padded = torch.tensor([[False, False] + [True] * 8, [True] * 10])  # row 0: two padding keys in front
    y, _ = causal_linear_attention(q, k, v, key_mask=padded)
    alone, _ = causal_linear_attention(q[:1, :, 2:], k[:1, :, 2:], v[:1, :, 2:])
    torch.testing.assert_close(y[:1, :, 2:], alone)


def test_the_decode_state_keeps_its_size():
    model = perturbed_model(TINY | dict(n_kv_head=2), sharpen=2.0)
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        model(seq[:, :3], cache=cache)
        held = cache.layers[0].held_bytes()
        for t in range(3, 16):
            model(seq[:, t:t + 1], cache=cache)
    assert held == cache.layers[0].held_bytes() == 2 * 2 * (8 * 8 + 8) * 4  # (B, Hkv, D, D) + (B, Hkv, D), fp32


@pytest.mark.parametrize("options, message", [
    (dict(design_options={"linear": {"feature": "relu"}}),
     "model.design_options.linear.feature must be one of elu1, got 'relu'"),
    (dict(window=4), "model.designs=.linear. cannot be combined with model.window: its running state sums"),
    (dict(designs=["linear", "rope"]), "model.designs names rope and linear, which cannot be combined: rotations"),
    (dict(designs=["linear", "alibi"]), "model.designs names alibi and linear, which cannot be combined"),
    (dict(designs=["linear", "softcap"], attention="manual"), "names softcap and linear, which cannot be combined"),
    (dict(designs=["linear", "sink"], attention="manual"), "names sink and linear, which cannot be combined"),
    (dict(designs=["linear", "diff"]), "names diff and linear, which cannot be combined"),
])
def test_what_linear_attention_cannot_have_is_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**{**TINY, **options})
    assert "linear" in caught.value.hint


def test_the_pictures_show_the_weights_linear_attention_uses():
    from gpt.inference.visualize import attention_maps

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 6, 8, generator=g)  # (B, H, T, D)
    k, v = torch.randn(1, 2, 6, 8, generator=g), torch.randn(1, 2, 6, 8, generator=g)  # (B, Hkv, T, D)
    weights = linear_weights(q, k)  # (B, H, T, T)
    torch.testing.assert_close(weights @ v.repeat_interleave(2, dim=1), causal_linear_attention(q, k, v)[0])
    maps = attention_maps(perturbed_model(TINY | dict(n_kv_head=2)), torch.arange(10)[None])
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 10), atol=1e-5, rtol=0)
