"""StreamingLLM's sink tokens (gpt/designs/stream.py, model.design_options.stream.sinks): a logit depends on its
window and the sink
tokens only, the cache keeps the sinks apart from its ring, and the runtime choice is refused where meaningless."""

import pytest
import torch

from conftest import perturbed_model
from gpt import GPTConfig
from gpt.errors import ConfigError, UserError
from gpt.inference.decoding import generate_batch
from gpt.model.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, window=5, designs=["stream"],
            design_options={"stream": {"sinks": 2}})


def test_a_logit_depends_on_its_window_and_the_sink_tokens_only():
    model = perturbed_model({**TINY, "n_layer": 1})  # one layer: position i reads tokens in its window or sinks
    seq = torch.randint(0, 50, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(seq)[0]
        for changed, unchanged_from in ((1, None), (6, 11)):  # a sink token; a token outside every later window
            other = seq.clone()
            other[0, changed] = (other[0, changed] + 1) % 50
            moved = (model(other)[0] - logits).abs().amax(-1)[0]  # (T,) the largest change at each position
            if unchanged_from is None:
                assert (moved[changed:] > 0).all()  # a sink: every later position sees it
            else:
                assert (moved[changed:unchanged_from] > 0).all() and (moved[unchanged_from:] == 0).all()


def test_the_cache_keeps_the_sinks_apart_from_its_ring():
    model = perturbed_model(TINY, sharpen=2.0)
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        for t in range(12):
            model(torch.full((2, 1), t), cache=cache) if t else model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    layer = cache.layers[0]
    assert layer.k.size(2) == 5 and layer.sink_k.size(2) == 2  # a ring of the window, the first two apart
    assert layer.held_bytes() == 2 * 2 * 4 * (5 + 2) * 8 * 4  # k and v, batch 2, 4 heads, 7 slots of 8, fp32


def test_sink_tokens_are_a_runtime_choice_refused_where_they_mean_nothing():
    plain = GPTConfig(**{**TINY, "designs": [], "design_options": {}})
    assert plain.shape_differences(GPTConfig(**TINY)) == []  # no parameter: a window model may sample with sinks
    assert plain.with_runtime_of(GPTConfig(**TINY)) == GPTConfig(**TINY)
    for options, message in ((dict(window=None), "needs a sliding window"),
                             (dict(design_options={"stream": {"sinks": -1}}), "sinks must be a positive integer"),
                             (dict(designs=["stream", "alibi"]), "names alibi and stream, which cannot be combined"),
                             (dict(designs=["stream", "mla"]), "names mla and stream, which cannot be combined")):
        with pytest.raises(ConfigError, match=message):
            GPTConfig(**{**TINY, **options})
    with pytest.raises(UserError, match="cannot decode a batch of prompts of different lengths"):
        generate_batch(perturbed_model(TINY), [[1, 2, 3], [4]], 4, temperature=0.0, kv_cache=True)
