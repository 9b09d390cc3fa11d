"""Checkpoints and exports written before the attention designs became modules (tests/fixtures/designs, made by
its make.py at main cc5e053) load with today's code and give the very logits they gave then, and a freshly seeded
model of each design still starts from the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.weights.load import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "designs"
EXPECTED = torch.load(FIXTURES / "expected.pt", weights_only=True)
SOURCES = {  # what a user points ckpt= at -> the design whose logits it must give
    **{f"{name}.pt": name for name in EXPECTED["designs"]},
    "mla_sharded": "mla",
    "gpt2_hf": "gpt2",
    "diff_rope_qk_norm_mqa_native": "diff_rope_qk_norm_mqa",
}


@pytest.mark.parametrize("source", SOURCES)
def test_an_old_checkpoint_or_export_gives_the_same_logits(source):
    model, _ = load_model(FIXTURES / source)
    with torch.no_grad():
        logits, _ = model(EXPECTED["inputs"])
    assert torch.equal(logits, EXPECTED["designs"][SOURCES[source]]["logits"])


@pytest.mark.parametrize("design", EXPECTED["designs"])
def test_a_freshly_seeded_model_starts_from_the_same_weights(design):
    saved = EXPECTED["designs"][design]
    torch.manual_seed(0)
    state = GPT(GPTConfig.from_dict(saved["config"])).state_dict()
    assert {name: t.double().sum().item() for name, t in state.items()} == saved["init_sums"]
