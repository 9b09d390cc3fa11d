"""Attention maps: record_attention records the weights the model really uses, for every kernel and option."""

import pytest
import torch

from conftest import run_inline, run_script, save_char_model
from gpt import GPT, GPTConfig
from gpt.inference.visualize import attention_maps
from gpt.kernels.recording import record_attention

OPTIONS = [{}, {"n_kv_head": 2, "window": 3, "designs": ["rope"]}]


@pytest.mark.parametrize("kernel", ["manual", "sdpa", "heads"])
@pytest.mark.parametrize("options", OPTIONS)
def test_recording_leaves_outputs_unchanged_and_records_every_layer(kernel, options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=40, attention=kernel, **options))
    model.eval()
    idx = torch.randint(0, 40, (2, 12))
    expected, _ = model(idx)
    with record_attention(model) as maps:
        logits, _ = model(idx)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert len(maps) == 3 and maps[0].shape == (2, 4, 12, 12)
    assert model.transformer.h[0].attn.kernel.__name__ == kernel  # the original kernel is back
    weights = maps[1]
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 12))
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # causal
    if options.get("window"):
        assert torch.equal(weights.tril(-3), torch.zeros_like(weights))  # only the last 3 positions


def test_attention_maps_shape():
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=10))
    model.train()
    maps = attention_maps(model, torch.zeros(1, 5, dtype=torch.long))
    assert maps.shape == (2, 2, 5, 5) and model.training  # training mode restored


@pytest.mark.slow
def test_visualize_script_writes_a_png(tmp_path):
    save_char_model(tmp_path / "ckpt.pt", "\nabcdef ():", n_layer=2, n_head=2, n_embd=16, block_size=16)
    out = tmp_path / "maps.png"
    result = run_script("visualize_attention", f"ckpt={tmp_path}", "prompt=abc def", f"out={out}", "device=cpu")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_inline("visualize_attention", f"ckpt={tmp_path}", "prompt=abc", "layer=5", f"out={out}", "device=cpu")
    assert bad.returncode == 2 and "layer=5 is out of range" in bad.stderr and "Traceback" not in bad.stderr
