"""Causal linear attention (model.linear_attn=elu1): a float64 reference written out token by token, the chunked
form with a carried state equals the whole sequence, decoding keeps a state of fixed size and gives the tokens of
recomputation (left-padded batches too), a run resumes bit for bit, and what it cannot combine with is refused."""

import pytest
import torch

from conftest import perturbed_model, train_stop_and_resume
from gpt import GPTConfig
from gpt.attention.linear import causal_linear_attention
from gpt.decoding import generate, generate_batch
from gpt.errors import ConfigError
from gpt.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, linear_attn="elu1")
CASES = {"mha": dict(), "gqa+qk_norm": dict(n_kv_head=2, qk_norm=True), "mqa": dict(n_kv_head=1)}


def phi(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1, written out."""
    return torch.where(x > 0, x + 1, torch.exp(x))


def reference_layer(attn, x: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    """Katharopoulos et al. eq. 4 in float64, one query at a time: sum_j phi(q).phi(k_j) v_j / sum_j phi(q).phi(k_j)."""
    H, D, C, Hkv = config.n_head, config.head_dim, config.n_embd, config.n_kv_head
    qkv = x @ attn.c_attn.weight.double().T + attn.c_attn.bias.double()
    q = qkv[..., :C].unflatten(-1, (H, D))  # (B, T, H, D)
    k, v = qkv[..., C:].unflatten(-1, (2 * Hkv, D)).split(Hkv, dim=2)  # (B, T, Hkv, D) each
    if config.qk_norm:
        q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + 1e-6) * attn.q_norm.weight.double()
        k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + 1e-6) * attn.k_norm.weight.double()
    B, T = x.shape[:2]
    y = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kv = h // (H // Hkv)
            for i in range(T):
                w = torch.stack([phi(q[b, i, h]) @ phi(k[b, j, kv]) for j in range(i + 1)])  # (i + 1,) positive
                y[b, i, h] = (w @ v[b, : i + 1, kv]) / (w.sum() + 1e-6)
    return y.flatten(2) @ attn.c_proj.weight.double().T + attn.c_proj.bias.double()


@pytest.mark.parametrize("case", CASES)
def test_the_layer_matches_the_float64_reference(case):
    model = perturbed_model(TINY | CASES[case]).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    attn = model.transformer.h[1].attn
    with torch.no_grad():
        got = attn(x)
    torch.testing.assert_close(got, reference_layer(attn, x, model.config), atol=1e-10, rtol=1e-10)


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


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_are_the_same_with_and_without_the_state_cache(case):
    model = perturbed_model(TINY | CASES[case], sharpen=6.0)
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    cached = generate(model, prompt, 30, temperature=0.0, kv_cache=True)  # crosses block_size: the state is rebuilt
    assert torch.equal(cached, generate(model, prompt, 30, temperature=0.0, kv_cache=False))
    prompts = [[3, 1, 4, 1, 5], [9, 2]]  # left-padded into one batch
    batch = generate_batch(model, prompts, 8, temperature=0.0, kv_cache=True)
    assert batch == [generate(model, torch.tensor([p]), 8, temperature=0.0, kv_cache=False)[0].tolist()
                     for p in prompts]


def test_the_decode_state_keeps_its_size_and_cached_logits_equal_recomputation():
    model = perturbed_model(TINY | dict(n_kv_head=2), sharpen=2.0)
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        full, _ = model(seq)
        prefill, _ = model(seq[:, :3], cache=cache)
        held = cache.layers[0].held_bytes()
        steps = [model(seq[:, t : t + 1], cache=cache)[0] for t in range(3, 16)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
    assert held == cache.layers[0].held_bytes() == 2 * 2 * (8 * 8 + 8) * 4  # (B, Hkv, D, D) + (B, Hkv, D), fp32


@pytest.mark.parametrize("options, message", [
    (dict(linear_attn="relu"), "model.linear_attn must be one of elu1 or null, got 'relu'"),
    (dict(window=4), "model.linear_attn=elu1 cannot be combined with model.window: its running state sums"),
    (dict(pos_embedding="rope"), "cannot be combined with model.pos_embedding=rope: rotations"),
    (dict(pos_embedding="alibi"), "cannot be combined with model.pos_embedding=alibi"),
    (dict(attn_softcap=5.0, attention="manual"), "cannot be combined with model.attn_softcap: linear attention forms"),
    (dict(attn_sink=True, attention="manual"), "cannot be combined with model.attn_sink"),
    (dict(diff_attn=True), "cannot be combined with model.diff_attn"),
])
def test_what_linear_attention_cannot_have_is_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**{**TINY, **options})
    assert "model.linear_attn=null" in caught.value.hint


def test_a_linear_attention_model_trains_and_resumes_exactly(tmp_path, data_args):
    """Four steps, a resume to eight, and eight straight: the same weights, bit for bit."""
    variant = ["model=tiny", "model.linear_attn=elu1", "model.n_kv_head=1", *data_args]

    _, resumed, straight = train_stop_and_resume(variant, tmp_path)
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name


def test_attention_pictures_show_the_weights_linear_attention_uses():
    from gpt.attention.linear import linear_weights
    from gpt.visualize import attention_maps

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 6, 8, generator=g)  # (B, H, T, D)
    k, v = torch.randn(1, 2, 6, 8, generator=g), torch.randn(1, 2, 6, 8, generator=g)  # (B, Hkv, T, D)
    weights = linear_weights(q, k)  # (B, H, T, T)
    torch.testing.assert_close(weights @ v.repeat_interleave(2, dim=1), causal_linear_attention(q, k, v)[0])
    model = perturbed_model(TINY | dict(n_kv_head=2))
    expected, _ = model(torch.arange(10)[None])
    maps = attention_maps(model, torch.arange(10)[None])
    assert maps.shape == (2, 4, 10, 10) and torch.all(maps.triu(1) == 0)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 10), atol=1e-5, rtol=0)
    torch.testing.assert_close(model(torch.arange(10)[None])[0], expected)  # the original function is back
