"""LoRA through peft on every registered design (the built-in ones and docs/designs.md's talking heads, brought from
a file): adapters on each block's attention and MLP projections found by module type, merged logits equal to the
adapted model's, only adapters (and added tokens' rows) training, and a LoRA chat run resuming bit for bit with a
small adapter file beside its merged checkpoint."""

from __future__ import annotations

import pytest
import torch
from test_chat_data import CHARS, save_base, sft
from test_designs import ONE_CASE, model_for
from torch import nn

from gpt.errors import UserError
from gpt.model import MLP, Block, CausalSelfAttention
from gpt.weights import lora


@pytest.mark.parametrize("design, settings, kernel", ONE_CASE)
def test_adapters_on_every_projection_merge_into_the_same_logits(design, settings, kernel):
    model = model_for(settings, kernel).eval()
    targets = lora.target_modules(model)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for i, block in enumerate(blocks):  # every linear layer of each block's attention and MLP, nothing else
        for part in ("attn", "mlp"):
            mine = {t for t in targets if t.startswith(f"transformer.h.{i}.{part}.")}
            module = getattr(block, part)
            assert isinstance(module, (CausalSelfAttention, MLP))
            assert len(mine) == sum(isinstance(m, nn.Linear) for m in module.modules()) > 0
    x = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    with torch.no_grad():
        before = model(x)[0]
        lora.add_adapters(model, rank=4, alpha=8.0, dropout=0.0)
        assert torch.equal(model(x)[0], before)  # B = 0: the adapted model starts as the base model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)  # B starts at zero: make every adapter change the output
        adapted = model(x)[0]
        merged = lora.merge(model).eval()
        assert not any("lora" in n for n in merged.state_dict())
        torch.testing.assert_close(merged(x)[0], adapted, atol=1e-5, rtol=1e-5)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {n for n, _ in model.named_parameters()
                                                                          if "lora_" in n}


def test_a_lora_chat_run_trains_only_adapters_and_resumes_bit_for_bit(tmp_path):
    save_base(tmp_path / "base.pt")
    opts = ("chat.lora_rank=4", "train.eval_interval=2")
    straight = sft(tmp_path, "straight", "train.max_iters=4", *opts)
    sft(tmp_path, "halves", "train.max_iters=2", *opts)
    halves = sft(tmp_path, "halves", "train.max_iters=4", "resume=true", *opts)
    a, b = (torch.load(run / "ckpt.pt", weights_only=True) for run in (straight, halves))
    assert a["step"] == b["step"] == 4
    assert all(torch.equal(a["adapter"][k], b["adapter"][k]) for k in a["adapter"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    base = torch.load(tmp_path / "base.pt", weights_only=True)["model"]
    merged = a["model"]
    for key, value in base.items():  # projections moved; layer norms, positions and old token rows did not
        if key.endswith(("c_attn.weight", "c_fc.weight", "c_proj.weight")):
            assert not torch.equal(merged[key], value), key
        elif key in lora.ROWS:
            assert torch.equal(merged[key][: len(CHARS)], value)
        else:
            assert torch.equal(merged[key], value), key
    rows = a["adapter"]["transformer.wte.weight.rows"]
    assert rows.shape == (2, 32) and not torch.equal(rows[0], rows[1])  # the chat tokens' rows trained apart
    adapter = torch.load(straight / "adapter.pt", weights_only=True)
    assert adapter["tokenizer"]["chat_template"] and set(adapter["adapter"]) == set(a["adapter"])
    assert (straight / "adapter.pt").stat().st_size < (straight / "ckpt.pt").stat().st_size / 3
    with pytest.raises(UserError, match="trained with LoRA adapters, this run has none"):
        sft(tmp_path, "halves", "train.max_iters=6", "resume=true", "train.eval_interval=2")

