"""The score parts (gpt/designs/qk_norm.py, softcap.py, sink.py): the parameters each adds, kernels that cannot
compute one refused by name, bad values refused."""

import pytest

from gpt import GPT, GPTConfig
from gpt.errors import ConfigError

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)


def test_each_adds_only_its_own_parameters():
    base = set(GPT(GPTConfig(**TINY)).state_dict())
    assert set(GPT(GPTConfig(**TINY, attn_softcap=30.0, attention="manual")).state_dict()) == base
    norms = set(GPT(GPTConfig(**TINY, qk_norm=True)).state_dict()) - base
    assert norms == {f"transformer.h.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    sinks = set(GPT(GPTConfig(**TINY, attn_sink=True, attention="manual")).state_dict()) - base
    assert sinks == {"transformer.h.0.attn.sink", "transformer.h.1.attn.sink"}


@pytest.mark.parametrize("options, message", [
    (dict(attn_softcap=30.0), "attention=sdpa has no logit soft-capping, but model.attn_softcap=30"),
    (dict(attn_sink=True), "attention=sdpa has no attention sink logit, but model.attn_sink=true"),
])
def test_a_kernel_that_cannot_compute_one_is_refused_naming_one_that_can(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**TINY, **options)
    assert "manual" in caught.value.hint.split("attention=")[1]


@pytest.mark.parametrize("options, message", [
    (dict(attn_softcap=0.0), "model.attn_softcap must be a positive number or null, got 0.0"),
    (dict(attn_softcap=-5), "model.attn_softcap must be a positive number"),
    (dict(attn_softcap=float("inf")), "model.attn_softcap must be a positive number"),
    (dict(qk_norm="yes"), "model.qk_norm must be true or false"),
    (dict(attn_sink=1), "model.attn_sink must be true or false"),
])
def test_bad_values_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**TINY, attention="manual", **options)
