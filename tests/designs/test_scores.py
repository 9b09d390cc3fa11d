"""The score parts (gpt/designs/qk_norm.py, softcap.py, sink.py): the parameters each adds, kernels that cannot
compute one refused by name, bad values refused."""

import pytest

from gpt import GPT, GPTConfig
from gpt.errors import ConfigError

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)


def test_each_adds_only_its_own_parameters():
    base = set(GPT(GPTConfig(**TINY)).state_dict())
    capped = GPTConfig(**TINY, designs=["softcap"], design_options={"softcap": {"cap": 30.0}}, attention="manual")
    assert set(GPT(capped).state_dict()) == base
    norms = set(GPT(GPTConfig(**TINY, designs=["qk_norm"])).state_dict()) - base
    assert norms == {f"transformer.h.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    sinks = set(GPT(GPTConfig(**TINY, designs=["sink"], attention="manual")).state_dict()) - base
    assert sinks == {"transformer.h.0.attn.sink", "transformer.h.1.attn.sink"}


@pytest.mark.parametrize("options, message", [
    (dict(designs=["softcap"]), r"attention=sdpa has no logit soft-capping, but model.designs=\[softcap\]"),
    (dict(designs=["sink"]), r"attention=sdpa has no attention sink logit, but model.designs=\[sink\]"),
])
def test_a_kernel_that_cannot_compute_one_is_refused_naming_one_that_can(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**TINY, **options)
    assert "manual" in caught.value.hint.split("attention=")[1]


@pytest.mark.parametrize("options, message", [
    (dict(designs=["softcap"], design_options={"softcap": {"cap": 0.0}}),
     "model.design_options.softcap.cap must be a positive number, got 0.0"),
    (dict(designs=["softcap"], design_options={"softcap": {"cap": -5}}), "softcap.cap must be a positive number"),
    (dict(designs=["softcap"], design_options={"softcap": {"cap": float("inf")}}), "cap must be a positive number"),
    (dict(designs=["softcap"], design_options={"softcap": {"capp": 2.0}}),
     "model.design_options.softcap.capp is not a setting of design softcap"),
    (dict(designs=["qk_norm"], design_options={"softcap": {"cap": 2.0}}),
     r"model.design_options.softcap is given but softcap is not in model.designs \(\[qk_norm\]\)"),
])
def test_bad_values_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**TINY, attention="manual", **options)
