"""Multi-head latent attention (model.mla_latent, DeepSeek-V2 section 2.1): a float64 reference written out formula by
formula for every kernel, a KV cache that keeps only the latent and the shared rotated key (smaller by the formula),
the tokens and logits of recomputation (left-padded batches and a window ring too), an exact resume, refusals."""

import math

import pytest
import torch

from conftest import assert_greedy_same_with_and_without_cache, kernels_for, perturbed_model, train_stop_and_resume
from gpt import GPT, GPTConfig
from gpt.attention.rope import rope_angles
from gpt.decoding import generate, generate_batch
from gpt.errors import ConfigError
from gpt.kv_cache import KVCache, LatentKV

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, mla_latent=12)  # head_dim 8, d_R 4
CASES = {
    "plain": dict(),
    "window+wide_rope": dict(window=4, mla_rope_dim=6),
    "softcap+sink": dict(attn_softcap=3.0, attn_sink=True),
    "no_bias+wide_latent": dict(bias=False, mla_latent=80, mla_rope_dim=2),
}


def rotate(x: torch.Tensor, position: int) -> torch.Tensor:
    """RoPE on one vector x (d,): feature i paired with i + d/2, angle position * 10000^(-2i/d)."""
    d = x.numel()
    angle = position * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    a, b = x[: d // 2], x[d // 2:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()])


def linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = x @ layer.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


def reference_layer(attn, x: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    """DeepSeek-V2 eqs. 9-19 (no query compression) in float64, one query and one head at a time."""
    H, D, R = config.n_head, config.head_dim, config.mla_rope_dim
    q_c = linear(attn.query, x).unflatten(-1, (H, D))  # (B, T, H, D)   q^C = W^Q h
    q_r = linear(attn.q_rope, x).unflatten(-1, (H, R))  # (B, T, H, R)  q^R = W^QR h, rotated below
    latent = linear(attn.kv_down, x)  # (B, T, d_c)                       c^KV = W^DKV h
    k_c = linear(attn.k_up, latent).unflatten(-1, (H, D))  # (B, T, H, D) k^C = W^UK c^KV
    v = linear(attn.v_up, latent).unflatten(-1, (H, D))  # (B, T, H, D)  v^C = W^UV c^KV
    k_r = linear(attn.k_rope, x)  # (B, T, R)                             k^R = W^KR h, one for every head
    B, T = x.shape[:2]
    y = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                first = 0 if config.window is None else max(0, i - config.window + 1)
                js = list(range(first, i + 1))
                s = torch.stack([(q_c[b, i, h] @ k_c[b, j, h] + rotate(q_r[b, i, h], i) @ rotate(k_r[b, j], j))
                                 for j in js]) / math.sqrt(D + R)  # (keys,)
                if config.attn_softcap is not None:
                    s = config.attn_softcap * torch.tanh(s / config.attn_softcap)
                e = torch.exp(s)
                total = e.sum() + (torch.exp(attn.sink[h].double()) if config.attn_sink else 0.0)
                y[b, i, h] = (e / total) @ v[b, js, h]
    return linear(attn.c_proj, y.flatten(2))


@pytest.mark.parametrize("case", CASES)
def test_every_kernel_matches_the_float64_reference(case):
    options = CASES[case]
    T = 7
    x = torch.randn(2, T, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for kernel in kernels_for(options):
        model = perturbed_model(TINY | options, kernel).double()
        rope = rope_angles(torch.arange(T), model.config.mla_rope_dim)  # what GPT.forward passes (float32 angles)
        for layer in (0, 1):
            attn = model.transformer.h[layer].attn
            expected = reference_layer(attn, x, model.config)
            with torch.no_grad():
                got = attn(x, rope=rope, window=model.config.window)
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6,
                                       msg=lambda m: f"{kernel}, layer {layer}: {m}")


def test_the_projections_have_readable_names_and_the_paper_s_shapes():
    model = GPT(GPTConfig(**TINY))
    assert model.config.mla_rope_dim == 4  # None: head_dim / 2
    shapes = {n.removeprefix("transformer.h.0.attn."): tuple(p.shape) for n, p in model.named_parameters()
              if n.startswith("transformer.h.0.attn.") and n.endswith("weight")}
    assert shapes == {"query.weight": (32, 32), "q_rope.weight": (16, 32), "kv_down.weight": (12, 32),
                      "k_up.weight": (32, 12), "v_up.weight": (32, 12), "k_rope.weight": (4, 32),
                      "c_proj.weight": (32, 32)}
    assert "transformer.wpe.weight" in model.state_dict()  # learned absolute positions stay (GPT-2's table)
    assert [GPTConfig(**{**TINY, "n_embd": c}).mla_rope_dim for c in (48, 24, 8)] == [6, 2, 2]  # even, at least 2


def test_the_cache_keeps_the_latent_and_the_shared_rotated_key_and_equals_recomputation():
    for options in (dict(), dict(window=5)):  # a window: the latents sit in a ring of 5 slots
        model = perturbed_model(TINY | options, sharpen=2.0)
        seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
        cache = KVCache(model.config, batch_size=2, device="cpu")
        with torch.no_grad():
            full, _ = model(seq)
            prefill, _ = model(seq[:, :7], cache=cache)
            steps = [model(seq[:, t : t + 1], cache=cache)[0] for t in range(7, 16)]
        torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
        layer = cache.layers[0]
        assert isinstance(layer, LatentKV)
        slots = options.get("window", 16)
        assert layer.c.shape == (2, slots, 12) and layer.k_rope.shape == (2, slots, 4)
        assert layer.held_bytes() == 2 * slots * (12 + 4) * 4  # (d_c + d_R) fp32 numbers per token


def test_kv_bytes_per_token_shrink_by_the_formula():
    from gpt.bench.arena import kv_bytes_per_token

    config = dict(n_layer=3, n_head=4, n_embd=64, block_size=16, vocab_size=50)  # head_dim 16
    plain = kv_bytes_per_token(GPT(GPTConfig(**config)).eval(), "cpu")
    latent = kv_bytes_per_token(GPT(GPTConfig(**config, mla_latent=20)).eval(), "cpu")
    assert plain == 2 * 4 * 16 * 3 * 4  # 2 x n_head x head_dim x layers x 4 bytes
    assert latent == (20 + 8) * 3 * 4  # (d_c + d_R) x layers x 4 bytes: 336 instead of 1536


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_are_the_same_with_and_without_the_kv_cache(case):
    for kernel in kernels_for(CASES[case]):
        model = perturbed_model(TINY | CASES[case], kernel, sharpen=6.0)
        assert_greedy_same_with_and_without_cache(model, kernel)


def test_left_padded_batches_decode_as_each_prompt_alone():
    model = perturbed_model(TINY, sharpen=6.0)
    prompts = [[3, 1, 4, 1, 5], [9, 2]]  # left-padded into one batch
    batch = generate_batch(model, prompts, 8, temperature=0.0, kv_cache=True)
    assert batch == [generate(model, torch.tensor([p]), 8, temperature=0.0, kv_cache=False)[0].tolist()
                     for p in prompts]


@pytest.mark.parametrize("options, message", [
    (dict(mla_latent=0), "model.mla_latent must be a positive integer or null, got 0"),
    (dict(mla_latent=True), "model.mla_latent must be a positive integer or null, got True"),
    (dict(mla_rope_dim=3), "model.mla_rope_dim must be a positive even integer, got 3"),
    (dict(mla_rope_dim=0), "model.mla_rope_dim must be a positive even integer, got 0"),
    (dict(mla_latent=None, mla_rope_dim=4), "model.mla_rope_dim=4 is set but model.mla_latent is not"),
    (dict(pos_embedding="rope"), "model.mla_latent=12 cannot be combined with model.pos_embedding=rope: MLA applies"),
    (dict(pos_embedding="alibi"), "cannot be combined with model.pos_embedding=alibi"),
    (dict(n_kv_head=2), "cannot be combined with model.n_kv_head=2: every head's keys and values come from"),
    (dict(qk_norm=True), "cannot be combined with model.qk_norm"),
    (dict(diff_attn=True), "cannot be combined with model.diff_attn"),
    (dict(linear_attn="elu1"), "cannot be combined with model.linear_attn"),
])
def test_what_latent_attention_cannot_have_is_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**{**TINY, **options})
    assert "\n" not in str(caught.value) and caught.value.hint


def test_checkpoints_from_before_mla_load_as_the_same_shape():
    plain = GPTConfig(**{**TINY, "mla_latent": None})
    old = plain.to_dict()
    del old["mla_latent"], old["mla_rope_dim"]
    assert GPTConfig.from_dict(old) == plain and plain.shape_differences(old) == []
    assert GPTConfig(**TINY).shape_differences(old) == ["model.mla_latent is None in the checkpoint but 12 now",
                                                         "model.mla_rope_dim is None in the checkpoint but 4 now"]


def test_a_latent_attention_model_trains_and_resumes_exactly(tmp_path, data_args):
    """Four steps, a resume to eight, and eight straight: the same weights, bit for bit."""
    variant = ["model=tiny", "model.mla_latent=8", *data_args]

    first, resumed, straight = train_stop_and_resume(variant, tmp_path)
    latent = "transformer.h.1.attn.kv_down.weight"
    assert not torch.equal(first[latent], straight[latent])
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name


def test_attention_pictures_show_latent_attention_weights():
    from gpt.visualize import attention_maps

    model = perturbed_model(TINY)
    expected, _ = model(torch.arange(10)[None])
    maps = attention_maps(model, torch.arange(10)[None])
    assert maps.shape == (2, 4, 10, 10) and torch.all(maps.triu(1) == 0)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 10), atol=1e-5, rtol=0)
    torch.testing.assert_close(model(torch.arange(10)[None])[0], expected)  # the original kernels are back
