"""Gated attention (gpt/designs/gated.py): the gate is per head and per feature, from the layer's input, applied
before c_proj; with RoPE, QK-norm and grouped heads it is Qwen3-Next's full-attention layer, which transformers'
Qwen3NextAttention computes from the same weights (the outside oracle, and the map an export to Qwen3-Next uses)."""

import pytest
import torch

from conftest import perturbed_model

QWEN3_NEXT = dict(n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=50, designs=["gated", "rope", "qk_norm"],
                  bias=False, n_kv_head=2)


def test_a_closed_gate_silences_its_head_feature_by_feature():
    model = perturbed_model({**QWEN3_NEXT, "bias": True})
    attn = model.transformer.h[0].attn
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(1))
    ctx = model.contexts(torch.zeros(1, 6, dtype=torch.long), None, None, None)[None]
    seen = []
    hook = attn.c_proj.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        attn(x, ctx)
        attn.c_gate.bias[8:16] = -1e4  # head 1's eight features: sigmoid -> 0
        attn(x, ctx)
    hook.remove()
    open_, closed = seen
    assert torch.all(closed[..., 8:16] == 0) and open_[..., 8:16].abs().min() > 0
    torch.testing.assert_close(closed[..., :8], open_[..., :8], rtol=0, atol=0)  # the other heads untouched
    torch.testing.assert_close(closed[..., 16:], open_[..., 16:], rtol=0, atol=0)


def test_the_layer_equals_transformers_qwen3_next_attention():
    """Qwen3-Next's q_proj holds, head by head, the query rows and then the gate rows; its zero-centred RMSNorm
    gains are ours minus one; RoPE over the whole head (partial_rotary_factor 1), base 10,000."""
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                               reason="transformers with Qwen3-Next is not installed: no outside oracle")
    from transformers import Qwen3NextConfig

    model = perturbed_model(QWEN3_NEXT, sharpen=2.0)
    attn = model.transformer.h[1].attn
    config = Qwen3NextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             attention_bias=False, rms_norm_eps=1e-6, partial_rotary_factor=1.0, rope_theta=10000.0,
                             num_hidden_layers=1, layer_types=["full_attention"])
    config._attn_implementation = "eager"
    theirs, rotary = qwen.Qwen3NextAttention(config, 0).eval(), qwen.Qwen3NextRotaryEmbedding(config)
    H, Hk, D = 4, 2, 8
    q, k, v = attn.c_attn.weight.split([H * D, Hk * D, Hk * D])
    with torch.no_grad():
        attn.c_proj.weight.mul_(50)  # outputs of order 1: the comparison means something
        theirs.q_proj.weight.copy_(torch.cat([torch.cat([q[h * D:(h + 1) * D], attn.c_gate.weight[h * D:(h + 1) * D]])
                                              for h in range(H)]))
        theirs.k_proj.weight.copy_(k)
        theirs.v_proj.weight.copy_(v)
        theirs.o_proj.weight.copy_(attn.c_proj.weight)
        theirs.q_norm.weight.copy_(attn.q_norm.weight - 1)
        theirs.k_norm.weight.copy_(attn.k_norm.weight - 1)
    T = 20
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(4))
    ctx = model.contexts(torch.zeros(2, T, dtype=torch.long), None, None, None)[None]
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(2, 1, T, T)
    with torch.no_grad():
        mine = attn(x, ctx)
        expected, _ = theirs(x, rotary(x, torch.arange(T)[None].expand(2, T)), causal)
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)
