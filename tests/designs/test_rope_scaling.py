"""RoPE scaling (gpt/designs/rope_scaling.py, model.design_options.rope.scaling): the frequencies and YaRN's
attention factor are
transformers' for the same settings, the model's attention equals the float64 reference past the original length,
cached decoding equals the full forward there (dynamic NTK refuses the cache), a kind of a layout has its own
scaling, and each bad setting is one error line."""

import math

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.designs import reference
from gpt.designs import rope_scaling as rs
from gpt.designs.rope import rotate
from gpt.errors import ConfigError, UserError
from gpt.model import kv_cache
from gpt.model.kv_cache import KVCache
from tests.conftest import run_inline

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[dev]')")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=40)  # head_dim 8
SCALINGS = {  # original length 6 of a 24-token context: every test runs past it
    "linear": {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 6},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 6},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6},
    "yarn_custom": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 6, "beta_fast": 16,
                    "beta_slow": 2, "attention_factor": 1.3},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 6},
    "llama3_custom": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 6,
                      "low_freq_factor": 2.0, "high_freq_factor": 3.0},
}
STATIC = [name for name in SCALINGS if name != "dynamic"]


def theirs(scaling: dict, dim: int, base: float, length: int) -> tuple[torch.Tensor, float]:
    """transformers' rope init function for these settings (Starcoder2's config holding them, as an export does)."""
    params = {**scaling, "rope_theta": base}
    limit = scaling["original_max_position_embeddings"] if scaling["rope_type"] == "dynamic" else 4 * length
    if scaling["rope_type"] in ("linear", "dynamic"):
        del params["original_max_position_embeddings"]
    config = transformers.Starcoder2Config(hidden_size=dim * 4, num_attention_heads=4, rope_parameters=params,
                                           max_position_embeddings=limit)
    return ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu", seq_len=length)


@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("dim,base", [(8, 10000.0), (64, 10000.0), (128, 500000.0)])
def test_the_frequencies_and_attention_factor_are_transformers(name, dim, base):
    scaling = rs.check(SCALINGS[name], block_size=4096)
    for length in (6, 100, 3000):
        inv, factor = theirs(scaling, dim, base, length)
        ours = rs.inv_freq64(scaling, dim, base, length)
        torch.testing.assert_close(inv.double(), ours, rtol=2e-6, atol=0)  # theirs are float32
        assert rs.attention_factor(scaling) == pytest.approx(factor, rel=1e-12)
    if name == "yarn":
        assert rs.attention_factor(scaling) == pytest.approx(0.1 * math.log(4) + 1)


def randomised(settings: dict, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **settings})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model


