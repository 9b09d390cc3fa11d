"""The attention variants (QK-norm, logit soft-capping, ALiBi, sink logits): a float64 reference for each, the KV cache
gives the same tokens as recomputation, and kernels that cannot compute a variant are refused by name."""

import math

import pytest
import torch

from conftest import assert_greedy_same_with_and_without_cache, kernels_for, perturbed_model, train_stop_and_resume
from gpt import GPT, GPTConfig
from gpt.attention.alibi import alibi_bias, alibi_slopes
from gpt.errors import ConfigError
from gpt.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)
VARIANTS = {
    "qk_norm": dict(qk_norm=True),
    "softcap": dict(attn_softcap=2.0),  # small, so the cap bends the scores
    "alibi": dict(pos_embedding="alibi"),
    "sink": dict(attn_sink=True),
    "all+gqa": dict(qk_norm=True, attn_softcap=3.0, pos_embedding="alibi", attn_sink=True, n_kv_head=2),
    "alibi+window+mqa": dict(pos_embedding="alibi", window=5, n_kv_head=1),
}
PAPER_SLOPES_4 = [2**-2, 2**-4, 2**-6, 2**-8]  # ALiBi, 4 heads: the geometric sequence starting at 2^(-8/4)


def reference_layer(attn, x: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    """CausalSelfAttention in float64, one query at a time, each formula written out (no library helpers)."""
    H, D, C, Hkv = config.n_head, config.head_dim, config.n_embd, config.n_kv_head
    W, bias = attn.c_attn.weight.double(), attn.c_attn.bias.double()
    qkv = x @ W.T + bias
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
                first = 0 if config.window is None else max(0, i - config.window + 1)
                js = torch.arange(first, i + 1)
                s = (k[b, js, kv] @ q[b, i, h]) / math.sqrt(D)  # (keys,)
                if config.attn_softcap is not None:
                    s = config.attn_softcap * torch.tanh(s / config.attn_softcap)
                if config.pos_embedding == "alibi":
                    s = s - PAPER_SLOPES_4[h] * (i - js).double()
                e = torch.exp(s)
                denominator = e.sum() + (torch.exp(attn.sink[h].double()) if config.attn_sink else 0.0)
                y[b, i, h] = (e / denominator) @ v[b, js, kv]
    return y.flatten(2) @ attn.c_proj.weight.double().T + attn.c_proj.bias.double()


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_kernel_that_declares_the_variant_matches_the_float64_reference(variant):
    options = VARIANTS[variant]
    x = torch.randn(2, 9, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    alibi = alibi_bias(4, torch.arange(9), torch.arange(9)).double() if "alibi" in str(options) else None
    for kernel in kernels_for(options):
        model = perturbed_model(TINY | options, kernel).double()
        attn = model.transformer.h[0].attn
        expected = reference_layer(attn, x, model.config)
        with torch.no_grad():
            got = attn(x, window=model.config.window, alibi=alibi)
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10, msg=lambda m: f"{kernel}: {m}")


def test_alibi_slopes_follow_the_paper_also_between_powers_of_two():
    assert alibi_slopes(4).tolist() == PAPER_SLOPES_4
    # 6 heads: the 4-head sequence, then every other slope of the 8-head one (2^-1, 2^-3)
    assert alibi_slopes(6).tolist() == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_are_the_same_with_and_without_the_kv_cache(variant):
    for kernel in kernels_for(VARIANTS[variant]):
        model = perturbed_model(TINY | VARIANTS[variant], kernel, sharpen=6.0)
        assert_greedy_same_with_and_without_cache(model, kernel)


@pytest.mark.parametrize("variant", ["alibi", "alibi+window+mqa", "all+gqa"])
def test_cached_logits_equal_full_recomputation_even_when_a_window_ring_wraps(variant):
    model = perturbed_model(TINY | VARIANTS[variant], kernels_for(VARIANTS[variant])[0], sharpen=2.0)
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        full, _ = model(seq)
        prefill, _ = model(seq[:, :7], cache=cache)
        steps = [model(seq[:, t : t + 1], cache=cache)[0] for t in range(7, 16)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)


def test_variants_add_only_their_own_parameters():
    base = set(GPT(GPTConfig(**TINY)).state_dict())
    assert set(GPT(GPTConfig(**TINY, pos_embedding="alibi")).state_dict()) == base - {"transformer.wpe.weight"}
    assert set(GPT(GPTConfig(**TINY, attn_softcap=30.0, attention="manual")).state_dict()) == base
    norms = set(GPT(GPTConfig(**TINY, qk_norm=True)).state_dict()) - base
    assert norms == {f"transformer.h.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    sinks = set(GPT(GPTConfig(**TINY, attn_sink=True, attention="manual")).state_dict()) - base
    assert sinks == {"transformer.h.0.attn.sink", "transformer.h.1.attn.sink"}


def test_kernels_that_cannot_compute_a_variant_are_refused_naming_the_option():
    cases = [
        (dict(attn_softcap=30.0), "attention=sdpa has no logit soft-capping, but model.attn_softcap=30"),
        (dict(attn_sink=True), "attention=sdpa has no attention sink logit, but model.attn_sink=true"),
        (dict(pos_embedding="alibi", attention="flex"), "attention=flex has no additive score bias .*alibi"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message) as caught:
            GPTConfig(**TINY, **options)
        assert "manual" in caught.value.hint.split("attention=")[1]  # a kernel that can
    assert GPTConfig(**TINY, pos_embedding="alibi", attention="sdpa").pos_embedding == "alibi"  # a bias sdpa can take


@pytest.mark.parametrize("options, message", [
    (dict(attn_softcap=0.0), "model.attn_softcap must be a positive number or null, got 0.0"),
    (dict(attn_softcap=-5), "model.attn_softcap must be a positive number"),
    (dict(attn_softcap=float("inf")), "model.attn_softcap must be a positive number"),
    (dict(qk_norm="yes"), "model.qk_norm must be true or false"),
    (dict(attn_sink=1), "model.attn_sink must be true or false"),
])
def test_bad_variant_values_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**TINY, attention="manual", **options)


def test_checkpoints_from_before_the_variants_load_and_resume_as_the_same_shape():
    old = GPTConfig(**TINY).to_dict()
    for name in ("qk_norm", "attn_softcap", "attn_sink"):
        del old[name]
    assert GPTConfig.from_dict(old) == GPTConfig(**TINY)
    assert GPTConfig(**TINY).shape_differences(old) == []
    assert GPTConfig(**TINY, qk_norm=True).shape_differences(old) == [
        "model.qk_norm is False in the checkpoint but True now"]


def test_a_model_with_every_variant_trains_and_resumes_exactly(tmp_path, data_args):
    """Four steps, a resume to eight, and eight straight: the same weights, bit for bit (sinks and gains included)."""
    variant = ["model=tiny", "model.qk_norm=true", "model.pos_embedding=alibi", "model.attn_sink=true",
               "model.attn_softcap=5", "model.n_kv_head=1", "attention=manual", *data_args]

    _, resumed, straight = train_stop_and_resume(variant, tmp_path)
    assert any(name.endswith("attn.sink") for name in straight)
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
