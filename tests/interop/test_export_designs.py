"""format=hf for every design (issue 29): each built-in design exports to a folder transformers opens, as a standard
architecture where one computes the model exactly (GPT-2, Starcoder2) and as remote code otherwise, with logits
within 1e-5 in float32 and the same greedy tokens; a user's design exports from the modeling file it registers, or
is refused in one line; and the project's own import of an export never runs its modeling file."""

from __future__ import annotations

import math

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.interop import formats
from gpt.interop import targets as hf_targets
from gpt.model import design as registry
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import load as pretrained

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[dev]')")

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=40)
TOKENIZER = CharTokenizer([chr(97 + i) for i in range(40)]).to_meta()
# (settings, the target format=hf picks): every built-in design by its arena preset, and the standard matches
CASES = {
    "gpt2": ({}, "gpt2"),
    "rope+gqa+window": ({"designs": ["rope"], "n_kv_head": 2, "window": 5}, "starcoder2"),
    "rope+relu2+untied+no_bias": ({"designs": ["rope"], "activation": "relu2", "tie_head": False,
                                   "bias": False}, "starcoder2"),
    "gqa+window (no design)": ({"n_kv_head": 1, "window": 6}, "remote"),
    **{name: (registry.get(name).on_preset(), "starcoder2" if name == "rope" else "remote")
       for name in registry.BUILTIN},
    "alibi+qk_norm+softcap+sink": ({"designs": ["alibi", "qk_norm", "softcap", "sink"],
                                    "design_options": {"softcap": {"cap": 3.0}},
                                    "n_kv_head": 2, "attention": "manual"}, "remote"),
    "diff+rope+qk_norm+mqa": ({"designs": ["diff", "rope", "qk_norm"], "n_kv_head": 1}, "remote"),
    "rmsnorm+rope+gqa (Starcoder2 has LayerNorm)": ({"norm": "rmsnorm", "designs": ["rope"], "n_kv_head": 2},
                                                    "remote"),
    "gated+rope+qk_norm+rmsnorm (Qwen3-Next's attention)": ({"designs": ["gated", "rope", "qk_norm"],
                                                              "norm": "rmsnorm", "bias": False,
                                                              "n_kv_head": 2}, "remote"),
}

# Gated DeltaNet's export runs the recurrence token by token, the project the chunked form: on these weights (every
# parameter moved by 0.3, logits up to 6) either fp32 forward is 2.7e-5 from the float64 one, so two fp32 orders of
# summation cannot be held to 1e-5 (measured: 1.1e-5 apart); the greedy tokens below must still be equal.
TOLERANCE = {"deltanet": 3e-5}


def randomised(settings: dict, seed: int = 0) -> GPT:
    """A tiny model whose every parameter (gains, biases, sinks, lambdas too) is away from its initial value."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **settings})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model


def opened(folder):
    """AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True), every tensor found and used."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                                    output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def is_greedy(model: GPT, tokens: torch.Tensor, prompt: int) -> bool:
    """Whether each token after the prompt is this model's argmax given those before it (one forward pass: the
    same as decoding greedily token by token, without a forward per token)."""
    with torch.no_grad():
        choices = model(tokens[:, :-1])[0].argmax(-1)  # (1, T-1): the choice after each prefix
    return torch.equal(choices[:, prompt - 1:], tokens[:, prompt:])


def largest_difference(model: GPT, theirs, idx: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(idx)[0] - theirs(idx).logits).abs().max().item()


@pytest.mark.parametrize("case", CASES)
def test_every_design_opens_in_transformers_with_the_same_logits(case, tmp_path):
    settings, target = CASES[case]
    model = randomised(settings)
    assert hf_targets.choose(model.config) == target
    out = formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
    theirs = opened(out)
    assert type(theirs).__name__ == {"gpt2": "GPT2LMHeadModel", "starcoder2": "Starcoder2ForCausalLM",
                                     "remote": "GPTAttentionForCausalLM"}[target]
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(1))
    assert largest_difference(model, theirs, idx) <= TOLERANCE.get(case, 1e-5)
    prompt = idx[:1, :4]
    with torch.no_grad():
        generated = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                                    do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 16) and is_greedy(model, generated, prompt=4)
    config, state, tokenizer = pretrained.load_weights(out)  # and back here, exactly
    assert config == model.config and tokenizer == TOKENIZER
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_reading_an_export_never_runs_its_modeling_file(tmp_path):
    model = randomised({"designs": ["qk_norm", "sink"], "attention": "manual"})
    out = formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
    marker = tmp_path / "ran"
    for name in (hf_targets.MODELING, "design_qk_norm.py", "design_sink.py"):
        assert (out / name).is_file()
        (out / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n")
    loaded, _ = pretrained.load_model(out)
    idx = torch.randint(0, TINY["vocab_size"], (1, 10))
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])
    assert not marker.exists()


