import pytest
import torch

from gpt import attention
from gpt.attention.masks import causal_mask

KERNELS = ["manual", "sdpa"]


def make_qkv(B=2, H=4, Hkv=4, Tq=6, Tk=6, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, Tk, D, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, Tk, D, generator=g, requires_grad=True)
    return q, k, v


def forward_and_grads(kernel, q, k, v, **kw):
    out = attention.get(kernel)(q, k, v, **kw)
    weight = torch.linspace(-1, 1, out.numel()).view_as(out)  # a non-uniform upstream gradient
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    return out, grads


def test_registry_lists_the_builtin_kernels():
    assert {"manual", "sdpa"} <= set(attention.available())
    with pytest.raises(KeyError, match="unknown attention kernel 'nope'"):
        attention.get("nope")


def test_users_can_register_a_kernel_and_select_it_by_config():
    from gpt import GPT, GPTConfig
    from gpt.attention import registry

    calls = []

    @attention.register("counting")
    def counting(q, k, v, **kw):
        calls.append(q.shape)
        return attention.get("manual")(q, k, v, **kw)

    try:
        with pytest.raises(ValueError, match="already registered"):
            attention.register("counting")(counting)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, attention="counting"))
        model(torch.zeros(1, 8, dtype=torch.long))
        assert len(calls) == 2
    finally:
        registry._KERNELS.pop("counting")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq,Tk", [(6, 6), (2, 7), (1, 9)])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (4, 1)])
def test_manual_and_sdpa_agree_forward_and_backward(causal, Tq, Tk, H, Hkv):
    q, k, v = make_qkv(H=H, Hkv=Hkv, Tq=Tq, Tk=Tk)
    out_a, grads_a = forward_and_grads("manual", q, k, v, causal=causal)
    out_b, grads_b = forward_and_grads("sdpa", q, k, v, causal=causal)
    torch.testing.assert_close(out_a, out_b, atol=1e-5, rtol=1e-5)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_masks_and_fully_masked_rows_give_zeros_not_nan(kernel):
    q, k, v = make_qkv(Tq=5, Tk=7)
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 0, 2] = False  # batch 0, query 2 may attend nowhere
    for causal in (True, False):
        out, grads = forward_and_grads(kernel, q, k, v, causal=causal, mask=mask)
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
        assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
        ref, ref_grads = forward_and_grads("manual", q, k, v, causal=causal, mask=mask)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g, rg, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_matches_a_float64_reference_with_custom_scale(kernel):
    q, k, v = make_qkv(Tq=3, Tk=8)
    qd, kd, vd = (t.detach().double() for t in (q, k, v))
    scores = (qd @ kd.transpose(-1, -2)) * 0.3
    scores = scores.masked_fill(~causal_mask(3, 8), float("-inf"))
    expected = torch.softmax(scores, -1) @ vd
    out = attention.get(kernel)(q, k, v, causal=True, scale=0.3)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_causal_mask_is_bottom_right_aligned():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("kernel", KERNELS)
def test_dropout_only_changes_output_when_asked(kernel):
    q, k, v = make_qkv()
    torch.manual_seed(0)
    a = attention.get(kernel)(q, k, v, dropout_p=0.5)
    b = attention.get(kernel)(q, k, v, dropout_p=0.0)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, attention.get("manual")(q, k, v), atol=1e-5, rtol=1e-5)
