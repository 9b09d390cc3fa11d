"""model.sink_tokens (StreamingLLM, Xiao et al. 2023): with a sliding window, every query also attends to the
first N tokens, which the KV cache keeps apart from its ring. Checked against a float64 reference on every
kernel, by what each logit may depend on, cache against recomputation, and training with exact resume."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_greedy_same_with_and_without_cache, kernels_for, perturbed_model, train_stop_and_resume
from gpt import GPTConfig
from gpt.attention.masks import sink_band
from gpt.decoding import generate_batch
from gpt.errors import ConfigError, UserError
from gpt.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, window=5, sink_tokens=2)


def reference_layer(attn, x: torch.Tensor, window: int, sinks: int) -> torch.Tensor:
    """One attention layer in float64, written out per query: keys j <= i with i - j < window, or j < sinks."""
    B, T, C = x.shape
    H, D = attn.n_head, attn.head_dim
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    out = torch.zeros_like(q)
    for i in range(T):
        keys = [j for j in range(i + 1) if i - j < window or j < sinks]
        scores = q[:, :, i : i + 1] @ k[:, :, keys].transpose(-1, -2) / D**0.5  # (B, H, 1, len(keys))
        out[:, :, i] = (torch.softmax(scores, dim=-1) @ v[:, :, keys])[:, :, 0]
    return attn.c_proj(out.transpose(1, 2).reshape(B, T, C))


def test_every_kernel_matches_the_float64_reference():
    x = torch.randn(2, 12, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for kernel in kernels_for({}):
        attn = perturbed_model(TINY, kernel).double().transformer.h[0].attn
        with torch.no_grad():
            got = attn(x, key_mask=sink_band(12, 5, 2, None, x.device))
            torch.testing.assert_close(got, reference_layer(attn, x, window=5, sinks=2), rtol=1e-9, atol=1e-9,
                                       msg=kernel)


def test_a_logit_depends_on_its_window_and_the_sink_tokens_only():
    model = perturbed_model({**TINY, "n_layer": 1})  # one layer: position i reads tokens in its window or sinks
    seq = torch.randint(0, 50, (1, 16), generator=torch.Generator().manual_seed(3))
    logits = model(seq)[0]
    for changed, unchanged_from in ((1, None), (6, 11)):  # a sink token; a token outside every later window
        other = seq.clone()
        other[0, changed] = (other[0, changed] + 1) % 50
        moved = (model(other)[0] - logits).abs().amax(-1)[0]  # (T,) the largest change at each position
        if unchanged_from is None:
            assert (moved[changed:] > 0).all()  # a sink: every later position sees it
        else:
            assert (moved[changed:unchanged_from] > 0).all() and (moved[unchanged_from:] == 0).all()


@pytest.mark.parametrize("kernel", ["sdpa", "manual", "einsum", "heads", "flex"])
def test_the_cache_keeps_the_sinks_apart_from_its_ring_and_equals_recomputation(kernel):
    model = perturbed_model(TINY, kernel, sharpen=2.0)
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        steps = [model(seq[:, :3], cache=cache)[0]] + [model(seq[:, t : t + 1], cache=cache)[0] for t in range(3, 16)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(seq)[0], rtol=1e-5, atol=1e-5)
    layer = cache.layers[0]
    assert layer.k.size(2) == 5 and layer.sink_k.size(2) == 2  # a ring of the window, the first two apart
    assert layer.held_bytes() == 2 * 2 * 4 * (5 + 2) * 8 * 4  # k and v, batch 2, 4 heads, 7 slots of 8, fp32
    assert_greedy_same_with_and_without_cache(model, kernel)


def test_sink_tokens_are_a_runtime_choice_refused_where_they_mean_nothing():
    plain = GPTConfig(**{**TINY, "sink_tokens": 0})
    assert plain.shape_differences(GPTConfig(**TINY)) == []  # no parameter: a window model may sample with sinks
    for options, message in ((dict(window=None), "needs a sliding window"),
                             (dict(sink_tokens=-1), "must be a non-negative integer"),
                             (dict(pos_embedding="alibi"), "cannot be combined with model.pos_embedding=alibi"),
                             (dict(mla_latent=8, pos_embedding="learned"), "cannot be combined with model.mla_latent")):
        with pytest.raises(ConfigError, match=message):
            GPTConfig(**{**TINY, **options})
    with pytest.raises(UserError, match="cannot decode a batch of prompts of different lengths"):
        generate_batch(perturbed_model(TINY), [[1, 2, 3], [4]], 4, temperature=0.0, kv_cache=True)


def test_a_model_with_sink_tokens_trains_and_resumes_exactly(tmp_path, data_args):
    """Four steps, a resume to eight, and eight straight: the same weights, bit for bit."""
    variant = ["model=tiny", "model.window=8", "model.sink_tokens=2", *data_args]
    _, resumed, straight = train_stop_and_resume(variant, tmp_path)
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
