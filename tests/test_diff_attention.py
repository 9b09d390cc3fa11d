"""Differential attention (model.diff_attn, Diff Transformer): a float64 reference written out formula by formula
for every kernel, with grouped-query attention, a window, RoPE on each half, and the score variants; the KV cache
gives the tokens of recomputation; a run resumes bit for bit; bad shapes are refused by name."""

import math

import pytest
import torch

from conftest import assert_greedy_same_with_and_without_cache, kernels_for, perturbed_model, train_stop_and_resume
from gpt import GPT, GPTConfig
from gpt.attention.alibi import alibi_bias
from gpt.attention.rope import rope_angles
from gpt.errors import ConfigError
from gpt.kv_cache import KVCache

TINY = dict(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=50, diff_attn=True)  # head_dim 8: halves of 4
CASES = {
    "plain": dict(),
    "gqa+window": dict(n_kv_head=2, window=4),
    "mqa+rope+qk_norm": dict(n_kv_head=1, pos_embedding="rope", qk_norm=True),
    "alibi+softcap+sink": dict(pos_embedding="alibi", attn_softcap=3.0, attn_sink=True),
}


def rotate(x: torch.Tensor, position: int) -> torch.Tensor:
    """RoPE on one half-query or half-key x (d,): feature i paired with i + d/2, angle position * 10000^(-2i/d)."""
    d = x.numel()
    angle = position * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    a, b = x[: d // 2], x[d // 2:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()])


def rms(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean() + eps) * gain


def reference_layer(attn, x: torch.Tensor, config: GPTConfig, layer: int) -> torch.Tensor:
    """The paper's layer in float64, one query and one head at a time, written without the model's helpers."""
    H, D, C, Hkv, d = config.n_head, config.head_dim, config.n_embd, config.n_kv_head, config.head_dim // 2
    qkv = x @ attn.c_attn.weight.double().T + attn.c_attn.bias.double()
    q = qkv[..., :C].unflatten(-1, (H, D))  # (B, T, H, D)
    k, v = qkv[..., C:].unflatten(-1, (2 * Hkv, D)).split(Hkv, dim=2)  # (B, T, Hkv, D) each
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    lq1, lk1, lq2, lk2 = (getattr(attn, f"lambda_{n}").double() for n in ("q1", "k1", "q2", "k2"))
    lam = math.exp(float(lq1.detach() @ lk1.detach())) - math.exp(float(lq2.detach() @ lk2.detach())) + lam_init
    B, T = x.shape[:2]
    y = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kv = h // (H // Hkv)
            for i in range(T):
                first = 0 if config.window is None else max(0, i - config.window + 1)
                js = range(first, i + 1)
                out = []
                for half in (slice(0, d), slice(d, D)):  # map 1 from q1, k1; map 2 from q2, k2
                    qi, kj = q[b, i, h, half], [k[b, j, kv, half] for j in js]
                    if config.qk_norm:
                        qi = rms(qi, attn.q_norm.weight.double(), 1e-6)
                        kj = [rms(kk, attn.k_norm.weight.double(), 1e-6) for kk in kj]
                    if config.pos_embedding == "rope":
                        qi, kj = rotate(qi, i), [rotate(kk, j) for kk, j in zip(kj, js)]
                    s = torch.stack([kk @ qi for kk in kj]) / math.sqrt(d)  # (keys,)
                    if config.attn_softcap is not None:
                        s = config.attn_softcap * torch.tanh(s / config.attn_softcap)
                    if config.pos_embedding == "alibi":
                        s = s - 2.0 ** (-8 * (h + 1) / H) * torch.tensor([i - j for j in js], dtype=torch.float64)
                    e = torch.exp(s)
                    total = e.sum() + (torch.exp(attn.sink[h].double()) if config.attn_sink else 0.0)
                    out.append((e / total) @ v[b, list(js), kv])  # (D,): the values keep their full width
                y[b, i, h] = rms(out[0] - lam * out[1], attn.subln.weight.double(), 1e-5) * (1 - lam_init)
    return y.flatten(2) @ attn.c_proj.weight.double().T + attn.c_proj.bias.double()


@pytest.mark.parametrize("case", CASES)
def test_every_kernel_matches_the_float64_reference(case):
    options = CASES[case]
    T = 7
    x = torch.randn(2, T, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    alibi = alibi_bias(4, torch.arange(T), torch.arange(T)).double() if "alibi" in options.values() else None
    rope = rope_angles(torch.arange(T), TINY["n_embd"] // TINY["n_head"] // 2)  # what GPT.forward passes (float32)
    tolerance = 1e-6 if options.get("pos_embedding") == "rope" else 1e-10  # float32 angles; float64 otherwise
    for kernel in kernels_for(options):
        model = perturbed_model(TINY | options, kernel).double()
        for layer in (0, 2):
            attn = model.transformer.h[layer].attn
            expected = reference_layer(attn, x, model.config, layer)
            with torch.no_grad():
                got = attn(x, rope=rope if options.get("pos_embedding") == "rope" else None,
                           window=model.config.window, alibi=alibi)
            torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance,
                                       msg=lambda m: f"{kernel}, layer {layer}: {m}")


def test_lambda_init_follows_the_paper_per_layer_and_the_new_parameters_are_few():
    model = GPT(GPTConfig(**TINY))
    assert [b.attn.lambda_init for b in model.transformer.h] == pytest.approx([0.2, 0.35550907, 0.47071302])
    base = GPT(GPTConfig(**{**TINY, "diff_attn": False})).state_dict()
    added = {n: p.numel() for n, p in model.state_dict().items() if n not in base}
    names = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "subln.weight")
    assert set(added) == {f"transformer.h.{i}.attn.{n}" for i in range(3) for n in names}
    assert sum(added.values()) == 3 * (4 * 4 + 8)  # per layer: four (head_dim/2,) vectors and a (head_dim,) gain
    assert set(base) <= set(model.state_dict())  # nothing renamed or reshaped: c_attn keeps n_head heads


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_are_the_same_with_and_without_the_kv_cache(case):
    for kernel in kernels_for(CASES[case]):
        model = perturbed_model(TINY | CASES[case], kernel, sharpen=6.0)
        assert_greedy_same_with_and_without_cache(model, kernel)


def test_cached_logits_equal_full_recomputation_with_rope_halves_and_a_wrapping_window():
    model = perturbed_model(TINY | dict(pos_embedding="rope", window=5, n_kv_head=2, qk_norm=True), "sdpa", sharpen=2.0)
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        full, _ = model(seq)
        prefill, _ = model(seq[:, :7], cache=cache)
        steps = [model(seq[:, t : t + 1], cache=cache)[0] for t in range(7, 16)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].k.shape == (2, 2, 5, 8)  # keys cached whole (both halves), a ring of window slots


@pytest.mark.parametrize("options, message", [
    (dict(n_embd=36), "model.diff_attn=true needs a head dimension .* divisible by 2, got 9: it splits"),
    (dict(n_embd=24, pos_embedding="rope"), "divisible by 4, got 6: .* pos_embedding=rope rotates each half"),
    (dict(diff_attn="yes"), "model.diff_attn must be true or false, got 'yes'"),
])
def test_bad_configs_are_refused_naming_the_option(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**{**TINY, **options})
    assert "\n" not in str(caught.value)


def test_checkpoints_from_before_diff_attn_load_as_the_same_shape():
    old = GPTConfig(**{**TINY, "diff_attn": False}).to_dict()
    del old["diff_attn"]
    assert GPTConfig.from_dict(old) == GPTConfig(**{**TINY, "diff_attn": False})
    assert GPTConfig(**TINY).shape_differences(old) == ["model.diff_attn is False in the checkpoint but True now"]


def test_a_differential_model_trains_and_resumes_exactly(tmp_path, data_args):
    """Four steps, a resume to eight, and eight straight: the same weights, bit for bit (lambdas included)."""
    variant = ["model=tiny", "model.diff_attn=true", "model.pos_embedding=rope", "model.qk_norm=true",
               "model.n_kv_head=1", *data_args]

    first, resumed, straight = train_stop_and_resume(variant, tmp_path)
    assert not torch.equal(first["transformer.h.1.attn.lambda_q2"], straight["transformer.h.1.attn.lambda_q2"])
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name


def test_attention_pictures_show_each_layers_differential_map():
    from gpt.visualize import attention_maps

    model = perturbed_model(TINY | {}, "sdpa")
    maps = attention_maps(model, torch.arange(10)[None])  # w1 - lambda * w2 per layer: rows sum to 1 - lambda
    assert maps.shape == (3, 4, 10, 10) and torch.all(maps.triu(1) == 0)
    for layer, block in enumerate(model.transformer.h):
        lam = float(block.attn.diff_lambda().detach())
        torch.testing.assert_close(maps[layer].sum(-1), torch.full((4, 10), 1 - lam), atol=1e-5, rtol=0)
