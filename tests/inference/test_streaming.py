"""Streaming past the context (StreamingLLM): a RoPE model whose cache is a window's ring, with sink tokens or not,
decodes past block_size without sliding, in constant memory, with positions numbered inside the cache as the paper
does (the sinks the ring dropped 0.., then the ring's tokens, the new one last): each step equals a float64
reference of exactly that, and a one-layer model's equals its own forward over the cache's tokens at those
positions; the server's pool does the same per row (tests/serve/test_engine.py)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from conftest import perturbed_model
from gpt.designs import reference
from gpt.inference.decoding import compiled_decode_step, decode_step, prefill, stream
from gpt.inference.generate import streaming
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.model.kv_cache import KVCache, endless

SHAPE = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11, designs=["rope"])
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
CASES = {  # window 6 over block_size 16; 40 tokens: 2.5 times block_size, the sinks far past the window
    "window": {},
    "sinks": dict(designs=["rope", "stream"], design_options={"stream": {"sinks": 2}}),
    "gqa+qk_norm+yarn+sinks": dict(designs=["rope", "qk_norm", "stream"], n_kv_head=1,
                                   design_options={"stream": {"sinks": 3}, "rope": {"scaling": YARN}}),
}


def sinks_of(config: GPTConfig) -> int:
    return config.design_options["stream"]["sinks"] if "stream" in config.designs else 0


def held_tokens(config: GPTConfig, i: int) -> list[int]:
    """What the cache holds when token i is decoded, in sequence order: the sinks the window dropped, the window."""
    first = max(0, i - config.window + 1)
    return list(range(min(sinks_of(config), first))) + list(range(first, i + 1))


@torch.no_grad()
def reference_stream(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """Float64 logits (T, vocab) of decoding ids (1, T) one token at a time as StreamingLLM does: each layer's query
    attends to held_tokens, the key of the n-th of them turned at position n (the query at the last), from every
    token's un-rotated key and value at that layer (gpt.designs.reference's pieces; norms and MLPs the model's, in
    float64)."""
    m, config = copy.deepcopy(model).double(), model.config
    kept: list[list] = [[] for _ in m.transformer.h]  # per layer: every token's (k (Hkv, D), v (Hkv, D))
    logits = []
    for i in range(ids.size(1)):
        x, held = m.transformer.wte(ids[:, i:i + 1]), held_tokens(config, i)
        for block, kv in zip(m.transformer.h, kept):
            attn, h = block.attn, block.ln_1(x)
            q, k, v = reference.heads(attn, h, config)
            kv.append((k[0, 0], v[0, 0]))
            y = torch.zeros_like(q)
            for _, head, group, _ in reference.queries(config, h):
                query = reference.transformed(attn, config, q[0, 0, head], len(held) - 1, "q")
                s = torch.stack([reference.transformed(attn, config, kv[j][0][group], n, "k") @ query
                                 for n, j in enumerate(held)]) / math.sqrt(q.size(-1))
                values = torch.stack([kv[j][1][group] for j in held])
                y[0, 0, head] = reference.softmax(attn, config, s, i, held, head, values)
            x = x + reference.output(attn, config, h, y)
            x = x + block.mlp(block.ln_2(x))
        logits.append(m.lm_head(m.transformer.ln_f(x))[0, 0])
    return torch.stack(logits)


def decoded(model: GPT, ids: torch.Tensor, prompt: int = 3) -> tuple[torch.Tensor, set]:
    """Logits (T - prompt + 1, vocab) of a prompt prefilled, then one decoding step a token; the cache's bytes."""
    cache = KVCache(model.config, 1, "cpu")
    steps, held = [prefill(model, ids[:, :prompt], torch.arange(prompt)[None], None, cache)], set()
    for t in range(prompt, ids.size(1)):
        steps.append(decode_step(model, ids[:, t:t + 1], torch.tensor([[t]]), cache))
        held.add(cache.held_bytes())
    assert endless(model.config) and cache.length == ids.size(1)
    return torch.cat(steps), held


@pytest.mark.parametrize("case", list(CASES))
def test_each_decoding_step_equals_the_float64_reference_numbered_inside_the_cache(case):
    model = perturbed_model({**SHAPE, **CASES[case], "window": 6}, sharpen=2.0)
    ids = torch.randint(0, 11, (1, 40), generator=torch.Generator().manual_seed(1))
    got, held = decoded(model, ids)
    torch.testing.assert_close(got.double(), reference_stream(model, ids)[2:], atol=2e-5, rtol=0)
    c = model.config
    assert held == {c.n_layer * 2 * c.n_kv_head * (6 + sinks_of(c)) * c.head_dim * 4}  # ring and sinks, fp32
    with torch.no_grad():  # the sinks at their own positions (the full forward's numbering) would differ
        full = model(ids[:, :-1], positions=torch.arange(39)[None])[0][0, 2:]
    gap = (got[:-1] - full).abs().amax()
    assert gap > 1e-3 if sinks_of(c) else gap < 1e-5


