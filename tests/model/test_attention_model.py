"""The attention options inside the GPT: kernels interchangeable on trained weights, GQA, windows, RoPE, causality."""


import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpt import GPT, GPTConfig
from gpt import kernels as attention
from gpt.errors import ConfigError
from gpt.inference.decoding import generate

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=61)
OPTIONS = {
    "gpt2": {},
    "gqa-window-rope": dict(n_kv_head=2, window=5, designs=["rope"]),
    "mqa-rope": dict(n_kv_head=1, designs=["rope"]),
    "window-learned": dict(window=3),
}


def train_a_little(config: GPTConfig, steps: int = 4) -> GPT:
    """A few AdamW steps on random tokens: weights that are no longer the initialisation."""
    torch.manual_seed(0)
    model = GPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, config.vocab_size, (4, config.block_size + 1))
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    for _ in range(steps):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.mark.parametrize(
    "option, trained_with", [("gpt2", "sdpa"), ("gqa-window-rope", "heads"), ("mqa-rope", "einsum")]
)
def test_weights_trained_under_one_kernel_give_the_same_logits_under_every_other(option, trained_with):
    config = GPTConfig(**TINY, **OPTIONS[option], attention=trained_with)
    trained = train_a_little(config)
    idx = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = trained(idx)
        for kernel in attention.available():
            other = GPT(GPTConfig(**{**config.to_dict(), "attention": kernel})).eval()
            other.load_state_dict(trained.state_dict())
            logits, _ = other(idx)
            torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"{kernel}: {m}")


def test_gqa_shapes_and_parameter_names():
    model = GPT(GPTConfig(**TINY, n_kv_head=1))
    hd = 32 // 4
    assert model.transformer.h[0].attn.c_attn.weight.shape == ((4 + 2 * 1) * hd, 32)
    assert set(GPT(GPTConfig(**TINY)).state_dict()) == set(model.state_dict())  # same names, smaller c_attn


def test_gqa_equals_full_attention_with_each_kv_head_copied_to_its_query_group():
    """Query head h reads key/value head h // (n_head / n_kv_head): duplicating kv rows must change nothing."""
    torch.manual_seed(0)
    gqa = GPT(GPTConfig(**TINY, n_kv_head=2)).eval()
    full = GPT(GPTConfig(**TINY)).eval()
    state = gqa.state_dict()
    C, hd, group = 32, 8, 2
    for i in range(TINY["n_layer"]):
        for kind in ("weight", "bias"):
            name = f"transformer.h.{i}.attn.c_attn.{kind}"
            q, k, v = state[name].split([C, 2 * hd, 2 * hd])
            k = k.view(2, hd, *k.shape[1:]).repeat_interleave(group, dim=0).reshape(C, *k.shape[1:])
            v = v.view(2, hd, *v.shape[1:]).repeat_interleave(group, dim=0).reshape(C, *v.shape[1:])
            state[name] = torch.cat([q, k, v])
    full.load_state_dict(state)
    idx = torch.randint(0, 61, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(full(idx)[0], gqa(idx)[0], atol=1e-5, rtol=1e-5)


def test_a_window_as_long_as_the_context_changes_nothing_and_a_short_one_does():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**TINY)).eval()
    idx = torch.randint(0, 61, (2, 16))
    with torch.no_grad():
        for window, same in ((16, True), (100, True), (4, False)):
            windowed = GPT(GPTConfig(**TINY, window=window)).eval()
            windowed.load_state_dict(plain.state_dict())
            equal = torch.allclose(windowed(idx)[0], plain(idx)[0], atol=1e-6)
            assert equal == same, window
            # The first `window` positions see all their past either way.
            torch.testing.assert_close(windowed(idx)[0][:, :min(window, 16)], plain(idx)[0][:, :min(window, 16)])


def test_a_window_hides_tokens_that_fell_out_of_it():
    """With window w and L layers, position t depends only on tokens t - L*(w-1) .. t."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, window=3)).eval()  # 2 layers: reach 2 * (3 - 1) = 4 back
    idx = torch.randint(0, 61, (1, 16))
    changed = idx.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 61
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, 10:], b[:, 10:])  # 10 - 4 = 6 > 5: out of reach
    assert not torch.allclose(a[:, 5:10], b[:, 5:10])


def test_rope_model_generates_and_its_later_tokens_do_not_leak():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, designs=["rope"], n_kv_head=2)).eval()
    out = generate(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=20, top_k=5)
    assert out.shape == (1, 23)


def test_new_config_fields_are_validated_and_old_checkpoints_load():
    with pytest.raises(ConfigError, match="must be a multiple of model.n_kv_head"):
        GPTConfig(**TINY, n_kv_head=3)
    with pytest.raises(ConfigError, match="model.window must be a positive integer"):
        GPTConfig(**TINY, window=0)
    with pytest.raises(ConfigError, match="attention design 'sinusoidal' is not available"):
        GPTConfig(**TINY, designs=["sinusoidal"])
    with pytest.raises(ConfigError, match="only attention=sdpa has backends"):
        GPTConfig(**TINY, attention="manual", attention_backend="flash")
    old = dict(TINY, dropout=0.0, bias=True, attention="sdpa")  # a checkpoint from before these fields
    config = GPTConfig.from_dict(old)
    assert (config.n_kv_head, config.window, config.designs) == (4, None, [])
    old = dict(TINY, pos_embedding="rope", qk_norm=True, attn_softcap=30.0, attention="manual")  # flat fields
    config = GPTConfig.from_dict(old)
    assert (config.designs, config.design_options["softcap"]) == (["qk_norm", "rope", "softcap"], {"cap": 30.0})


# A future token never changes a past output: for every kernel, under every option.
_models = {}


def model_for(kernel: str, option: str) -> GPT:
    if (kernel, option) not in _models:
        torch.manual_seed(0)
        _models[kernel, option] = GPT(GPTConfig(**{**TINY, "n_layer": 1}, **OPTIONS[option], attention=kernel)).eval()
    return _models[kernel, option]


@pytest.mark.parametrize("kernel", attention.available())
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    option=st.sampled_from(sorted(OPTIONS)),
    cut=st.integers(min_value=1, max_value=15),
    tokens=st.lists(st.integers(0, 60), min_size=16, max_size=16),
    new=st.lists(st.integers(0, 60), min_size=15, max_size=15),
)
def test_changing_future_tokens_never_changes_past_outputs(kernel, option, cut, tokens, new):
    model = model_for(kernel, option)
    idx = torch.tensor([tokens])
    changed = idx.clone()
    changed[0, cut:] = torch.tensor(new[: 16 - cut])
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, :cut], b[:, :cut])
