"""gemv_layout stores a decoding model's wide matrices (in, out) in memory: nothing a caller sees changes but speed."""

import copy

import torch

from gpt import GPT, GPTConfig
from gpt.inference.decoding import generate
from gpt.inference.weight_layout import gemv_layout


def model_and_copy(**options) -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, **options)
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
