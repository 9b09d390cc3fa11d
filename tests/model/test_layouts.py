"""A layout per layer (model.layers, model.layer_kinds): each layer built from its kind's config, a RoPE base per kind,
NoPE layers, a cache per layer whose bytes the memory planner computes, the layout's exports, and every bad layout
refused in one line before anything is built. Training and resuming: tests/train/test_layout_training.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import ROOT, perturbed_model
from gpt import GPT, GPTConfig, memory
from gpt.arena.arena import kv_bytes_per_token
from gpt.designs import loading, reference
from gpt.errors import ConfigError, UserError
from gpt.inference.decoding import generate_batch
from gpt.interop import formats
from gpt.memory import describe
from gpt.model import design as registry
from gpt.model import flops
from gpt.model.kv_cache import KVCache
from gpt.schema import register, typed

TINY = dict(n_head=2, n_embd=32, block_size=32, vocab_size=64)
LOCAL_GLOBAL = dict(n_layer=6, layers="SSSSSL", layer_kinds={  # Gemma 3's 5:1, each kind its own RoPE base
    "S": {"window": 8, "designs": ["rope"]},
    "L": {"window": None, "designs": ["rope"], "options": {"rope": {"base": 1000000}}}})
NOPE_EVERY_4TH = dict(n_layer=4, layers=["rope", "rope", "rope", "nope"], layer_kinds={  # Llama 4's NoPE layers
    "rope": {"designs": ["rope"]}, "nope": {}})
DELTANET_GATED = dict(n_layer=4, layers="DDDG", norm="rmsnorm", layer_kinds={  # Qwen3-Next's 3:1
    "D": {"designs": ["deltanet"]}, "G": {"designs": ["gated", "rope"]}})
LAYOUTS = {"5:1 local:global": LOCAL_GLOBAL, "NoPE every 4th": NOPE_EVERY_4TH,
           "3:1 Gated DeltaNet:gated attention": DELTANET_GATED}


def layout(settings: dict, **more) -> GPTConfig:
    return GPTConfig(**{**TINY, **settings, **more})


def test_a_pattern_tiles_over_the_depth_and_each_kind_is_a_config_of_its_own():
    config = layout(LOCAL_GLOBAL, n_layer=12)
    assert [config.kind_of(i) for i in range(12)] == list("SSSSSL" * 2)
    local, wide = config.layer(0), config.layer(5)
    assert (local.window, local.designs, wide.window, wide.designs) == (8, ["rope"], None, ["rope"])
    assert local.design_options["rope"]["base"] == 10000.0 and wide.design_options["rope"]["base"] == 1000000
    assert config.layer(6) is local and config.window is None  # one config per kind; the model's own untouched
    nope = layout(NOPE_EVERY_4TH)
    assert [nope.layer(i).designs for i in range(4)] == [["rope"], ["rope"], ["rope"], []]


def test_a_uniform_model_is_the_one_kind_case_with_the_same_names_and_numbers():
    config = GPTConfig(**TINY, n_layer=2, designs=["rope"])
    assert config.kinds() == {None: config} and config.layer(1) is config
    assert config.to_dict()["layers"] is None and config.to_dict()["layer_kinds"] is None
    one_kind = layout({"n_layer": 2, "layers": "R", "layer_kinds": {"R": {"designs": ["rope"]}}})
    a, b = perturbed_model(config.to_dict()), perturbed_model(one_kind.to_dict())
    assert list(a.state_dict()) == list(b.state_dict())  # the same parameter names, the same seeded draws
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a(idx)[0], b(idx)[0], rtol=0, atol=0)


def test_each_kind_attends_with_its_own_window_and_rope_base_as_the_float64_reference_does():
    model = perturbed_model(layout(LOCAL_GLOBAL).to_dict()).double()
    x = torch.randn(1, 20, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    contexts = model.contexts(torch.zeros(1, 20, dtype=torch.long), None, None, None)
    for i in (0, 5):
        attn, kind = model.transformer.h[i].attn, model.config.layer(i)
        with torch.no_grad():
            got = attn(x, contexts[kind.kind])
        torch.testing.assert_close(got, reference.layer(attn, x, kind), atol=1e-6, rtol=1e-6)
    attn = model.transformer.h[5].attn
    attn.rope_base = 10000.0  # the global layer with the local layers' base: another output
    with torch.no_grad():
        assert not torch.allclose(attn(x, model.contexts(torch.zeros(1, 20, dtype=torch.long), None, None, None)["L"]),
                                  got, atol=1e-4)


def test_a_layout_with_positions_in_some_layer_has_no_learned_table():
    assert "wpe" not in GPT(layout(NOPE_EVERY_4TH)).transformer
    assert "wpe" not in GPT(layout(LOCAL_GLOBAL)).transformer
    windows_only = layout({"n_layer": 2, "layers": "SL", "layer_kinds": {"S": {"window": 4}, "L": {}}})
    assert "wpe" in GPT(windows_only).transformer  # no layer brings positions: GPT-2's table, added once below


@pytest.mark.parametrize("name", LAYOUTS)
def test_decoding_with_the_cache_equals_the_full_forward(name):
    model = perturbed_model(layout(LAYOUTS[name]).to_dict(), sharpen=3.0)
    idx = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(model.config, 2, "cpu")
        steps = [model(idx[:, :5], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5]]  # left-padded into one batch
    cached = generate_batch(model, prompts, 20, temperature=0.0, kv_cache=True)
    assert cached == generate_batch(model, prompts, 20, temperature=0.0, kv_cache=False)


def test_the_planner_computes_the_bytes_a_filled_cache_holds_and_a_5_to_1_layout_keeps_under_0_3x():
    shape = dict(n_layer=6, n_head=4, n_embd=64, block_size=4096, vocab_size=64)
    five_to_one = GPTConfig(**shape, layers="SSSSSL", layer_kinds={"S": {"window": 512, "designs": ["rope"]},
                                                                   "L": {"designs": ["rope"]}})
    uniform = GPTConfig(**shape, designs=["rope"])
    measured = {}
    for name, config in (("layout", five_to_one), ("uniform", uniform)):
        model, cache = GPT(config).eval(), KVCache(config, 1, "cpu")
        with torch.no_grad():
            model(torch.zeros(1, 600, dtype=torch.long), cache=cache)  # past the window: the rings have wrapped
        measured[name] = cache.held_bytes() / config.block_size
        assert measured[name] == memory.kv_bytes_at_context(config, 4)  # float32 keys and values
    assert measured["uniform"] == memory.kv_bytes_per_token(uniform, 4) == 6 * 2 * 64 * 4
    assert measured["layout"] == (5 * 512 + 4096) * 2 * 64 * 4 / 4096
    assert measured["layout"] / measured["uniform"] <= 0.3
    hybrid = GPTConfig(**{**shape, **DELTANET_GATED, "n_layer": 8})  # fixed states beside two global layers
    cache = KVCache(hybrid, 1, "cpu")
    with torch.no_grad():
        GPT(hybrid).eval()(torch.zeros(1, 100, dtype=torch.long), cache=cache)
    assert cache.held_bytes() / hybrid.block_size == memory.kv_bytes_at_context(hybrid, 4)
    assert kv_bytes_per_token(GPT(five_to_one), torch.device("cpu")) == measured["layout"]  # the arena's column
    assert [type(layer).__name__ for layer in cache.layers[:4]] == ["DeltaState"] * 3 + ["LayerKV"]


def test_flops_and_activations_add_up_each_layer_of_its_kind():
    config = layout(LOCAL_GLOBAL, n_layer=6, layers="SL", layer_kinds={
        "S": {"window": 8}, "L": {"designs": ["qk_norm", "rope"]}})
    uniform_s, uniform_l = GPTConfig(**TINY, n_layer=6, window=8), GPTConfig(**TINY, n_layer=6,
                                                                               designs=["qk_norm", "rope"])
    assert flops.per_token(config) * 2 == flops.per_token(uniform_s) + flops.per_token(uniform_l)
    act = [memory.activations(c, 2, 32, 2, False) for c in (config, uniform_s, uniform_l)]
    assert act[0] * 2 == act[1] + act[2]
    assert memory.count_params(config)[0] == sum(p.numel() for p in GPT(config).parameters())


def test_gguf_refuses_a_layout_and_native_reads_back_the_same_logits(tmp_path):
    """(format=hf writes layouts: tests/interop/test_export_layouts.py.)"""
    model = perturbed_model(layout(LOCAL_GLOBAL).to_dict())
    tokenizer = {"kind": "char", "chars": [chr(33 + i) for i in range(64)]}
    with pytest.raises(UserError, match=r"model.layers=SSSSSL is a layout .* format=gguf"):
        formats.export(model.state_dict(), model.config, tokenizer, tmp_path / "gguf", format="gguf")
    assert not (tmp_path / "gguf").exists()
    formats.export(model.state_dict(), model.config, tokenizer, tmp_path / "native", format="native")
    config, state, _ = formats.load_export(tmp_path / "native")
    again = GPT(config).eval()
    again.load_state_dict(state)
    idx = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(3))
    assert config == model.config and torch.equal(again(idx)[0], model(idx)[0])


BAD = {
    "a pattern that does not divide n_layer": (dict(layers="SSSSL"), r"model.layers=SSSSL has 5 letters, which does "
                                                                     r"not divide model.n_layer=6"),
    "a list of the wrong length": (dict(layers=["S", "L"]), r"model.layers lists 2 kinds but model.n_layer=6"),
    "an unknown kind letter": (dict(layers="SSSSSX"), r"model.layers names kind 'X', which model.layer_kinds does "
                                                      r"not define"),
    "kinds without a legend": (dict(layer_kinds=None), r"needs model.layer_kinds"),
    "a legend without layers": (dict(layers=None), r"model.layer_kinds is set but model.layers is not"),
    "conflicting designs": (dict(layer_kinds={"S": {"designs": ["rope", "linear"]}, "L": {}}),
                            r"model.layer_kinds.S \(designs \[rope,linear\]\): model.designs names rope and "
                            r"linear, which cannot be combined"),
    "two position schemes": (dict(layer_kinds={"S": {"designs": ["rope", "alibi"]}, "L": {}}),
                             r"model.layer_kinds.S \(designs \[rope,alibi\]\): model.designs names rope and alibi, "
                             r"which cannot be combined: each encodes the positions its own way"),
    "an unknown design": (dict(layer_kinds={"S": {"designs": ["nope"]}, "L": {}}), r"attention design 'nope' is not "
                                                                                   r"available"),
    "a kernel that cannot compute a kind": (dict(attention="sdpa", layer_kinds={"S": {"designs": ["softcap"]},
                                                                                 "L": {}}),
                                            r"model.layer_kinds.S \(designs \[softcap\]\): attention=sdpa has no logit "
                                            r"soft-capping"),
    "a bad window": (dict(layer_kinds={"S": {"window": 0}, "L": {}}), r"model.layer_kinds.S.window must be a positive "
                                                                      r"integer or null"),
    "an unknown kind key": (dict(layer_kinds={"S": {"windw": 4}, "L": {}}), r"model.layer_kinds.S must be a mapping "
                                                                           r"of window, designs, options; 'windw'"),
    "options of a design the kind lacks": (dict(layer_kinds={"S": {"options": {"rope": {"base": 5.0}}}, "L": {}}),
                                           r"model.layer_kinds.S.options.rope is given but rope is not among"),
    "an unknown option": (dict(layer_kinds={"S": {"designs": ["rope"], "options": {"rope": {"theta": 5.0}}},
                                            "L": {}}), r"model.layer_kinds.S.options.rope.theta is not a setting"),
    "a bad RoPE base": (dict(layer_kinds={"S": {"designs": ["rope"], "options": {"rope": {"base": 0}}}, "L": {}}),
                        r"model.layer_kinds.S.options.rope.base must be a number above 1, got 0"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_layout_is_refused_in_one_line_naming_the_setting(case):
    change, message = BAD[case]
    with pytest.raises(ConfigError, match=message):
        layout(LOCAL_GLOBAL, **change)


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_layout_with_one_error_line():
    result = subprocess.run([sys.executable, "-m", "gpt.memory", "model=tiny", "model.n_layer=6", "model.layers=SSSSL",
                             "model.layer_kinds={S: {window: 8}, L: {}}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and result.stderr.startswith(
        "error: model.layers=SSSSL has 5 letters, which does not divide model.n_layer=6\n"), result.stderr
    assert "Traceback" not in result.stderr


def doc_commands(prefix: str) -> list[list[str]]:
    """The overrides of each ``prefix`` command line in docs/layouts.md's code blocks."""
    text = (ROOT / "docs" / "layouts.md").read_text()
    return [shlex.split(line)[len(prefix.split()):] for line in text.splitlines() if line.startswith(prefix + " ")]


