"""Perplexity and bits per byte beside the val loss during training: the estimate from meta.json's counts, and the
multirun table's columns."""

import math

import pytest

from gpt.train.evaluate import val_metrics
from gpt.train.sweep import table


def test_bits_per_byte_scales_the_loss_by_the_splits_tokens_per_byte():
    metrics = val_metrics(1.5, {"tokens": 1000, "bytes": 4200, "documents": 3})
    assert metrics["ppl"] == pytest.approx(math.exp(1.5))
    assert metrics["bpb"] == pytest.approx(1.5 / math.log(2) * 1000 / 4200)
    assert val_metrics(1.5, {"tokens": 1000})["bpb"] is None  # a meta.json without byte counts


def test_the_multirun_table_shows_val_perplexity_and_bits_per_byte():
    rows = [{"run": "0", "overrides": ["attention=manual"], "final_train_loss": 1.0, "final_val_loss": 1.2,
             "final_val_ppl": math.exp(1.2), "final_val_bpb": 1.7312, "tokens_per_sec": 10.0, "wall_s": 1.0},
            {"run": "1", "overrides": ["attention=sdpa"], "final_train_loss": 1.0, "final_val_loss": 1.3}]
    lines = table(rows).splitlines()
    assert "| val ppl | val bpb |" in lines[0]
    assert "| 3.32    | 1.7312  |" in lines[2] and "| -       | -       |" in lines[3]  # older summaries: no figures
