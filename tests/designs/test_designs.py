"""The contract every attention design keeps, run on every registered design: the built-in ones (gpt/designs/), the
one docs/designs.md brings from a file in a temporary folder (talking-heads attention, loaded as a user loads it),
and any GPT_DESIGNS names. Each design's ``cases`` are checked against its float64 reference on every kernel that
can compute them (a case that no kernel can compute fails), for causality, cached decoding equal to the full
forward with a decoding step compiled once, pictures, save and load, an exact resume, the memory planner within
15%, and every pair of designs either working together or refused with one line."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import accepted_kernels, perturbed_model, train_stop_and_resume, tutorial_design
from gpt import GPT, GPTConfig, memory
from gpt.designs import reference
from gpt.errors import ConfigError, UserError
from gpt.inference.decoding import compiled_decode_step, generate, generate_batch, prefill
from gpt.model import design as registry
from gpt.model.kv_cache import KVCache
from gpt.weights import checkpoint

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)  # head_dim 8


tutorial_design()  # the brought design beside the built-in ones
DESIGNS = registry.available()


def cases() -> list[tuple[str, str, dict]]:
    """(design, case, model settings) for every case every design declares (its preset when it declares none)."""
    return [(name, case, settings) for name in DESIGNS
            for case, settings in (registry.get(name).cases or {"preset": registry.get(name).on_preset()}).items()]


def kernels(settings: dict) -> list[str | None]:
    """The kernels GPTConfig accepts for these settings ([None]: none can, a failing case)."""
    return accepted_kernels(dict(TINY, **settings)) or [None]


REFERENCE_CASES = [pytest.param(name, settings, kernel, id=f"{name}-{case}-{kernel}")
                   for name, case, settings in cases() for kernel in kernels(settings)]
FIRST_CASES = [pytest.param(name, settings, kernels(settings)[0], id=f"{name}-{case}") for name, case, settings
               in cases()]
ONE_CASE = [next(p for p in FIRST_CASES if p.values[0] == name) for name in DESIGNS]  # each design's first case
PRESETS = [pytest.param(name, id=name) for name in DESIGNS]


def model_for(settings: dict, kernel: str | None, sharpen: float = 1.0) -> GPT:
    return perturbed_model(dict(TINY, **settings), kernel or "sdpa", sharpen)


@pytest.mark.parametrize("design, settings, kernel", REFERENCE_CASES)
def test_each_kernel_matches_the_float64_reference(design, settings, kernel):
    assert kernel is not None, f"no attention kernel can compute {design} with {settings}"
    model = model_for(settings, kernel).double()
    x = torch.randn(2, 7, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ctx = model.contexts(torch.zeros(2, 7, dtype=torch.long), None, None, None)[None]
    for layer in (0, TINY["n_layer"] - 1):
        attn = model.transformer.h[layer].attn
        with torch.no_grad():
            got = attn(x, ctx)
        float32_positions = any(t.dtype == torch.float32 for v in ctx.extras.values()
                                for t in (v if isinstance(v, tuple) else (v,)))  # RoPE angles, an ALiBi bias
        tolerance = 1e-6 if float32_positions else 1e-10
        torch.testing.assert_close(got, reference.layer(attn, x, model.config), atol=tolerance, rtol=tolerance,
                                   msg=lambda m: f"{design}, {kernel}, layer {layer}: {m}")


@pytest.mark.parametrize("design, settings, kernel", FIRST_CASES)
def test_a_later_token_never_changes_an_earlier_output(design, settings, kernel):
    model = model_for(settings, kernel)
    seq = torch.randint(0, 50, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(seq)[0]
        for cut in (3, 11):
            changed = seq.clone()
            changed[0, cut:] = (changed[0, cut:] + 7) % 50
            assert torch.equal(model(changed)[0][:, :cut], logits[:, :cut]), cut


@pytest.mark.parametrize("design, settings, kernel", FIRST_CASES)
def test_cached_decoding_equals_the_full_forward(design, settings, kernel):
    model = model_for(settings, kernel, sharpen=2.0)  # logits of order 1: fp32 rounding stays under 1e-5
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        full, _ = model(seq)
        steps = [model(seq[:, :7], cache=cache)[0]] + [model(seq[:, t:t + 1], cache=cache)[0] for t in range(7, 16)]
    slots = cache.slots[None] if len(cache.slots) == 1 else None
    if slots is not None and slots.renumber and slots.sinks:  # StreamingLLM's numbering inside the cache: the sinks
        # sit nearer than in the full forward once they leave the window, so only the prompt (a full forward) is
        # compared here; tests/inference/test_streaming.py holds each step to a float64 reference of that numbering
        torch.testing.assert_close(steps[0], full[:, :7], atol=1e-5, rtol=1e-5)
        return
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    sharp = model_for(settings, kernel, sharpen=6.0)  # decisive greedy choices; 30 tokens slide past block_size
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(generate(sharp, prompt, 30, temperature=0.0), generate(sharp, prompt, 30, temperature=0.0,
                                                                             kv_cache=False))
    prompts = [[3, 1, 4, 1, 5], [9, 2]]  # left-padded into one batch: each row as if alone, or one clear refusal
    try:
        batch = generate_batch(sharp, prompts, 8, temperature=0.0)
    except UserError as err:
        assert "one prompt at a time" in err.hint
    else:
        assert batch == [generate(sharp, torch.tensor([p]), 8, temperature=0.0, kv_cache=False)[0].tolist()
                         for p in prompts]


@pytest.mark.parametrize("design, settings, kernel", ONE_CASE)
def test_a_decoding_step_compiles_once_for_32_tokens(design, settings, kernel):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()  # compilations are cached per code object: start this design's count from nothing
    model = model_for({**settings, "block_size": 48}, kernel)
    counter = CompileCounter()
    step = compiled_decode_step(backend=counter)
    prompt, positions = torch.randint(0, 50, (2, 5)), torch.arange(5).expand(2, 5)
    cache, eager = (KVCache(model.config, batch_size=2, device="cpu") for _ in range(2))
    token = prefill(model, prompt, positions, None, cache).argmax(-1, keepdim=True)
    prefill(model, prompt, positions, None, eager)
    for _ in range(32):
        positions = positions[:, -1:] + 1
        logits = step(model, token, positions, cache)
        torch.testing.assert_close(logits, model(token, positions=positions, cache=eager)[0][:, -1], atol=1e-5,
                                   rtol=1e-5)
        token = logits.argmax(-1, keepdim=True)
    assert counter.frame_count == 1


@pytest.mark.parametrize("design, settings, kernel", FIRST_CASES)
def test_the_pictures_are_causal_and_leave_the_model_as_it_was(design, settings, kernel):
    from gpt.inference.visualize import attention_maps

    model = model_for(settings, kernel)
    idx = torch.arange(10)[None]
    with torch.no_grad():
        before = model(idx)[0]
    maps = attention_maps(model, idx)
    assert maps.shape == (TINY["n_layer"], TINY["n_head"], 10, 10) and torch.all(maps.triu(1) == 0)
    assert maps.isfinite().all() and maps.abs().sum() > 0
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before)  # the kernels are back


@pytest.mark.parametrize("design", PRESETS)
def test_a_checkpoint_and_an_export_load_with_the_same_logits(design, tmp_path):
    from gpt.interop.formats import export
    from gpt.tokenizers.tokenizer import CharTokenizer
    from gpt.weights.load import load_model

    settings = registry.get(design).on_preset()
    model = model_for(settings, settings.get("attention"))
    tokenizer = CharTokenizer([chr(97 + i) for i in range(50)]).to_meta()
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(idx)[0]
    checkpoint.save(checkpoint.model_entries(model.state_dict(), model.config, tokenizer), tmp_path / "m.pt")
    export(model.state_dict(), model.config, tokenizer, tmp_path / "native", format="native")
    sources = ["m.pt", "native"]
    if registry.get(design).modeling:  # format=hf: Starcoder2 or remote code (read back without running code)
        export(model.state_dict(), model.config, tokenizer, tmp_path / "hf", format="hf")
        sources.append("hf")
    else:  # a brought design without a modeling file: one line saying so
        with pytest.raises(UserError, match=f"design {design} .* registers no modeling source"):
            export(model.state_dict(), model.config, tokenizer, tmp_path / "hf", format="hf")
    for source in sources:
        loaded, _ = load_model(tmp_path / source)
        with torch.no_grad():
            assert torch.equal(loaded(idx)[0], expected), source


def overrides(settings: dict) -> list[str]:
    """Model settings as command-line overrides (the kernel through the attention group)."""
    spell = registry.spell
    return [f"attention={v}" if k == "attention" else
            f"model.{k}=[{','.join(v)}]" if isinstance(v, list) else f"model.{k}={spell(v)}"
            for k, v in settings.items()]


@pytest.mark.parametrize("design", PRESETS)
def test_a_run_resumes_bit_for_bit(design, tmp_path, data_args):
    """Two steps, a resume to four, and four straight: the same weights, bit for bit (every parameter)."""
    first, resumed, straight = train_stop_and_resume(["model=tiny", *overrides(registry.get(design).on_preset()),
                                                      *data_args], tmp_path, half=2)
    assert any(not torch.equal(first[n], straight[n]) for n in straight)
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name


@pytest.mark.parametrize("design", PRESETS)
def test_the_memory_planner_is_within_15_percent_and_counts_the_cache(design):
    from gpt.arena.arena import kv_bytes_per_token
    from gpt.bench.tensor_memory import measure_training_peak

    settings = registry.get(design).on_preset()
    config = GPTConfig(**{**TINY, "n_layer": 3, "n_embd": 64, "block_size": 64, "vocab_size": 128, **settings})
    measured = measure_training_peak(config, 8, config.block_size, "fp32")
    planned = memory.plan(config, 8, precision="fp32", fused_adamw=False).peak
    assert planned == pytest.approx(measured, rel=0.15), f"planned {planned:,} vs measured {measured:,}"
    assert memory.kv_bytes_per_token(config, 4) == kv_bytes_per_token(GPT(config).eval(), "cpu")


@pytest.mark.parametrize("design, settings", [p.values[:2] for p in FIRST_CASES], ids=[p.id for p in FIRST_CASES])
def test_the_declared_flops_match_flop_counter_mode_on_the_manual_kernel_within_2_percent(design, settings):
    """gpt.model.flops.per_token (each design's declared flops) against what torch counts in one training step's forward
    and backward on the manual kernel, which forms every score."""
    from torch.utils.flop_counter import FlopCounterMode

    from gpt.model import flops

    config = GPTConfig(**{**TINY, **settings, "attention": "manual"})
    model, batch = GPT(config), 3
    ids = torch.randint(0, config.vocab_size, (batch, config.block_size + 1))
    with FlopCounterMode(display=False) as counter:
        _, loss = model(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
        loss.backward()
    counted = counter.get_total_flops() / (batch * config.block_size)
    assert flops.per_token(config) == pytest.approx(counted, rel=0.02), design
    assert counted > flops.per_token(GPTConfig(**{**TINY, "attention": "manual", "n_layer": 1})), "counted nothing"


def test_a_design_that_declares_no_flops_is_refused_by_the_count_in_one_line():
    from gpt.model import flops

    class Silent(registry.Design):
        name = "silent_test_design"

    registry.register(Silent())
    try:
        with pytest.raises(ConfigError, match="'silent_test_design' declares no FLOPs count") as caught:
            flops.per_token(GPTConfig(**TINY, designs=["silent_test_design"]))
        assert "flops(self, config, seq, flops)" in caught.value.hint
    finally:
        registry.unregister("silent_test_design")


PAIRS = [pytest.param(a, b, id=f"{a}+{b}") for i, a in enumerate(DESIGNS) for b in DESIGNS[i + 1:]]


@pytest.mark.parametrize("a, b", PAIRS)
def test_two_designs_work_together_or_are_refused_naming_both(a, b):
    settings = registry.get(a).on_preset()
    for key, value in registry.get(b).on_preset().items():
        settings[key] = settings.get(key, []) + value if key == "designs" else value
    try:
        config = GPTConfig(**{**TINY, **settings})
    except ConfigError as err:
        assert "\n" not in str(err) and err.hint, err
        named = [d for d in (a, b) if re.search(rf"\b{d}\b", str(err))]
        assert named == [a, b] or named and "model.window" in str(err), f"the refusal names both settings: {err}"
        return
    with torch.no_grad():
        logits, _ = GPT(config).eval()(torch.randint(0, 50, (1, 9)))
    assert logits.isfinite().all()


def test_a_checkpoint_whose_design_is_not_available_says_how_to_bring_it(tmp_path):
    from gpt.weights.load import load_model

    model = model_for({"designs": ["talking_heads"]}, None)
    payload = checkpoint.model_entries(model.state_dict(), model.config, {"kind": "char", "vocab_size": 50,
                                                                          "chars": [chr(97 + i) for i in range(50)]})
    payload["model_config"]["designs"] = ["nowhere_attention"]
    checkpoint.save(payload, tmp_path / "m.pt")
    with pytest.raises(UserError, match="attention design 'nowhere_attention' is not available") as caught:
        load_model(tmp_path / "m.pt")
    assert "designs=[" in caught.value.hint and "GPT_DESIGNS" in caught.value.hint


def test_a_brought_designs_options_get_their_defaults_and_unknown_ones_are_refused():
    class Scaled(registry.Design):
        name, options = "scaled_scores", {"temperature": 1.0}

        def build(self, layer, config):
            layer.scale = 1.0 / (self.option(config, "temperature") * config.head_dim ** 0.5)

    registry.register(Scaled())
    try:
        config = GPTConfig(**TINY, designs=["scaled_scores"])
        assert config.design_options == {"scaled_scores": {"temperature": 1.0}}  # the default, kept in checkpoints
        hot = GPTConfig(**TINY, designs=["scaled_scores"], design_options={"scaled_scores": {"temperature": 2.0}})
        assert GPT(hot).transformer.h[0].attn.scale == pytest.approx(1 / (2 * 8 ** 0.5))
        old = {**hot.to_dict(), "design_options": {"temperature": 2.0}}  # a checkpoint from before: not by design
        assert GPTConfig.from_dict(old) == hot
        with pytest.raises(ConfigError, match="model.design_options.scaled_scores.temprature is not a setting of "
                                              "design scaled_scores"):
            GPTConfig(**TINY, designs=["scaled_scores"], design_options={"scaled_scores": {"temprature": 2.0}})
        with pytest.raises(ConfigError, match="attention design 'scaled_score' is not available"):
            GPTConfig(**TINY, designs=["scaled_score"])
    finally:
        registry.unregister("scaled_scores")