def composed(config_name: str, overrides: list[str]):
    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return typed(compose(config_name=config_name, overrides=overrides))


def test_the_docs_commands_compose_and_the_planner_prints_the_lines_the_docs_show(tmp_path):
    trains = doc_commands("python scripts/train.py")
    assert len(trains) == 6  # the 5:1 (and its resume), NoPE, DeltaNet, a user's design, the GPT-Neo export
    load_talking_heads(tmp_path)  # as designs=[talking_heads.py] does
    for overrides in trains:
        run = composed("train", [o for o in overrides if o != "designs=[talking_heads.py]"])
        config = run.model.build(65)
        assert config.layers in ("SSSSSL", "RRRN", "DDDG", "TTTR") and len(config.kinds()) == 2
        if config.layers == "DDDG":
            assert config.layer(0).design_options["deltanet"]["chunk"] == 32 and config.design_options == {}
    text = (ROOT / "docs" / "layouts.md").read_text()
    plans = doc_commands("python -m gpt.memory")
    assert len(plans) == 2
    for overrides in plans:
        line = describe(composed("memory", overrides)).splitlines()[-1]
        assert line in text, line


def load_talking_heads(folder) -> None:
    """docs/designs.md's design, loaded from a file as a user does (once per process)."""
    if "talking_heads" not in registry.available():
        text = (ROOT / "docs" / "designs.md").read_text()
        code = re.search(r"^```python file=talking_heads\.py\n(.*?)^```$", text, flags=re.S | re.M).group(1)
        (folder / "talking_heads.py").write_text(code)
        loading.load(str(folder / "talking_heads.py"))


def test_a_design_a_user_brings_is_a_layer_kind_and_acts_on_its_layers_only(tmp_path):
    load_talking_heads(tmp_path)
    config = layout({"n_layer": 4, "layers": "TTTR", "layer_kinds": {
        "T": {"window": 6, "designs": ["talking_heads", "rope"]}, "R": {"designs": ["rope"]}}})
    model = perturbed_model(config.to_dict(), sharpen=2.0)
    assert [hasattr(block.attn, "mix_logits") for block in model.transformer.h] == [True, True, True, False]
    idx = torch.randint(0, 64, (1, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full, cache = model(idx)[0], KVCache(model.config, 1, "cpu")
        steps = [model(idx[:, :4], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0] for t in range(4, 25)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)