class HalfScale(registry.Design):
    """A user's design: attention scores at half the usual scale (a part that sets the layer's scale)."""

    name = "halfscale"
    about = "attention scores scaled by 0.5 / sqrt(head_dim)"

    def build(self, layer, config) -> None:
        layer.scale = 0.5 / math.sqrt(layer.head_dim)


HALF_SCALE_PART = '''import math


class Part:
    def build(self, layer, mc):
        layer.scale = 0.5 / math.sqrt(layer.head_dim)
'''


def test_a_users_design_exports_from_the_modeling_file_it_registers(tmp_path):
    design = HalfScale()
    registry.register(design)
    try:
        model = randomised({"designs": ["halfscale", "rope"]})
        with pytest.raises(UserError, match=r"model.designs=\[halfscale\] cannot be exported for transformers: .* "
                                            r"registers no modeling source") as err:
            formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "refused")
        assert "\n" not in str(err.value) and "format=native" in err.value.hint
        assert not (tmp_path / "refused").exists()
        (tmp_path / "halfscale_part.py").write_text(HALF_SCALE_PART)
        design.modeling = str(tmp_path / "halfscale_part.py")
        out = formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
        assert (out / "design_halfscale.py").read_text() == HALF_SCALE_PART
        idx = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(2))
        assert largest_difference(model, opened(out), idx) <= 1e-5
    finally:
        registry.unregister("halfscale")


def test_the_export_says_which_path_it_took(tmp_path, capsys):
    from gpt.weights import checkpoint
    from gpt.weights.export import ExportConfig, run

    for name, settings, said in (("sc2", {"designs": ["rope"], "n_kv_head": 2, "window": 4},
                                  "Starcoder2ForCausalLM (standard architecture)"),
                                 ("remote", {"window": 4}, "remote code: modeling_gpt_attention.py")):
        config = GPTConfig(**{**TINY, **settings})
        (tmp_path / name).mkdir()
        checkpoint.save(checkpoint.model_entries(GPT(config).state_dict(), config, TOKENIZER),
                        tmp_path / name / "ckpt.pt")
        run(ExportConfig(ckpt=str(tmp_path / name)))
        assert said in capsys.readouterr().out


SCALINGS = {"linear": {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 6},
            "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 6},
            "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6, "beta_fast": 16},
            "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 6}}


@pytest.mark.parametrize("name", SCALINGS)
def test_a_scaled_rope_opens_in_transformers_with_the_same_logits_past_the_original_length(name, tmp_path):
    """Starcoder2 carries model.design_options.rope.scaling in rope_parameters: every position of a 24-token input
    (4x the original 6) gives this project's logits (the bound is the issue's 1e-4; measured below 1e-5)."""
    model = randomised({"designs": ["rope"], "n_kv_head": 2, "design_options": {"rope": {"scaling": SCALINGS[name]}}})
    out = formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
    opened_model = opened(out)
    assert type(opened_model).__name__ == "Starcoder2ForCausalLM"
    assert opened_model.config.rope_parameters["rope_type"] == name
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(1))
    assert largest_difference(model, opened_model, idx) <= 1e-5
    unscaled = randomised({"designs": ["rope"], "n_kv_head": 2})  # the same weights: the scaling is what differs
    assert largest_difference(unscaled, opened_model, idx) > 1e-2
    config, _, _ = pretrained.load_weights(out)
    assert config == model.config


def test_a_scaling_only_starcoder2_holds_is_refused_elsewhere_in_one_line(tmp_path):
    model = randomised({"designs": ["rope", "qk_norm"], "design_options": {"rope": {"scaling": SCALINGS["yarn"]}}})
    with pytest.raises(UserError, match=r"model.design_options.rope.scaling \(yarn\) cannot be exported for "
                                        r"transformers here: only Starcoder2 .* carries it, and the remote-code "
                                        r"export does not"):
        formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()
    kinds = {"S": {"window": 4, "designs": ["rope"]},
             "L": {"designs": ["rope"], "options": {"rope": {"scaling": SCALINGS["linear"]}}}}
    layout = randomised({"layers": "SL", "layer_kinds": kinds})
    with pytest.raises(UserError, match=r"model.layer_kinds.L.options.rope.scaling \(linear\) cannot be exported"):
        formats.export(layout.state_dict(), layout.config, TOKENIZER, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()
    plain = randomised({"designs": ["rope"], "design_options": {"rope": {"scaling": SCALINGS["linear"]}}})
    pytest.importorskip("gguf")
    with pytest.raises(UserError, match=r"format=gguf cannot hold model.design_options.rope.scaling \(linear\)"):
        formats.export(plain.state_dict(), plain.config, TOKENIZER, tmp_path / "g", format="gguf")
