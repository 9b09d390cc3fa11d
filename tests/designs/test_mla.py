"""Multi-head latent attention (gpt/designs/mla.py): the paper's projections and shapes, a KV cache that keeps only
the latent and the shared rotated key (smaller by the formula), and what it cannot combine with refused by name."""

import pytest
import torch

from conftest import perturbed_model
from gpt import GPT, GPTConfig
from gpt.designs.mla import LatentKV
from gpt.errors import ConfigError
from gpt.model.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, designs=["mla"],
            design_options={"mla": {"latent": 12}})  # head_dim 8, d_R 4


def test_the_projections_have_readable_names_and_the_paper_s_shapes():
    model = GPT(GPTConfig(**TINY))
    assert model.config.design_options["mla"]["rope_dim"] == 4  # None: head_dim / 2
    shapes = {n.removeprefix("transformer.h.0.attn."): tuple(p.shape) for n, p in model.named_parameters()
              if n.startswith("transformer.h.0.attn.") and n.endswith("weight")}
    assert shapes == {"query.weight": (32, 32), "q_rope.weight": (16, 32), "kv_down.weight": (12, 32),
                      "k_up.weight": (32, 12), "v_up.weight": (32, 12), "k_rope.weight": (4, 32),
                      "c_proj.weight": (32, 32)}
    assert "transformer.wpe.weight" in model.state_dict()  # learned absolute positions stay (GPT-2's table)
    widths = [GPTConfig(**{**TINY, "n_embd": c}).design_options["mla"]["rope_dim"] for c in (48, 24, 8)]
    assert widths == [6, 2, 2]  # even, at least 2


@pytest.mark.parametrize("window", [None, 5])  # a window: the latents sit in a ring of 5 slots
def test_the_cache_keeps_the_latent_and_the_shared_rotated_key(window):
    model = perturbed_model(TINY | dict(window=window), sharpen=2.0)
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 7)), cache=cache)
    layer, slots = cache.layers[0], window or 16
    assert isinstance(layer, LatentKV) and layer.c.shape == (2, slots, 12) and layer.k_rope.shape == (2, slots, 4)
    assert layer.held_bytes() == 2 * slots * (12 + 4) * 4  # (d_c + d_R) fp32 numbers per token


def test_kv_bytes_per_token_shrink_by_the_formula():
    from gpt.arena.arena import kv_bytes_per_token

    config = dict(n_layer=3, n_head=4, n_embd=64, block_size=16, vocab_size=50)  # head_dim 16
    assert kv_bytes_per_token(GPT(GPTConfig(**config)).eval(), "cpu") == 2 * 4 * 16 * 3 * 4  # 2 x nh x hs x L x 4
    mla = GPTConfig(**config, designs=["mla"], design_options={"mla": {"latent": 20}})
    latent = kv_bytes_per_token(GPT(mla).eval(), "cpu")
    assert latent == (20 + 8) * 3 * 4  # (d_c + d_R) x layers x 4 bytes: 336 instead of 1536


def mla(**settings):
    return dict(design_options={"mla": {"latent": 12, **settings}})


@pytest.mark.parametrize("options, message", [
    (mla(latent=0), "model.design_options.mla.latent must be a positive integer, got 0"),
    (mla(latent=True), "model.design_options.mla.latent must be a positive integer, got True"),
    (mla(rope_dim=3), "model.design_options.mla.rope_dim must be a positive even integer, got 3"),
    (mla(rope_dim=0), "model.design_options.mla.rope_dim must be a positive even integer, got 0"),
    (dict(designs=[], design_options=mla()["design_options"]), "model.design_options.mla is given but mla is not in"),
    (dict(designs=["mla", "rope"]), "model.designs names rope and mla, which cannot be combined: MLA applies"),
    (dict(designs=["mla", "alibi"]), "model.designs names alibi and mla, which cannot be combined"),
    (dict(n_kv_head=2), "cannot be combined with model.n_kv_head=2: every head's keys and values come from"),
    (dict(designs=["mla", "qk_norm"]), "model.designs names qk_norm and mla, which cannot be combined"),
    (dict(designs=["mla", "diff"]), "model.designs names diff and mla, which cannot be combined"),
    (dict(designs=["mla", "linear"]), "model.designs names linear and mla, which cannot be combined"),
])
def test_what_latent_attention_cannot_have_is_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GPTConfig(**{**TINY, **options})
    assert "\n" not in str(caught.value) and caught.value.hint
