"""The model options that come with recipe=modern, each a plain model option: model.activation, model.tie_head,
model.zero_init_proj; and model.norm (RMSNorm, as the hybrid architectures use). GPT-2's values stay the defaults,
and a checkpoint keeps what it was trained with."""

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


def read_back(trained: GPT, tmp_path) -> GPT:
    """``trained`` saved as a checkpoint and built again from it (its config and weights as the file holds them)."""
    checkpoint.save({"model": trained.state_dict(), "model_config": trained.config.to_dict(),
                     "tokenizer": {"kind": "char", "chars": [chr(65 + i) for i in range(40)],
                                   "vocab_size": 40}}, tmp_path / "ckpt.pt")
    config, state, _ = load_weights(tmp_path / "ckpt.pt")
    again = GPT(config)
    again.load_state_dict(state)
    return again


def test_a_checkpoint_with_an_untied_relu2_model_reads_back_as_trained(tmp_path):
    trained = model(tie_head=False, activation="relu2")
    with torch.no_grad():
        trained.lm_head.weight.add_(1.0)  # differs from wte
    again = read_back(trained, tmp_path)
    config = again.config
    assert not config.tie_head and config.activation == "relu2"
    idx = torch.randint(0, 40, (2, 8))
    assert torch.equal(again(idx)[0], trained(idx)[0])


def test_an_attention_only_model_has_no_mlp_and_reads_back_from_a_checkpoint(tmp_path):
    from gpt.interpret import hook_points, run_with_cache
    from gpt.model.flops import per_token

    trained = model(mlp=False)
    assert not any(".mlp." in name or ".ln_2." in name for name, _ in trained.named_parameters())
    assert not any("hook_mlp_out" in name for name in hook_points(trained))
    assert per_token(trained.config) < per_token(model().config)
    _, cache = run_with_cache(trained, torch.randint(0, 40, (2, 8)), ["blocks.*.hook_resid_mid",
                                                                       "blocks.*.hook_resid_post"])
    for layer in range(2):  # a block is x + attn(ln_1(x)), nothing after
        assert torch.equal(cache[f"blocks.{layer}.hook_resid_mid"], cache[f"blocks.{layer}.hook_resid_post"])
    again = read_back(trained, tmp_path)
    config = again.config
    idx = torch.randint(0, 40, (2, 8))
    assert not config.mlp and torch.equal(again(idx)[0], trained(idx)[0])


@pytest.mark.parametrize("option, value, message", [
    ("activation", "swiglu", "model.activation must be one of gelu_tanh, gelu, relu2, got 'swiglu'"),
    ("tie_head", "yes", "model.tie_head must be true or false, got 'yes'"),
    ("zero_init_proj", 1, "model.zero_init_proj must be true or false, got 1"),
    ("norm", "batchnorm", "model.norm must be one of layernorm, rmsnorm, got 'batchnorm'"),
    ("mlp", "no", "model.mlp must be true or false, got 'no'"),
])
def test_bad_model_options_are_refused_with_the_valid_values(option, value, message):
    with pytest.raises(ConfigError) as err:
        GPTConfig(**SIZES, **{option: value})
    assert str(err.value) == message


def test_rmsnorm_blocks_normalise_by_the_root_mean_square_with_a_weight_only_under_the_same_names():
    gpt2, rms = model(), model(norm="rmsnorm")
    names = set(rms.state_dict())
    assert names == set(gpt2.state_dict()) - {n for n in gpt2.state_dict() if ".ln_" in n and n.endswith(".bias")}
    assert {"transformer.h.0.ln_1.weight", "transformer.ln_f.weight"} <= names  # the LayerNorms' names, no bias
    assert GPTConfig().norm == "layernorm" and "transformer.h.0.ln_1.bias" in gpt2.state_dict()  # GPT-2's default
    block = rms.transformer.h[0].double()
    with torch.no_grad():
        block.ln_1.weight.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 4 + 2  # a mean away from zero: LayerNorm would subtract it
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * block.ln_1.weight
    torch.testing.assert_close(block.ln_1(x), expected, rtol=1e-12, atol=1e-12)


def test_an_rmsnorm_model_reads_back_from_a_checkpoint_and_a_native_export_with_the_same_logits(tmp_path):
    from gpt.interop.formats import export
    from gpt.weights.load import load_model

    trained = model(seed=2, norm="rmsnorm")
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if ".ln_" in name:
                p.add_(torch.randn_like(p))
    meta = {"kind": "char", "chars": [chr(65 + i) for i in range(40)], "vocab_size": 40}
    checkpoint.save(checkpoint.model_entries(trained.state_dict(), trained.config, meta), tmp_path / "ckpt.pt")
    export(trained.state_dict(), trained.config, meta, tmp_path / "native", format="native")
    idx = torch.randint(0, 40, (2, 8))
    for source in ("ckpt.pt", "native"):
        loaded, _ = load_model(tmp_path / source)
        assert loaded.config.norm == "rmsnorm", source
        assert torch.equal(loaded(idx)[0], trained(idx)[0]), source