@pytest.mark.parametrize("case", list(CASES))
def test_a_one_layer_models_step_is_its_forward_over_the_cache_tokens_at_their_cache_positions(case):
    """One layer: a key depends on its token alone, so the step's logits are the model's own forward (no window, no
    sinks) over held_tokens at positions 0.. ."""
    model = perturbed_model({**SHAPE, **CASES[case], "window": 6, "n_layer": 1}, sharpen=2.0)
    config = model.config
    plain = streaming(model, model.config.block_size, 0)  # the same weights, every key kept
    ids = torch.randint(0, 11, (1, 40), generator=torch.Generator().manual_seed(2))
    got, _ = decoded(model, ids)
    with torch.no_grad():
        for i in range(2, 40):
            held = held_tokens(config, i)
            want = plain(ids[:, held], positions=torch.arange(len(held))[None])[0][0, -1]
            torch.testing.assert_close(got[i - 2], want, atol=1e-5, rtol=0, msg=f"token {i}")


LAYOUT = {"layers": "SL", "layer_kinds": {"S": {"window": 4}, "L": {"options": {"rope": {"base": 500.0}}}}}


@pytest.mark.parametrize("settings", [{"designs": ["diff", "rope"]}, LAYOUT])
def test_without_sinks_the_numbering_inside_the_cache_changes_no_distance(settings):
    """A window alone: a key's distance to the query is the same numbered inside the cache as in the sequence, so
    each step equals the full forward with the window's mask: for a layer that turns each half of its heads by
    itself (differential attention), and for a layout whose kinds have windows and RoPE bases of their own."""
    model = perturbed_model({**SHAPE, "window": 6, **settings}, sharpen=2.0)
    ids = torch.randint(0, 11, (1, 40), generator=torch.Generator().manual_seed(4))
    got, _ = decoded(model, ids)
    with torch.no_grad():
        full = model(ids[:, :-1], positions=torch.arange(39)[None])[0][0, 2:]
    torch.testing.assert_close(got[:-1], full, atol=1e-5, rtol=0)


def test_a_compiled_step_reads_every_slot_and_equals_the_eager_one():
    """torch.compile's fixed-shape step (every sink and ring slot, a mask of the real ones, the index a tensor)
    numbers positions as the eager step does."""
    model = perturbed_model({**SHAPE, **CASES["gqa+qk_norm+yarn+sinks"], "window": 6}, sharpen=2.0)
    ids = torch.randint(0, 11, (1, 30), generator=torch.Generator().manual_seed(3))
    want, _ = decoded(model, ids)
    step, cache = compiled_decode_step(backend="eager"), KVCache(model.config, 1, "cpu")
    got = [prefill(model, ids[:, :3], torch.arange(3)[None], None, cache)]
    got += [step(model, ids[:, t:t + 1], torch.tensor([[t]]), cache) for t in range(3, 30)]
    torch.testing.assert_close(torch.cat(got), want, atol=1e-5, rtol=0)


def test_greedy_streaming_never_slides_and_follows_the_reference():
    """stream() with this run's window and sinks (generate.py's window= and sinks=) over a model trained
    without them: 48 tokens from a 3-token prompt, each the argmax of the float64 reference's logits."""
    trained = perturbed_model(SHAPE, sharpen=3.0)
    model = streaming(trained, 6, 2)
    assert model.config.window == 6 and model.config.design_options["stream"] == {"sinks": 2}
    assert not endless(trained.config)
    prompt = torch.tensor([[1, 2, 3]])
    tokens = torch.cat([prompt, *stream(model, prompt, 48, temperature=0)], dim=1)
    assert torch.equal(reference_stream(model, tokens[:, :-1])[2:].argmax(-1), tokens[0, 3:])


def test_a_model_with_learned_positions_or_no_window_still_slides():
    assert not endless(GPTConfig(**{**SHAPE, "designs": []}, window=6))
    assert not endless(GPTConfig(**SHAPE))
    assert not endless(GPTConfig(**SHAPE, window=16))  # a window as long as the context keeps no ring
