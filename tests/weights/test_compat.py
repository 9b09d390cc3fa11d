"""Checkpoints and exports written before the attention designs became modules (tests/fixtures/designs, made by
its make.py at main cc5e053) load with today's code and give the very logits they gave then, and a freshly seeded
model of each design still starts from the same weights.

The logits were recorded on one environment (fixtures/designs/environment.json: torch's version and build, the CPU's
vendor and SIMD level): there they must come back bit for bit, elsewhere within TOLERANCE (conftest.check_recorded,
as the golden trace does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import check_recorded
from gpt import GPT, GPTConfig
from gpt.weights.load import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "designs"
EXPECTED = torch.load(FIXTURES / "expected.pt", weights_only=True)
RECORDED_ON = json.loads((FIXTURES / "environment.json").read_text())["environment"]
# Elsewhere: the largest logit difference within this fraction of the largest |logit|. Measured on an AMD EPYC
# (2026-11-28) over every source below, torch 2.13.0+cpu and 2.14.1+cu130 alike: 0 at AVX2 (the recording's level),
# 4.4e-7 at AVX512, 5.7e-7 at DEFAULT (no SIMD). 1e-5 is 18x the worst and about 80 float32 roundings of the largest
# logit; small real changes measured there move them 11x more and beyond: LayerNorm's eps 1e-5 -> 1e-4 by 1.1e-4, one
# attention weight x1.001 by 1.8e-4, softcap 2.0 -> 2.02 by 3.2e-3.
TOLERANCE = 1e-5
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
    expected = EXPECTED["designs"][SOURCES[source]]["logits"]
    differs = [] if torch.equal(logits, expected) else ["logits"]
    check_recorded(f"logits of {source}", [(RECORDED_ON, differs, beyond_tolerance(logits, expected))],
                   f"{TOLERANCE} of the largest |logit|")


def beyond_tolerance(logits: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """["logits", with the worst difference] when they differ by more than TOLERANCE of the largest |logit|."""
    worst, largest = (logits - expected).abs().max().item(), expected.abs().max().item()
    if worst <= TOLERANCE * largest:
        return []
    return [f"logits: worst difference {worst:.3g} > {TOLERANCE} x {largest:.3g}"]


@pytest.mark.parametrize("scale, differs", [(1 + 1e-6, False), (1 + 1e-4, True)])
def test_the_tolerance_tells_kernel_noise_from_a_changed_design(scale, differs):
    """What another build's noise does to the largest logit passes; what a changed design does to it fails."""
    expected = EXPECTED["designs"]["gpt2"]["logits"]
    moved = expected.clone()
    moved.view(-1)[expected.abs().argmax()] *= scale
    assert bool(beyond_tolerance(moved, expected)) == differs


@pytest.mark.parametrize("design", EXPECTED["designs"])
def test_a_freshly_seeded_model_starts_from_the_same_weights(design):
    saved = EXPECTED["designs"][design]
    torch.manual_seed(0)
    state = GPT(GPTConfig.from_dict(saved["config"])).state_dict()
    assert {name: t.double().sum().item() for name, t in state.items()} == saved["init_sums"]


def test_only_where_the_numbers_were_recorded_must_they_come_back_bit_for_bit(monkeypatch):
    """The rule this file and the golden trace share (conftest.check_recorded): a difference within the tolerance
    fails on the recording's environment, passes with a warning on another, and one beyond it fails everywhere."""
    import conftest

    recorded = {k: v for k, v in RECORDED_ON.items() if k != "note"}
    monkeypatch.setattr(conftest, "environment", lambda: recorded)
    with pytest.raises(AssertionError, match="differ from what was recorded on this environment"):
        check_recorded("logits", [(RECORDED_ON, ["logits"], [])], "a tolerance")
    check_recorded("logits", [(RECORDED_ON, [], [])], "a tolerance")
    monkeypatch.setattr(conftest, "environment", lambda: {**recorded, "cuda_build": True, "cpu_capability": "AVX512"})
    with pytest.warns(UserWarning, match="compared within a tolerance instead of bit for bit"):
        check_recorded("logits", [(RECORDED_ON, ["logits"], [])], "a tolerance")
    with pytest.raises(AssertionError, match="beyond a tolerance"):
        check_recorded("logits", [(RECORDED_ON, ["logits"], ["logits: 1e-3"])], "a tolerance")
