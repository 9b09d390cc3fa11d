"""The model options that come with recipe=modern, each a plain model option: model.activation, model.tie_head,
model.zero_init_proj; GPT-2's values stay the defaults, and a checkpoint keeps what it was trained with."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt import GPT, GPTConfig
from gpt.errors import ConfigError
from gpt.train.muon import split_parameters
from gpt.weights import checkpoint
from gpt.weights.load import load_weights

SIZES = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=40)


def model(seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**SIZES, **options))


@pytest.mark.parametrize("activation, reference", [
    ("gelu_tanh", lambda h: 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))),
    ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))),
    ("relu2", lambda h: torch.where(h > 0, h * h, torch.zeros_like(h))),
])
def test_the_mlp_applies_the_chosen_activation(activation, reference):
    mlp = model(activation=activation).transformer.h[0].mlp.double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    expected = F.linear(reference(F.linear(x, mlp.c_fc.weight, mlp.c_fc.bias)), mlp.c_proj.weight, mlp.c_proj.bias)
    torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)
    assert GPTConfig().activation == "gelu_tanh"  # GPT-2's stays the default


def test_an_untied_head_is_a_parameter_of_its_own_that_muon_leaves_to_adamw():
    tied, untied = model(), model(tie_head=False)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_params() - tied.num_params() == 40 * 16
    split = split_parameters(untied)
    assert "lm_head.weight" in {n for n, _ in split.adamw_decay}
    assert "lm_head.weight" not in {n for n, _ in split.muon}


def test_zero_init_projections_start_at_zero_and_leave_every_other_draw_as_gpt2s():
    gpt2, zero = model(seed=3), model(seed=3, zero_init_proj=True)
    for (name, a), (_, b) in zip(gpt2.named_parameters(), zero.named_parameters(), strict=True):
        if name.endswith("c_proj.weight"):
            assert not b.any() and a.any(), name
        else:
            assert torch.equal(a, b), name


def test_a_checkpoint_with_an_untied_relu2_model_reads_back_as_trained(tmp_path):
    trained = model(tie_head=False, activation="relu2")
    with torch.no_grad():
        trained.lm_head.weight.add_(1.0)  # differs from wte
    checkpoint.save({"model": trained.state_dict(), "model_config": trained.config.to_dict(),
                     "tokenizer": {"kind": "char", "chars": [chr(65 + i) for i in range(40)],
                                   "vocab_size": 40}}, tmp_path / "ckpt.pt")
    config, state, _ = load_weights(tmp_path / "ckpt.pt")
    again = GPT(config)
    again.load_state_dict(state)
    assert not config.tie_head and config.activation == "relu2"
    idx = torch.randint(0, 40, (2, 8))
    assert torch.equal(again(idx)[0], trained(idx)[0])


@pytest.mark.parametrize("option, value, message", [
    ("activation", "swiglu", "model.activation must be one of gelu_tanh, gelu, relu2, got 'swiglu'"),
    ("tie_head", "yes", "model.tie_head must be true or false, got 'yes'"),
    ("zero_init_proj", 1, "model.zero_init_proj must be true or false, got 1"),
])
def test_bad_model_options_are_refused_with_the_valid_values(option, value, message):
    with pytest.raises(ConfigError) as err:
        GPTConfig(**SIZES, **{option: value})
    assert str(err.value) == message
