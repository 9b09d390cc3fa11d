import pytest

from gpt import GPTConfig
from gpt import kernels as attention
from gpt.errors import ConfigError


def test_defaults_are_gpt2_small():
    cfg = GPTConfig()
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size) == (12, 12, 768, 1024, 50257)
    assert cfg.attention == "sdpa" and cfg.head_dim == 64


def test_n_embd_must_divide_by_n_head():
    with pytest.raises(ValueError, match=r"n_embd \(100\) must be divisible by model.n_head \(3\)"):
        GPTConfig(n_embd=100, n_head=3)


@pytest.mark.parametrize("field", ["n_layer", "n_head", "n_embd", "block_size", "vocab_size"])
@pytest.mark.parametrize("value", [0, -4])
def test_sizes_must_be_positive(field, value):
    with pytest.raises(ValueError, match=rf"model.{field} must be a positive integer, got {value}"):
        GPTConfig(**{field: value})


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_dropout_range(dropout):
    with pytest.raises(ValueError, match=r"model.dropout must be in \[0, 1\)"):
        GPTConfig(dropout=dropout)


def test_unknown_attention_lists_the_valid_names():
    with pytest.raises(ConfigError) as err:
        GPTConfig(attention="flashy")
    assert "unknown attention kernel 'flashy'" in str(err.value)
    for name in attention.available():
        assert name in str(err.value)


def test_from_dict_refuses_unknown_fields():
    with pytest.raises(ValueError, match="unknown model config field"):
        GPTConfig.from_dict({**GPTConfig().to_dict(), "n_layers": 3})
    assert GPTConfig.from_dict(GPTConfig(n_layer=3).to_dict()).n_layer == 3
