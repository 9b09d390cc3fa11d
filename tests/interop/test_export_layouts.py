"""format=hf for layouts (model.layers, issue 40): a layout whose kinds differ only by window exports to transformers'
GPTNeoForCausalLM, any other layout to remote code built layer by layer from its kinds (windows, designs, a RoPE base
per kind, Gated DeltaNet); transformers opens each with logits within a stated tolerance and the same greedy tokens,
and the project reads each back. What no target holds stays a one-line refusal."""

from __future__ import annotations

import pytest
import torch

from gpt import GPTConfig
from gpt.errors import UserError
from gpt.interop import formats, gptneo
from gpt.interop import targets as hf_targets
from gpt.model import design as registry
from gpt.weights import load as pretrained
from tests.interop.test_export_designs import TINY, TOKENIZER, is_greedy, largest_difference, opened, randomised

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[dev]')")

LOCAL_GLOBAL = {"S": {"window": 3}, "L": {}}
# (settings, the target format=hf picks)
CASES = {
    "3:1 local:global (GPT-Neo)": ({"n_layer": 4, "bias": False, "layers": "SSSL", "layer_kinds": LOCAL_GLOBAL},
                                   "gptneo"),
    "1:1, head_dim 16, untied, relu2 (GPT-Neo)": ({"n_layer": 4, "n_head": 2, "bias": False, "tie_head": False,
                                                  "activation": "relu2", "layers": ["S", "L", "L", "S"],
                                                  "layer_kinds": {"S": {"window": 5}, "L": {}}}, "gptneo"),
    "local:global with biases (remote: GPT-Neo's q/k/v have none)": (
        {"n_layer": 4, "layers": "SSSL", "layer_kinds": LOCAL_GLOBAL}, "remote"),
    "two window sizes (remote: GPT-Neo has one)": (
        {"n_layer": 3, "bias": False, "layers": "SML",
         "layer_kinds": {"S": {"window": 3}, "M": {"window": 6}, "L": {}}}, "remote"),
    "5:1 local:global, a RoPE base per kind": (
        {"n_layer": 6, "layers": "SSSSSL", "layer_kinds": {"S": {"window": 4, "designs": ["rope"]},
                                                           "L": {"designs": ["rope"],
                                                                 "options": {"rope": {"base": 1000000}}}}}, "remote"),
    "NoPE every 4th layer": ({"n_layer": 4, "layers": "RRRN", "layer_kinds": {"R": {"designs": ["rope"]}, "N": {}}},
                             "remote"),
    "3:1 Gated DeltaNet:gated attention (Qwen3-Next's)": (
        {"n_layer": 4, "norm": "rmsnorm", "bias": False, "layers": "DDDG",
         "layer_kinds": {"D": {"designs": ["deltanet"]}, "G": {"designs": ["gated", "rope"]}}}, "remote"),
}
# Gated DeltaNet's export runs its recurrence token by token, the project the chunked form (test_export_designs.py)
TOLERANCE = {"3:1 Gated DeltaNet:gated attention (Qwen3-Next's)": 3e-5}
# GPT-Neo's q_proj is ours times 1/sqrt(head_dim): read back exactly for head_dim 16 (1/4), within a rounding for 8
ROUNDED_BACK = {"3:1 local:global (GPT-Neo)"}


@pytest.mark.parametrize("case", CASES)
def test_a_layout_opens_in_transformers_with_the_same_logits(case, tmp_path):
    settings, target = CASES[case]
    model = randomised(settings)
    assert hf_targets.choose(model.config) == target
    out = formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
    theirs = opened(out)
    assert type(theirs).__name__ == {"gptneo": "GPTNeoForCausalLM", "remote": "GPTAttentionForCausalLM"}[target]
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(1))
    assert largest_difference(model, theirs, idx) <= TOLERANCE.get(case, 1e-5)
    prompt = idx[:1, :4]
    with torch.no_grad():
        generated = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                                    do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 20) and is_greedy(model, generated, prompt=4)
    config, state, tokenizer = pretrained.load_weights(out)  # and back here
    assert config == model.config and tokenizer == TOKENIZER
    for key, value in model.state_dict().items():
        if case in ROUNDED_BACK:
            torch.testing.assert_close(state[key], value, rtol=1.2e-7, atol=0)
        else:
            assert torch.equal(state[key], value), key


