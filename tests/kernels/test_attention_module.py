"""gpt.kernels.MultiHeadAttention: cross-attention and padding against a float64 reference and torch's module."""

import math

import pytest
import torch

from gpt import kernels as attention
from gpt.kernels import MultiHeadAttention


def reference_mha(mha: MultiHeadAttention, x, context, allowed):
    """The module's function written out in float64: project, attend per head over allowed keys, project."""
    sd = {k: v.double() for k, v in mha.state_dict().items()}
    x, context = x.double(), context.double()
    B, t_q, C = x.shape
    H, Hkv, D = mha.n_head, mha.n_kv_head, mha.head_dim
    q = x @ sd["q_proj.weight"].T + sd["q_proj.bias"]
    kv = context @ sd["kv_proj.weight"].T + sd["kv_proj.bias"]
    k, v = kv[..., : Hkv * D], kv[..., Hkv * D:]
    out = torch.zeros(B, t_q, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            qh, kh, vh = q[b, :, h * D:(h + 1) * D], k[b, :, g * D:(g + 1) * D], v[b, :, g * D:(g + 1) * D]
            scores = (qh @ kh.T) / math.sqrt(D)
            scores = scores.masked_fill(~allowed[b], float("-inf"))
            weights = torch.nan_to_num(torch.softmax(scores, -1))  # empty rows -> zeros
            out[b, :, h] = weights @ vh
    return out.reshape(B, t_q, C) @ sd["out_proj.weight"].T + sd["out_proj.bias"]


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 16, generator=g)  # 5 queries, width 16
    context = torch.randn(2, 7, 12, generator=g)  # 7 keys/values from another sequence, width 12
    key_padding = torch.ones(2, 7, dtype=torch.bool)
    key_padding[1, 4:] = False  # batch 1: only 4 real keys
    attn_mask = torch.ones(5, 7, dtype=torch.bool)
    attn_mask[2] = False  # query 2 may see nothing
    attn_mask[0, 0] = False
    return x, context, key_padding, attn_mask


@pytest.mark.parametrize("kernel", attention.available())
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_cross_attention_with_padding_and_mask_matches_the_reference(kernel, n_kv_head):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_head=n_kv_head, kv_dim=12, kernel=kernel).eval()
    x, context, key_padding, attn_mask = inputs()
    with torch.no_grad():
        out = mha(x, context, key_padding_mask=key_padding, attn_mask=attn_mask)
    allowed = key_padding[:, None, :] & attn_mask[None]
    expected = reference_mha(mha, x, context, allowed)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, 2], mha.out_proj.bias.expand(2, 16))  # the empty row: zeros, then out_proj


def test_self_attention_matches_torch_multiheadattention_with_the_mask_inverted():
    """torch's key_padding_mask says True = padding; ours says True = may attend. Same function otherwise."""
    torch.manual_seed(0)
    ours = MultiHeadAttention(16, 4, kernel="manual").eval()
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(2, 6, 16)
    key_padding = torch.ones(2, 6, dtype=torch.bool)
    key_padding[0, 4:] = False
    causal = torch.ones(6, 6).tril().bool()
    with torch.no_grad():
        out = ours(x, key_padding_mask=key_padding, attn_mask=causal)
        expected, _ = theirs(x, x, x, key_padding_mask=~key_padding, attn_mask=~causal, need_weights=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", [k for k in attention.available() if attention.spec(k).trains("cpu")])
def test_causal_window_self_attention_and_gradients_match_manual(kernel):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_head=1, kernel=kernel, causal=True, window=3)
    ref = MultiHeadAttention(16, 4, n_kv_head=1, kernel="manual", causal=True, window=3)
    ref.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 16)
    out, expected = mha(x), ref(x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p), p_ref in zip(mha.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_masks_are_checked():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"):
        mha(x, key_padding_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"attn_mask must be a bool tensor of shape \(5, 5\)"):
        mha(x, attn_mask=torch.ones(5, 4, dtype=torch.bool))
