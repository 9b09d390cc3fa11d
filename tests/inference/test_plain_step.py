"""PlainStep, GPT-2's layers as straight tensor calls for one-token steps: the general step's logits bit for bit, the
cache advanced the same way, and the general step wherever it does not copy the model exactly."""

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.inference import decoding
from gpt.inference.decoding import decode_step, generate, generate_batch, prefill
from gpt.inference.plain_step import PlainStep, plain, plain_step
from gpt.inference.weight_layout import decode_layout, gemv_layout, onednn_available, packed_forward
from gpt.model.kv_cache import KVCache

BASE = dict(n_layer=2, n_head=4, n_embd=64, block_size=16, vocab_size=97, dropout=0.0, bias=True)
PLAIN = {
    "gpt2": {},
    "gqa": {"n_kv_head": 2},
    "rmsnorm, no bias": {"norm": "rmsnorm", "bias": False},
    "attention only": {"mlp": False},
    "untied head, relu2": {"tie_head": False, "activation": "relu2"},
    "gpt2 width": {"n_layer": 1, "n_embd": 768, "n_head": 12, "vocab_size": 300},
    "bf16": {"dtype": torch.bfloat16},
    "float64": {"dtype": torch.float64},
}


def model_of(dtype: torch.dtype = torch.float32, **options) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**BASE, **options})).to(dtype).eval()
    gemv_layout(model)  # as the generate command stores the weights
    return model


def two_caches(model: GPT, rows: int) -> tuple[KVCache, KVCache, torch.Tensor, torch.Tensor]:
    """Two caches prefilled with the same 5-token prompts; the next tokens and the prompts' last positions."""
    prompt = torch.randint(0, 97, (rows, 5), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(5).expand(rows, 5)
    caches = KVCache(model.config, rows, "cpu"), KVCache(model.config, rows, "cpu")
    logits = [prefill(model, prompt, positions, None, cache) for cache in caches]
    return *caches, logits[0].argmax(-1, keepdim=True), positions[:, -1:]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("option", PLAIN)
def test_plain_steps_give_the_general_steps_logits_bit_for_bit(option, rows):
    model = model_of(**PLAIN[option])
    step = plain_step(model, decode_step)
    assert isinstance(step, PlainStep)
    general, fast, token, positions = two_caches(model, rows)
    for _ in range(10):  # up to block_size - 1
        positions = positions + 1
        expected, got = decode_step(model, token, positions, general), step(model, token, positions, fast)
        assert torch.equal(got, expected)
        token = expected.argmax(-1, keepdim=True)
    for a, b in zip(general.layers, fast.layers):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    ga, fa = general.slots[None], fast.slots[None]
    assert ga.length == fa.length == 15 and torch.equal(ga.key_mask, fa.key_mask)
    with pytest.raises(ValueError, match="KV cache overflow"):  # the general step's refusal at block_size
        for _ in range(2):
            positions = positions + 1
            step(model, token, positions, fast)


def test_a_grad_enabled_caller_gets_no_graph():
    model = model_of()
    general, fast, token, positions = two_caches(model, 1)
    with torch.enable_grad():
        logits = plain_step(model, decode_step)(model, token, positions + 1, fast)
    assert not logits.requires_grad
    assert torch.equal(logits, decode_step(model, token, positions + 1, general))


@pytest.mark.parametrize("option", [{"designs": ["rope"]}, {"attention": "manual"}, {"layers": "SL",
                         "layer_kinds": {"S": {"window": 8}, "L": {}}}], ids=["a design", "another kernel", "a layout"])
def test_what_it_does_not_copy_keeps_the_general_step(option):
    assert not plain(model_of(**option))
    hooked = model_of()
    assert plain(hooked)
    hooked.transformer.h[1].attn.hook_q.add(lambda q, hook: q * 2)  # gpt.interpret's way in
    assert not plain(hooked)
    assert not plain(model_of().train())


def test_a_padded_batch_or_a_ring_falls_back_to_the_general_step(monkeypatch):
    calls, original = [], PlainStep._block
    monkeypatch.setattr(PlainStep, "_block", lambda *args: calls.append(1) or original(*args))
    for model, prompts in [(model_of(), [[1, 2, 3], [4, 5, 6, 7, 8]]), (model_of(window=5), [[1, 2, 3]] * 2)]:
        fast = generate_batch(model, prompts, 12, temperature=0.0)
        slow = generate_batch(model, prompts, 12, temperature=0.0, kv_cache=False)
        assert fast == slow
    assert not calls


def test_stream_decodes_a_plain_model_with_it_to_the_recomputed_tokens(monkeypatch):
    model = model_of()
    steps = []
    original = PlainStep.__call__
    monkeypatch.setattr(PlainStep, "__call__", lambda self, *args: steps.append(1) or original(self, *args))
    prompt = torch.randint(0, 97, (1, 3), generator=torch.Generator().manual_seed(3))
    def sampled(kv_cache: bool) -> torch.Tensor:  # drawn, not greedy: a random model's greedy tokens repeat one
        return generate(model, prompt, 40, generator=torch.Generator().manual_seed(4), kv_cache=kv_cache)

    cached = sampled(True)  # slides past block_size 16 three times
    assert len(steps) >= 30 and len(set(cached[0].tolist())) > 10
    assert torch.equal(cached, sampled(False))
    assert decoding.decode_step is decode_step  # the general step itself is untouched


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN prepacked linear")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3])
def test_with_linears_packed_for_onednn_plain_steps_still_give_the_general_steps_logits(rows, threads):
    """A model loaded as the generate command loads it at 2 threads (decode_layout: its large Linears packed for
    oneDNN): the straight-call step calls their packed forwards, so its logits stay the general step's bit for bit,
    at 2 threads (one row through oneDNN) and at 1 (one row through MKL's gemv, more through oneDNN)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model = model_of(**PLAIN["gpt2 width"])
        decode_layout(model)
        assert packed_forward(model.transformer.h[0].mlp.c_fc) is not None
        torch.set_num_threads(threads)
        step = plain_step(model, decode_step)
        general, fast, token, positions = two_caches(model, rows)
        for _ in range(6):
            positions = positions + 1
            expected, got = decode_step(model, token, positions, general), step(model, token, positions, fast)
            assert torch.equal(got, expected)
            token = expected.argmax(-1, keepdim=True)
    finally:
        torch.set_num_threads(before)