def test_gpt_neo_holds_the_window_rule_and_the_scale_in_float64(tmp_path):
    """GPT-Neo's local mask keeps keys i - window < j <= i (ours); folding 1/sqrt(head_dim) into q_proj is exact in
    float64: the layers' outputs in float64 agree to 1e-12 (GPT-Neo computes its scores in float32, so the whole
    model is compared in float32 above)."""
    model = randomised(CASES["3:1 local:global (GPT-Neo)"][0]).double()
    out = formats.export(model.state_dict(), model.config, TOKENIZER, tmp_path / "exp")
    theirs = opened(out).double()
    x = torch.randn(1, 10, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for i in (0, 3):  # a local layer and the global one
        ours_attn, their_attn = model.transformer.h[i].attn, theirs.transformer.h[i].attn.attention
        q = their_attn.q_proj(x).view(1, 10, 4, 8).transpose(1, 2)
        k = their_attn.k_proj(x).view(1, 10, 4, 8).transpose(1, 2)
        allowed = their_attn.bias[0, 0, :10, :10]
        index = torch.arange(10)
        window = model.config.layer(i).window or 10**6
        assert torch.equal(allowed, (index[None, :] <= index[:, None]) & (index[None, :] > index[:, None] - window))
        qo, ko, _ = ours_attn.c_attn(x).split(TINY["n_embd"], dim=2)
        ours_scores = (qo.view(1, 10, 4, 8).transpose(1, 2) @ ko.view(1, 10, 4, 8).transpose(1, 2).mT) / 8 ** 0.5
        torch.testing.assert_close(q @ k.mT, ours_scores, rtol=1e-12, atol=1e-12)


def test_what_no_target_holds_is_one_line_naming_the_kind(tmp_path):
    class Unexportable(registry.Design):
        name = "unexportable"
        about = "a design with no modeling source"

    registry.register(Unexportable())
    try:
        config = GPTConfig(**{**TINY, "n_layer": 2, "layers": "UL",
                              "layer_kinds": {"U": {"designs": ["unexportable"]}, "L": {}}})
        with pytest.raises(UserError, match=r"^model.layer_kinds.U: model.designs=\[unexportable\] cannot be "
                                            r"exported for transformers") as err:
            formats.export(randomised({"layers": "UL", "layer_kinds": config.layer_kinds}).state_dict(), config,
                           TOKENIZER, tmp_path / "refused")
        assert "\n" not in str(err.value) and "format=native" in err.value.hint and not (tmp_path / "refused").exists()
    finally:
        registry.unregister("unexportable")
    layout = randomised({"n_layer": 2, "layers": "SL", "layer_kinds": LOCAL_GLOBAL})
    with pytest.raises(UserError, match="format=gguf cannot hold yet"):
        formats.export(layout.state_dict(), layout.config, TOKENIZER, tmp_path / "m.gguf", format="gguf")


def test_gpt_neo_names_why_it_does_not_hold_a_layout():
    base = {**TINY, "n_layer": 2, "bias": False, "layers": "SL"}
    why = {"bias": ({"bias": True}, "model.bias=true"), "rope": ({"layer_kinds": {"S": {"window": 3, "designs":
                                                                                        ["rope"]}, "L": {}}},
                                                                "kind S has designs ['rope']"),
           "gqa": ({"n_kv_head": 2}, "model.n_kv_head=2"), "rmsnorm": ({"norm": "rmsnorm"}, "model.norm=rmsnorm")}
    for changes, said in why.values():
        config = GPTConfig(**{**base, "layer_kinds": LOCAL_GLOBAL, **changes})
        assert said in gptneo.mismatch(config)
        assert hf_targets.choose(config) == "remote"
    assert gptneo.mismatch(GPTConfig(**{**base, "layer_kinds": LOCAL_GLOBAL})) is None


TEXT = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for i in range(3) for j in range(20))
TRAINED = {  # a layout of each target, trained until its greedy text is not one repeated character
    "GPT-Neo": ["S", "S", "S", "L"], "5:1 two RoPE bases": ["S"] * 5 + ["L"], "NoPE every 4th": ["R", "R", "R", "N"],
    "Gated DeltaNet:gated attention": ["D", "D", "D", "G"]}
TRAINED_KINDS = {"GPT-Neo": ({"S": {"window": 8}, "L": {}}, {"bias": False}),
                 "5:1 two RoPE bases": ({"S": {"window": 8, "designs": ["rope"]},
                                         "L": {"designs": ["rope"], "options": {"rope": {"base": 1000000}}}}, {}),
                 "NoPE every 4th": ({"R": {"designs": ["rope"]}, "N": {}}, {}),
                 "Gated DeltaNet:gated attention": ({"D": {"designs": ["deltanet"]},
                                                     "G": {"designs": ["gated", "rope"]}},
                                                    {"norm": "rmsnorm", "bias": False})}


def trained_run(name: str, folder) -> None:
    """A tiny layout model trained on TEXT (80 AdamW steps), saved as a training run's checkpoint."""
    from gpt import GPT
    from gpt.tokenizers.tokenizer import CharTokenizer
    from gpt.weights import checkpoint

    tokenizer = CharTokenizer(sorted(set(TEXT)))
    kinds, extra = TRAINED_KINDS[name]
    config = GPTConfig(n_layer=len(TRAINED[name]), n_head=2, n_embd=32, block_size=32,
                       vocab_size=tokenizer.vocab_size, layers=TRAINED[name], layer_kinds=kinds, **extra)
    data = torch.tensor(tokenizer.encode(TEXT))
    torch.manual_seed(0)
    model = GPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(80):
        starts = torch.randint(0, len(data) - 33, (8,))
        x, y = (torch.stack([data[s + shift:s + shift + 32] for s in starts]) for shift in (0, 1))
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    folder.mkdir()
    checkpoint.save(checkpoint.model_entries(model.state_dict(), config, tokenizer.to_meta()), folder / "ckpt.pt")


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_transformers_greedy_text_of_a_trained_layout_equals_generate_py(name, tmp_path):
    from conftest import run_forked
    from tests.train.test_layout_training import transformers_greedy_text

    trained_run(name, tmp_path / "run")
    export = run_forked("export", f"ckpt={tmp_path / 'run'}", f"out={tmp_path / 'hf'}")
    assert export.returncode == 0, export.stderr
    assert ("GPTNeoForCausalLM" if name == "GPT-Neo" else "remote code") in export.stdout
    ours = run_forked("generate", f"ckpt={tmp_path / 'run'}", "temperature=0", "max_new_tokens=25", "prompt=def",
                      "device=cpu")
    assert ours.returncode == 0, ours.stderr
    assert len(set(ours.stdout[3:])) > 4, f"a degenerate continuation would prove little: {ours.stdout!r}"
    assert transformers_greedy_text(tmp_path / "hf", "def", 25) + "\n" == ours.stdout
