"""docs/probes.md's short convolution (a design file a user brings, Zoology's short convolution before the mixer):
it starts as the model without it, it is causal, a key does read the token before it once the filter does, it
combines with linear attention, it refuses the KV cache and a bad kernel size in one line each."""

import re

import pytest
import torch

from conftest import ROOT
from gpt.designs import loading
from gpt.errors import ConfigError
from gpt.model import design as registry
from gpt.model.config import ModelConfig
from gpt.model.gpt import GPT
from gpt.model.kv_cache import KVCache


def short_conv(folder):
    """The docs' file, loaded as designs=[short_conv.py] loads it (once per process)."""
    if "short_conv" not in registry.available():
        text = (ROOT / "docs" / "probes.md").read_text()
        code = re.search(r"^```python file=short_conv\.py\n(.*?)^```$", text, flags=re.S | re.M).group(1)
        (folder / "short_conv.py").write_text(code)
        loading.load(str(folder / "short_conv.py"))
    return registry.get("short_conv")


def model(designs, **options):
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=12, designs=designs,
                         design_options={"short_conv": options} if options else {}).build(32)
    return GPT(config).eval()


def test_it_starts_as_the_model_without_it_is_causal_and_a_key_reads_the_token_before_it(tmp_path):
    short_conv(tmp_path)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for base in ([], ["linear"]):  # identity filters, no RNG drawn: the same weights, the same logits
            torch.testing.assert_close(model(base + ["short_conv"])(idx)[0], model(base)(idx)[0], rtol=0, atol=0)
        conv = model(["short_conv"])
        for block in conv.transformer.h:
            torch.nn.init.normal_(block.attn.k_conv, generator=torch.Generator().manual_seed(2))
            torch.nn.init.normal_(block.attn.q_conv, generator=torch.Generator().manual_seed(3))
        changed = idx.clone()
        changed[:, 6] = (idx[:, 6] + 1) % 32
        before, after = conv(idx)[0], conv(changed)[0]
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=0)  # nothing before position 6 moves
    assert (before[:, 6:] - after[:, 6:]).abs().amax() > 1e-3
    layer, x = conv.transformer.h[0].attn, torch.randn(1, 2, 5, 8)
    q, k = short_conv(tmp_path).qk(layer, x, x, None)
    w = layer.k_conv.detach()  # (H, D, 3): a key at t is w[..., 0] x[t-2] + w[..., 1] x[t-1] + w[..., 2] x[t]
    torch.testing.assert_close(k[:, :, 4], w[..., 2] * x[:, :, 4] + w[..., 1] * x[:, :, 3] + w[..., 0] * x[:, :, 2])
    torch.testing.assert_close(k[:, :, 0], (w[..., 2] * x[:, :, 0]))  # zeros before the first token


def test_it_refuses_the_kv_cache_and_a_bad_kernel_size(tmp_path):
    short_conv(tmp_path)
    with pytest.raises(ConfigError, match="kernel must be an integer from 1 to 16, got 0"):
        model(["short_conv"], kernel=0)
    conv = model(["short_conv"], kernel=2)
    assert conv.transformer.h[0].attn.k_conv.shape == (2, 8, 2)
    with pytest.raises(Exception, match="short_conv mixes each key with the K-1 before it"):
        conv(torch.zeros(1, 3, dtype=torch.long), cache=KVCache(conv.config, 1, "cpu"))
