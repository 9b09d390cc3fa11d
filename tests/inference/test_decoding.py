"""prefill and decode_step, the two model calls of decoding, give the logits of a full forward pass (float64)."""

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.inference.decoding import decode_step, left_pad, prefill
from gpt.model.kv_cache import KVCache

OPTIONS = {
    "gpt2": {},
    "gqa+rope": {"n_kv_head": 2, "designs": ["rope"]},
    "mqa+window": {"n_kv_head": 1, "window": 5},  # the ring of 5 slots wraps twice in 16 positions
    "window+rope": {"window": 4, "designs": ["rope"]},
}
KERNELS = ["manual", "einsum", "heads", "sdpa", "flex"]


def float64_model(kernel: str, **options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, attention=kernel, **options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("option", OPTIONS)
def test_decode_steps_after_prefill_give_the_full_forward_logits(kernel, option):
    model = float64_model(kernel, **OPTIONS[option])
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(seq)  # (2, 16, vocab): position t's logits predict token t + 1
    cache = KVCache(model.config, batch_size=2, device="cpu")
    positions = torch.arange(16).expand(2, 16)
    logits = [prefill(model, seq[:, :6], positions[:, :6], None, cache)]
    for t in range(6, 16):
        logits.append(decode_step(model, seq[:, t : t + 1], positions[:, t : t + 1], cache))
    torch.testing.assert_close(torch.stack(logits, dim=1), full[:, 5:], atol=1e-10, rtol=1e-10)
    recomputed = prefill(model, seq[:, :6], positions[:, :6], None, None)  # no cache: the same call
    torch.testing.assert_close(recomputed, full[:, 5], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("option", OPTIONS)
def test_a_left_padded_row_decodes_as_it_would_alone(kernel, option):
    model = float64_model(kernel, **OPTIONS[option])
    seq = torch.randint(0, 50, (2, 14), generator=torch.Generator().manual_seed(2))
    lengths = [3, 7]  # prompt lengths: row 0 is padded by 4 on the left
    idx, key_mask, positions = left_pad([seq[i, :n].tolist() for i, n in enumerate(lengths)], "cpu")
    cache = KVCache(model.config, batch_size=2, device="cpu")
    steps = [prefill(model, idx, positions, key_mask, cache)]
    for s in range(6):
        positions = positions[:, -1:] + 1
        token = torch.stack([seq[i, n + s] for i, n in enumerate(lengths)])[:, None]
        steps.append(decode_step(model, token, positions, cache))
    with torch.no_grad():
        for i, n in enumerate(lengths):
            alone, _ = model(seq[i : i + 1, : n + 6])
            torch.testing.assert_close(torch.stack([s[i] for s in steps]), alone[0, n - 1 :], atol=1e-10, rtol=1e-10)


def sharp_model(seed: int, **options) -> GPT:
    """A float32 model with decisive greedy choices (logits scaled up), so rounding cannot flip a token."""
    torch.manual_seed(seed)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, **options)
    model = GPT(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


def test_the_compiled_fast_path_gives_the_eager_tokens_across_slides_and_padding():
    """The CPU fast path (inductor, guards skipped after each cache's first step) decodes
    the tokens of eager steps and of recomputation: 40 tokens slide a 16-token context (a new cache) four times."""
    from gpt.inference.decoding import compiled_decode_step, generate_batch

    torch._dynamo.reset()
    model = sharp_model(0, window=6)  # a ring of 6 slots, wrapping within every cache
    prompts = [[3, 1, 4, 1, 5], [9, 2]]  # left-padded into one batch
    step = compiled_decode_step()  # the C++ wrapper (cpu_compile_options) calls the same kernels: not compiled here
    fast = generate_batch(model, prompts, 40, temperature=0.0, step=step)
    assert fast == generate_batch(model, prompts, 40, temperature=0.0)
    assert fast == generate_batch(model, prompts, 40, temperature=0.0, kv_cache=False)


def test_skipped_guards_never_run_one_models_compiled_step_for_another():
    """Guards are skipped only after a cache's first (checked) step: two models of different shapes taking turns
    with one compiled step each get their own eager tokens."""
    from torch._dynamo.testing import CompileCounter

    from gpt.inference.decoding import compiled_decode_step, generate

    torch._dynamo.reset()
    counter = CompileCounter()  # Dynamo's guards and graphs, without inductor's compile time
    step = compiled_decode_step(backend=counter)
    models = [sharp_model(1), sharp_model(2, n_kv_head=2, window=5), sharp_model(3)]
    prompt = torch.tensor([[7, 3, 9]])
    for model in [*models, *models]:
        assert torch.equal(generate(model, prompt, 20, temperature=0.0, step=step),
                           generate(model, prompt, 20, temperature=0.0))
    assert counter.frame_count >= 2  # the second shape compiled its own step


def test_a_small_models_steps_run_on_one_thread_its_prefills_on_all(monkeypatch):
    """On a CPU with two threads the default-sized model's one-token steps run on one (step_threads), every prefill
    (each slide's too) on both, and the count is restored after; the tokens are recomputation's. A model whose
    products are large keeps torch's threads in its steps."""
    import gpt.inference.decoding as decoding

    seen: dict[str, list[int]] = {"step": [], "prefill": []}

    def step(model, token, positions, cache):
        seen["step"].append(torch.get_num_threads())
        return decoding.decode_step(model, token, positions, cache)

    model = sharp_model(0)
    model.register_forward_pre_hook(
        lambda module, args: seen["prefill"].append(torch.get_num_threads()) if args[0].size(1) > 1 else None)
    prompt = torch.tensor([[3, 1, 4]])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tokens = decoding.generate(model, prompt, 30, temperature=0.0, step=step)  # slides past block_size 16
        assert set(seen["step"]) == {1} and len(seen["prefill"]) >= 2 and set(seen["prefill"]) == {2}
        assert torch.get_num_threads() == 2
        assert torch.equal(tokens, decoding.generate(model, prompt, 30, temperature=0.0, kv_cache=False))
        seen["step"].clear()
        monkeypatch.setattr(decoding, "SMALL_STEP", 1)  # every product counts as large
        decoding.generate(model, prompt, 5, temperature=0.0, step=step)
        assert set(seen["step"]) == {2}
    finally:
        torch.set_num_threads(before)