@pytest.mark.parametrize("name", SCALINGS)
def test_attention_equals_the_float64_reference_past_the_original_length(name):
    model = randomised({"designs": ["rope"], "attention": "manual",
                        "design_options": {"rope": {"scaling": SCALINGS[name]}}})
    x = torch.randn(1, 20, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    attn, config = model.transformer.h[0].attn, model.config
    with torch.no_grad():
        ours = attn(x.float(), next(iter(model.contexts(torch.zeros(1, 20, dtype=torch.long), None, None,
                                                         None).values())))
    if name == "dynamic":  # the angles of a 20-token sequence: written out here, since ref_qk is not given T
        expected = dynamic_reference(attn, x, config)
    else:
        expected = reference.layer(attn, x, config)
    torch.testing.assert_close(ours.double(), expected, atol=2e-5, rtol=1e-4)
    plain = randomised({"designs": ["rope"], "attention": "manual"})  # the same weights, unscaled
    unscaled = reference.layer(plain.transformer.h[0].attn, x, plain.config)
    assert (unscaled - expected)[:, 6:].abs().max() > 1e-2  # the scaling changes what comes past the original length


def dynamic_reference(attn, x, config):
    """Float64 softmax attention with every q and k rotated at the whole sequence's length (rotate(..., length))."""
    q, k, v = reference.heads(attn, x, config)
    T, scaling, y = x.size(1), config.design_options["rope"]["scaling"], torch.zeros_like(q)
    for b, h, kv, i in reference.queries(config, x):
        qi = rotate(q[b, i, h], i, scaling=scaling, length=T)
        s = torch.stack([rotate(k[b, j, kv], j, scaling=scaling, length=T) @ qi for j in range(i + 1)])
        y[b, i, h] = torch.softmax(s / math.sqrt(q.size(-1)), 0) @ v[b, : i + 1, kv]
    return reference.output(attn, config, x, y)


@pytest.mark.parametrize("name", STATIC)
def test_cached_decoding_equals_the_full_forward_past_the_original_length(name):
    model = randomised({"designs": ["rope"], "design_options": {"rope": {"scaling": SCALINGS[name]}}})
    idx = torch.randint(0, TINY["vocab_size"], (2, 22), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache(model.config, 2, "cpu")
        steps = [model(idx[:, :4], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0] for t in range(4, 22)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_dynamic_ntk_refuses_the_cache_in_one_line():
    model = randomised({"designs": ["rope"], "design_options": {"rope": {"scaling": SCALINGS["dynamic"]}}})
    with pytest.raises(UserError, match="cannot decode with a KV cache: .*dynamic changes every position's angle") as e:
        model(torch.zeros(1, 3, dtype=torch.long), cache=KVCache(model.config, 1, "cpu"))
    assert "kv_cache=false" in e.value.hint
    assert kv_cache.refusal(model.config) is not None  # training's samples read it and decode without the cache
    yarn = GPTConfig(**TINY, designs=["rope"], design_options={"rope": {"scaling": SCALINGS["yarn"]}})
    assert kv_cache.refusal(yarn) is None
    from gpt.serve.engine import Engine
    from gpt.tokenizers.tokenizer import CharTokenizer
    with pytest.raises(UserError, match="the server decodes with a KV cache, which this model cannot: .*dynamic"):
        Engine(model, CharTokenizer([chr(97 + i) for i in range(40)]))  # refused before serving anyone


def test_no_scaling_is_todays_model_exactly():
    plain = randomised({"designs": ["rope"]})
    none = randomised({"designs": ["rope"], "design_options": {"rope": {"scaling": {"rope_type": "none"}}}})
    assert none.config.design_options["rope"]["scaling"] is None
    idx = torch.randint(0, TINY["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(plain(idx)[0], none(idx)[0])


def test_each_kind_of_a_layout_has_its_own_scaling():
    kinds = {"S": {"window": 4, "designs": ["rope"]},
             "L": {"designs": ["rope"], "options": {"rope": {"base": 100000, "scaling": SCALINGS["yarn"]}}}}
    model = randomised({"n_layer": 4, "layers": "SL", "layer_kinds": kinds})
    assert model.config.layer(0).design_options["rope"]["scaling"] is None
    assert model.config.layer(1).design_options["rope"]["scaling"]["beta_fast"] == 32.0  # defaults filled in
    assert model.transformer.h[1].attn.rope_scaling["rope_type"] == "yarn"
    idx = torch.randint(0, TINY["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache(model.config, 1, "cpu")
        steps = [model(idx[:, t:t + 1], cache=cache)[0] for t in range(20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="model.design_options.rope is given but rope is not in model.designs"):
        GPTConfig(**{**TINY, "n_layer": 4}, layers="SL", layer_kinds=kinds,
                  design_options={"rope": {"scaling": SCALINGS["yarn"]}})


YARN = "rope_type: yarn, factor: 4, original_max_position_embeddings: 64"
BAD = {  # the model.design_options.rope.scaling override -> what its error line says
    "{rope_type: linear, factor: 1, original_max_position_embeddings: 64}": "factor must be a number above 1",
    "{rope_type: linear, factor: 5000, original_max_position_embeddings: 64}": "at most 1024",
    "{rope_type: yarn, factor: 4, original_max_position_embeddings: 4096}": "at most model.block_size (128)",
    "{rope_type: ntk, factor: 4, original_max_position_embeddings: 64}": "rope_type must be one of none, linear",
    "{" + YARN + ", beta_fast: 1, beta_slow: 2}": "0 < beta_slow < beta_fast",
    "{" + YARN + ", attention_factor: -1}": "attention_factor must be a number in",
    "{" + YARN + ", low_freq_factor: 2}": "low_freq_factor is not a setting of rope_type yarn",
    "{rope_type: llama3, factor: 8, original_max_position_embeddings: 64, high_freq_factor: 0.5}":
        "0 < low_freq_factor < high_freq_factor",
    "{rope_type: yarn, factor: 4}": "needs original_max_position_embeddings",
}


@pytest.mark.parametrize("value", BAD)
def test_a_bad_scaling_is_one_error_line_before_anything_is_built(value, tmp_path):
    done = run_inline("train", "model=small", "model.designs=[rope]", f"model.design_options.rope.scaling={value}",
                      f"out_dir={tmp_path / 'run'}")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and BAD[value] in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [["yarn"], {"rope_type": ["yarn"]}, {"rope_type": "yarn", "factor": "4",
                                   "original_max_position_embeddings": 6}, {"rope_type": "linear", "factor": 2,
                                   "original_max_position_embeddings": True}])
def test_a_checkpoints_damaged_scaling_is_a_config_error(value):
    """A checkpoint's model_config is read through the same checks: odd types get a ConfigError, never a crash."""
    with pytest.raises(ConfigError, match="model.design_options.rope.scaling"):
        GPTConfig(**TINY, designs=["rope"], design_options={"rope": {"scaling": value}})


def test_scaling_a_model_without_rope_is_refused(tmp_path):
    done = run_inline("train", "model=small", f"model.design_options.rope.scaling={{{YARN}}}",
                      f"out_dir={tmp_path / 'run'}")
    assert done.returncode == 2 and "model.design_options.rope is given but rope is not in model.designs" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") <= 2 and not (tmp_path / "run").exists()
