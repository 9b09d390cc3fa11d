"""gemv_layout stores a decoding model's wide matrices (in, out) in memory, decode_layout adds oneDNN's packed copies at
more than one thread: nothing a caller sees changes but speed."""

import copy

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.inference.decoding import generate
from gpt.inference.weight_layout import decode_layout, gemv_layout, onednn_available, onednn_linears, packed_forward


def model_and_copy(**options) -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    config = GPTConfig(**{**dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50), **options})
    model = GPT(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # decisive greedy choices: rounding cannot flip a token
    return model, copy.deepcopy(model)


def test_wide_matrices_are_restrided_in_place_and_nothing_else_changes():
    model, before = model_and_copy()
    assert gemv_layout(model) == 2 * 2 + 1  # each layer's c_attn and c_fc, and the tied head once
    for (name, param), (_, old) in zip(model.named_parameters(), before.named_parameters()):
        assert torch.equal(param, old) and param.shape == old.shape, name
        wide = param.dim() == 2 and param.size(0) > param.size(1) and "wpe" not in name
        assert param.is_contiguous() != wide, name  # a wide matrix: a transposed view of an (in, out) tensor
    assert model.lm_head.weight is model.transformer.wte.weight  # still one tied Parameter
    assert model.transformer.h[0].mlp.c_proj.weight.is_contiguous()  # 128 -> 32: its rows are the longer side
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in before.state_dict().items())
    assert gemv_layout(model) == 0  # a second call finds nothing to do


def test_a_restrided_model_decodes_the_same_tokens_and_logits():
    """Greedy tokens equal the original storage's, with the cache and by recomputation (a window sliding twice);
    logits within float32 rounding of the original's (the products sum in another order)."""
    for options in ({}, {"n_kv_head": 2, "designs": ["rope"]}):
        model, before = model_and_copy(**options)
        gemv_layout(model)
        prompt = torch.tensor([[3, 1, 4, 1, 5]])
        tokens = generate(before, prompt, 30, temperature=0.0)
        assert torch.equal(generate(model, prompt, 30, temperature=0.0), tokens)
        assert torch.equal(generate(model, prompt, 30, temperature=0.0, kv_cache=False), tokens)
        with torch.no_grad():
            torch.testing.assert_close(model(tokens[:, :16])[0], before(tokens[:, :16])[0], rtol=1e-5, atol=1e-5)


@pytest.fixture
def threads():
    """Set torch's threads for one test and put them back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def counted_onednn_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    pointwise = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *args: calls.append(1) or pointwise(*args))
    return calls


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN prepacked linear")
def test_decode_layout_packs_the_large_linears_at_two_threads_and_decodes_the_same_tokens(monkeypatch, threads):
    """At 2 threads a decoding model's large float32 Linears go through oneDNN's copies packed for one row (the
    default model's small ones stay MKL's), one-row steps included; the greedy tokens are the unpacked model's and
    the weights are untouched. At 1 thread nothing is packed: a one-row product keeps MKL's gemv there."""
    model, before = model_and_copy(n_embd=512)  # c_fc 512 x 2048: 2^20 weights; c_proj 2^20; c_attn 3 x 2^18
    threads(1)
    single = copy.deepcopy(model)
    decode_layout(single)
    assert packed_forward(single.transformer.h[0].mlp.c_fc) is None
    threads(2)
    decode_layout(model)
    packed = [name for name, m in model.named_modules() if packed_forward(m) is not None]
    assert packed == [f"transformer.h.{i}.{p}" for i in range(2) for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                          "mlp.c_proj")]  # the head: 50 x 512, small
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    tokens = generate(before, prompt, 10, temperature=0.0)
    calls = counted_onednn_calls(monkeypatch)
    assert torch.equal(generate(model, prompt, 10, temperature=0.0), tokens)
    assert len(calls) == 10 * len(packed)  # the prefill and 9 one-row steps, every large product packed
    assert torch.equal(generate(single, prompt, 10, temperature=0.0), tokens)
    assert len(calls) == 10 * len(packed)  # nothing packed at one thread
    for (name, param), (_, old) in zip(model.named_parameters(), before.named_parameters()):
        assert torch.equal(param, old), name


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN prepacked linear")
def test_a_packed_linear_keeps_mkl_for_one_row_at_one_thread_and_for_autograd(monkeypatch, threads):
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 512)
    assert onednn_linears(linear, rows=1) == 1 and onednn_linears(linear) == 0  # a second call packs nothing
    calls = counted_onednn_calls(monkeypatch)
    row, rows = torch.randn(1, 512), torch.randn(4, 512)
    with torch.no_grad():
        threads(1)
        assert torch.equal(linear(row), torch.nn.functional.linear(row, linear.weight, linear.bias)) and not calls
        torch.testing.assert_close(linear(rows), rows @ linear.weight.T + linear.bias)
        assert len(calls) == 1
        threads(2)
        torch.testing.assert_close(linear(row), row @ linear.weight.T + linear.bias)
        assert len(calls) == 2
    out = linear(rows)  # grad enabled and the weight trains: nn.Linear's own, a graph to the weight
    assert out.requires_grad and len(calls) == 2
