"""Differential attention (gpt/designs/diff.py): lambda_init per layer and few new parameters, bad shapes refused,
and the pictures show each layer's differential map."""

import pytest
import torch

from conftest import perturbed_model
from gpt import GPT, GPTConfig
from gpt.errors import ConfigError

TINY = dict(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=50, designs=["diff"])  # head_dim 8: halves of 4


def test_lambda_init_follows_the_paper_per_layer_and_the_new_parameters_are_few():
    model = GPT(GPTConfig(**TINY))
    assert [b.attn.lambda_init for b in model.transformer.h] == pytest.approx([0.2, 0.35550907, 0.47071302])
    base = GPT(GPTConfig(**{**TINY, "designs": []})).state_dict()
    added = {n: p.numel() for n, p in model.state_dict().items() if n not in base}
    names = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "subln.weight")
    assert set(added) == {f"transformer.h.{i}.attn.{n}" for i in range(3) for n in names}
    assert sum(added.values()) == 3 * (4 * 4 + 8)  # per layer: four (head_dim/2,) vectors and a (head_dim,) gain
    assert set(base) <= set(model.state_dict())  # nothing renamed or reshaped: c_attn keeps n_head heads


@pytest.mark.parametrize("options, message", [
    (dict(n_embd=36), r"model.designs=\[diff\] needs a head dimension .* divisible by 2, got 9: it splits"),
    (dict(n_embd=24, designs=["diff", "rope"]), "divisible by 4, got 6: .* and rope rotates each half"),
    (dict(design_options={"diff": {"on": True}}), "model.design_options.diff.on is not a setting of design diff"),
])
def test_bad_configs_are_refused_naming_the_option(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**{**TINY, **options})
    assert "\n" not in str(caught.value)


def test_the_pictures_show_each_layers_differential_map():
    from gpt.inference.visualize import attention_maps

    model = perturbed_model(TINY, "sdpa")
    maps = attention_maps(model, torch.arange(10)[None])  # w1 - lambda * w2 per layer: rows sum to 1 - lambda
    assert maps.shape == (3, 4, 10, 10) and torch.all(maps.triu(1) == 0)
    for layer, block in enumerate(model.transformer.h):
        lam = float(block.attn.diff_lambda().detach())
        torch.testing.assert_close(maps[layer].sum(-1), torch.full((4, 10), 1 - lam), atol=1e-5, rtol=0)
