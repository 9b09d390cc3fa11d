"""Patterns from every kernel equal each design's float64 pattern (its own score path: differential attention's two
maps and their difference, linear attention's implied weights, MLA's), reading them leaves the outputs as the fused
kernel computes them, and writing them changes what the layer computes (pattern @ v = the float64 layer)."""

from __future__ import annotations

import pytest
import torch

from conftest import accepted_kernels, perturbed_model, tutorial_design
from gpt import GPTConfig
from gpt.designs import reference
from gpt.errors import UserError
from gpt.interpret import hooks, run_with_cache
from gpt.model import design as registry

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)

tutorial_design()  # docs/designs.md's brought design, loaded as a user loads it


def kernels(settings: dict) -> list[str]:
    """Every kernel the config accepts (a design that uses none: the default once)."""
    return accepted_kernels(dict(TINY, **settings))


CASES = [pytest.param(name, settings, kernel, id=f"{name}-{case}-{kernel}")
         for name in registry.available()
         for case, settings in (registry.get(name).cases or {"preset": registry.get(name).on_preset()}).items()
         for kernel in kernels(settings)]


def tolerance(model, ctx) -> float:
    """1e-10, or 1e-6 where positions reach the layers as float32 (RoPE angles, an ALiBi bias), as the contract's."""
    with torch.no_grad():
        model.transformer.h[0].attn(torch.zeros(2, 7, TINY["n_embd"], dtype=torch.float64), ctx)
    float32 = any(t.dtype == torch.float32 for v in ctx.extras.values() for t in (v if isinstance(v, tuple) else (v,)))
    return 1e-6 if float32 else 1e-10


def declares_pattern(config) -> bool:
    own = next((d for d in registry.active(config) if d.layer is not None), None)
    return own is None or type(own).ref_pattern is not registry.Design.ref_pattern


@pytest.mark.parametrize("design, settings, kernel", CASES)
def test_every_kernels_pattern_equals_the_float64_pattern(design, settings, kernel):
    model = perturbed_model(dict(TINY, **settings), kernel).double()
    idx = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    names = ["blocks.*.attn.hook_pattern", "blocks.*.hook_resid_pre", "blocks.*.attn.hook_z"]
    logits, cache = run_with_cache(model, idx, names)
    with torch.no_grad():
        assert torch.equal(logits, model(idx)[0])  # reading the patterns changed nothing
    tol = tolerance(model, model.contexts(idx, None, None, None)[None])
    for layer in range(TINY["n_layer"]):
        block = model.transformer.h[layer]
        attn, x = block.attn, block.ln_1(cache[f"blocks.{layer}.hook_resid_pre"])
        got = cache.pattern(layer)
        assert got.shape == (2, TINY["n_head"], 7, 7)
        if declares_pattern(model.config):
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, reference.pattern(attn, x, model.config), atol=tol, rtol=tol)
        else:  # a brought design that declares none: what its pictures show
            from gpt.inference.visualize import attention_maps

            torch.testing.assert_close(got[0], attention_maps(model, idx[:1])[layer], atol=0, rtol=0)
        if design == "diff":
            maps = cache[f"blocks.{layer}.attn.hook_pattern_maps"]
            for got_map, want in zip(maps, registry.get("diff").ref_maps(attn, x, model.config)):
                torch.testing.assert_close(got_map, want, atol=tol, rtol=tol)


def through_a_kernel(settings: dict) -> bool:
    """Whether every design a case switches on leaves the attention to the kernel (else its pattern is read-only)."""
    config = GPTConfig(**{**TINY, "attention": "manual", **settings})  # a kernel that computes every score
    return all(design.uses_kernel for design in registry.active(config))


@pytest.mark.parametrize("design, settings, kernel", [c for c in CASES if through_a_kernel(c.values[1])])
def test_a_written_pattern_is_what_the_layer_computes_from(design, settings, kernel):
    model = perturbed_model(dict(TINY, **settings), kernel).double()
    x = torch.randn(2, 7, TINY["n_embd"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ctx = model.contexts(torch.zeros(2, 7, dtype=torch.long), None, None, None)[None]
    attn = model.transformer.h[1].attn
    tol = tolerance(model, ctx)
    with hooks(model, [("blocks.1.attn.hook_pattern", lambda p, hook: p.clone())]), torch.no_grad():
        torch.testing.assert_close(attn(x, ctx), reference.layer(attn, x, model.config), atol=tol, rtol=tol)
    with hooks(model, [("blocks.1.attn.hook_pattern", lambda p, hook: torch.zeros_like(p))]), torch.no_grad():
        zeroed = attn(x, ctx)
    if design != "diff":  # no weights: the layer adds only its out projection's bias (or nothing)
        bias = attn.c_proj.bias if attn.c_proj.bias is not None else torch.zeros_like(zeroed)
        torch.testing.assert_close(zeroed, bias.expand_as(zeroed), atol=1e-12, rtol=0)
    with torch.no_grad():
        assert not torch.equal(zeroed, attn(x, ctx))  # and the hooks are gone


def test_a_layer_without_a_kernel_shows_its_pattern_read_only():
    model = perturbed_model(dict(TINY, designs=["linear"]))
    with pytest.raises(UserError, match="forms no softmax scores"):
        run_with_cache(model, torch.arange(5), ["blocks.0.attn.hook_attn_scores"])
    with pytest.raises(UserError, match="can be read, not written"), hooks(
            model, [("blocks.0.attn.hook_pattern", lambda p, hook: p * 0)]), torch.no_grad():
        model(torch.arange(5)[None])
