"""attention=flex compiles one flex_attention for every kind of call (issue 30: on a GPU it recompiled as
evaluation under no_grad alternated with training and sampling, reached torch's recompile limit and fell back to
the unfused path). Checked on a CPU through the kernel's compiled path, with torch.compile's "eager" backend: the
same Dynamo guards and recompilations as on a GPU, without generating code."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from gpt import GPT, GPTConfig
from gpt.inference.decoding import generate, generate_batch
from gpt.kernels import flex


@pytest.fixture
def compiled_flex_on_cpu(monkeypatch):
    monkeypatch.setattr(flex, "COMPILED_ON", ("cuda", "cpu"))
    monkeypatch.setattr(flex, "COMPILER", "eager")
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def variants(fn) -> int:
    """How many compiled variants Dynamo keeps for ``fn`` (torch falls back to eager past its recompile limit, 8)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(fn.__code__))


def what_training_does(model: GPT, x: torch.Tensor, window_model: GPT) -> None:
    """One round of what a training run asks of attention: an evaluation (no_grad, eval mode), training forwards
    (grad mode; on a CPU nothing may require grad), then samples: prompts of two lengths, decode steps past
    block_size (the context slides), a padded batch and a sliding window."""
    model.eval()
    with torch.no_grad():
        model(x, x)
    model.train()
    model(x, x)
    model(x, x)
    model.eval()
    generate(model, torch.zeros(1, 1, dtype=torch.long), 18, temperature=0.0)
    generate(model, x[:1, :5], 4, temperature=0.0)
    generate_batch(model, [[1, 2, 3], [4, 5, 6, 7, 8]], 4, temperature=0.0)
    generate(window_model, x[:1, :5], 4, temperature=0.0)


def test_one_compiled_flex_serves_evaluation_training_and_sampling_without_recompiling(compiled_flex_on_cpu):
    torch.manual_seed(0)
    sizes = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50, attention="flex")
    model, window_model = GPT(GPTConfig(**sizes)), GPT(GPTConfig(**sizes, window=4))
    for p in (*model.parameters(), *window_model.parameters()):
        p.requires_grad_(False)  # flex has no backward on a CPU
    x = torch.randint(0, 50, (4, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # torch's fallback to the unfused path warns
        what_training_does(model, x, window_model)
        first = graphs()
        full, cached = variants(flex.flex_full), variants(flex.flex_cached)
        assert 0 < full <= 5 and 0 < cached <= 4, (full, cached)  # within torch's recompile limit of 8 each
        what_training_does(model, x, window_model)
    assert graphs() == first, "the second round recompiled"
    for grad in (True, False, True):  # the grad mode alone never makes a variant
        with torch.set_grad_enabled(grad):
            model(x, x)
    assert graphs() == first


def test_flex_on_a_cpu_stays_eager_and_refuses_to_train():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="no backward pass on CPU"):
        flex.flex(q, q, q)
    with torch.no_grad():
        assert flex.flex(q, q, q).shape == (1, 2, 4, 8)


def test_grouped_heads_run_whole_sequences_on_the_main_kernel(compiled_flex_on_cpu, monkeypatch):
    """One key/value head for 4 query heads, 64 tokens, no gradients: inductor's decoding kernel would pack
    4 x 64 rows into one 128-row query block and fail to compile (mqa x flex on an H200); whole sequences ask
    for the main kernel, decode steps keep the decoding kernel."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_head=4, n_kv_head=1, n_embd=64, block_size=64, vocab_size=50, attention="flex")
    model = GPT(config).eval()
    x = torch.randint(0, 50, (2, 64))
    with torch.no_grad():
        monkeypatch.setattr(flex, "COMPILED_ON", ())
        reference, _ = model(x, x)  # eager
    monkeypatch.setattr(flex, "COMPILED_ON", ("cuda", "cpu"))
    seen, real = [], flex.flex_attention

    def spy(q, k, v, **kwargs):
        seen.append((q.size(-2), kwargs.get("kernel_options")))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(flex, "flex_attention", spy)
    with torch.no_grad():
        logits, _ = model(x, x)
        generate(model, x[:1, :5], 2, temperature=0.0)
    torch.testing.assert_close(logits, reference)
    assert {(t > 1, str(options)) for t, options in seen} == {
        (True, "{'FORCE_USE_FLEX_ATTENTION': True}"), (False, "None")}, seen
