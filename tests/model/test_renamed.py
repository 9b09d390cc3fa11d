"""The designs' old flat fields (gpt/model/renamed.py): a file written with them reads into today's form, the same
model; a command line that types one gets one error line with the new spelling."""

import pytest

from conftest import run_inline
from gpt import GPT, GPTConfig
from gpt.errors import ConfigError
from gpt.model import renamed

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, attention="manual")
OLD = dict(pos_embedding="learned", qk_norm=False, attn_softcap=None, attn_sink=False, diff_attn=False,
           linear_attn=None, mla_latent=None, mla_rope_dim=None, sink_tokens=0, rope_scaling=None)  # all off
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}

CASES = [  # (the old fields a checkpoint held, today's designs and settings)
    ({}, [], {}),
    (dict(pos_embedding="rope", qk_norm=True), ["qk_norm", "rope"], {}),
    (dict(pos_embedding="alibi", attn_softcap=30.0, attn_sink=True), ["softcap", "alibi", "sink"],
     {"softcap": {"cap": 30.0}}),
    (dict(diff_attn=True, pos_embedding="rope"), ["rope", "diff"], {}),
    (dict(linear_attn="elu1"), ["linear"], {"linear": {"feature": "elu1"}}),
    (dict(mla_latent=12, mla_rope_dim=6), ["mla"], {"mla": {"latent": 12, "rope_dim": 6}}),
    (dict(mla_latent=12), ["mla"], {"mla": {"latent": 12, "rope_dim": None}}),
    (dict(sink_tokens=2, window=4), ["stream"], {"stream": {"sinks": 2}}),
    (dict(pos_embedding="rope", rope_scaling=YARN), ["rope"], {"rope": {"scaling": YARN}}),
]


@pytest.mark.parametrize("old, names, options", CASES)
def test_an_old_config_reads_as_the_same_model_named_the_new_way(old, names, options):
    values = {**GPTConfig(**TINY).to_dict(), **OLD, **old}
    for key in ("designs", "design_options"):
        del values[key]  # a checkpoint from before either
    config = GPTConfig.from_dict(values)
    expected = GPTConfig(**TINY, window=old.get("window"), designs=names, design_options=options)
    assert config == expected and config.designs == expected.designs
    assert set(GPT(config).state_dict()) == set(GPT(expected).state_dict())
    assert renamed.upgrade(config.to_dict()) == config.to_dict()  # today's form comes back as it is


def test_old_settings_of_a_design_and_of_a_layer_kind_are_keyed_by_their_design():
    flat = {**GPTConfig(**TINY).to_dict(), "designs": ["deltanet"], "design_options": {"delta_chunk": 8}}
    assert GPTConfig.from_dict(flat).design_options == {"deltanet": {"chunk": 8, "conv": 4}}
    kinds = {"D": {}, "A": {"designs": ["softcap"], "options": {"softcap": {"attn_softcap": 3.0}}}}
    config = GPTConfig.from_dict({**GPTConfig(**TINY).to_dict(), "layers": "DA", "layer_kinds": kinds})
    assert config.layer_kinds["A"]["options"] == {"softcap": {"cap": 3.0}}
    assert config.layer(1).design_options["softcap"] == {"cap": 3.0} and config.layer(0).designs == []


@pytest.mark.parametrize("field, value, says", [
    ("qk_norm", "yes", r"model.qk_norm \(an old setting: today the qk_norm design in model.designs\) must be true "
                       "or false, got 'yes'"),
    ("pos_embedding", "sinusoidal", "model.pos_embedding must be one of learned, rope, alibi"),
    ("mla_latent", 1.5, "model.mla_latent .* must be an integer or null, got 1.5"),
])
def test_a_damaged_old_field_is_one_config_error_naming_it(field, value, says):
    with pytest.raises(ConfigError, match=says):
        GPTConfig.from_dict({**GPTConfig(**TINY).to_dict(), field: value})


@pytest.mark.parametrize("override, new", [
    ("model.pos_embedding=rope", "model.designs=[rope]"),
    ("model.pos_embedding=learned", "leave rope and alibi out of model.designs (learned positions are the default)"),
    ("model.qk_norm=false", "leave qk_norm out of model.designs (off is the default)"),
    ("model.qk_norm=true", "model.designs=[qk_norm]"),
    ("model.attn_softcap=50", "model.designs=[softcap] model.design_options.softcap.cap=50"),
    ("model.attn_sink=true", "model.designs=[sink]"),
    ("model.diff_attn=true", "model.designs=[diff]"),
    ("model.linear_attn=elu1", "model.designs=[linear] model.design_options.linear.feature=elu1"),
    ("model.mla_latent=32", "model.designs=[mla] model.design_options.mla.latent=32"),
    ("model.mla_rope_dim=8", "model.designs=[mla] model.design_options.mla.rope_dim=8"),
    ("model.sink_tokens=4", "model.designs=[stream] model.design_options.stream.sinks=4"),
    ("model.rope_scaling={rope_type: linear, factor: 2}",
     "model.designs=[rope] model.design_options.rope.scaling={rope_type: linear, factor: 2}"),
    ("+model.rope_scaling.factor=4", "model.design_options.rope.scaling.factor"),
])
def test_each_old_spelling_is_told_its_new_one(override, new):
    problem = renamed.command_line_error(override)
    assert problem is not None and str(problem).endswith(new if new.startswith("leave") else f"write {new}"), problem
    assert renamed.command_line_error("model.designs=[rope]") is None
    assert renamed.command_line_error("model.window=8") is None


def test_an_old_spelling_on_the_command_line_is_one_error_line_before_anything_runs(tmp_path):
    result = run_inline("train", "model=tiny", "model.pos_embedding=rope", "model.qk_norm=true",
                        f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "error: model.pos_embedding is no longer a setting: write model.designs=[rope]", lines
    assert len(lines) == 2 and lines[1].startswith("hint: every design is named in model.designs")
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_a_designs_setting_is_typed_without_a_plus(tmp_path):
    result = run_inline("train", "model=tiny", "model.designs=[rope]", "model.design_options.rope.base=0.5",
                        f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "model.design_options.rope.base must be a number above 1, got 0.5" \
        in result.stderr, result.stderr
