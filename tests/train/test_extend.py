"""Context extension from weights (gpt/train/extend.py): init_from=<run> with a longer model.block_size and a
model.design_options.rope.scaling fine-tunes on longer windows; what cannot be extended is one error line, nothing
written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import run_forked, run_inline, write_corpus
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.evaluation.positions import loss_by_position
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.weights import checkpoint
from gpt.weights.load import load_model

YARN = "model.design_options.rope.scaling={rope_type: yarn, factor: 4, original_max_position_embeddings: 32}"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[list[str], Path]:
    """The corpus's data overrides and a folder of fresh block-32 checkpoints of its tokenizer: rope.pt, learned.pt,
    alibi.pt."""
    root = tmp_path_factory.mktemp("extend")
    data = DataConfig(name="text", source="path", path=str(write_corpus(root / "corpus")), root=str(root / "data"))
    prepare(data, log=lambda message: None)
    tokenizer = TokenData(Path(data.root) / data.name).tokenizer
    for pos in ("rope", "learned", "alibi"):
        config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=tokenizer.vocab_size,
                           designs=[] if pos == "learned" else [pos])
        checkpoint.save(checkpoint.model_entries(GPT(config).state_dict(), config, tokenizer.to_meta()),
                        root / f"{pos}.pt")
    return ["data=text", f"data.path={data.path}", f"data.root={data.root}", "device=cpu"], root


def refused(base, tmp_path, *args: str) -> str:
    """The one error line a training command stops with; nothing written in its out_dir."""
    data, _ = base
    result = run_inline("train", "model=tiny", "train.max_iters=1", *data, *args, f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "run" / "ckpt.pt").exists()
    return lines[0]


def test_learned_positions_cannot_be_extended(base, tmp_path):
    line = refused(base, tmp_path, f"init_from={base[1] / 'learned.pt'}", "model.block_size=64")
    assert "learned positions" in line and "cannot be extended to model.block_size=64" in line


def test_scaling_a_model_without_rope_is_refused(base, tmp_path):
    line = refused(base, tmp_path, f"init_from={base[1] / 'alibi.pt'}", "model.designs=[rope]",
                   "model.block_size=128", YARN)
    assert "has no RoPE" in line and "model.designs=[alibi]" in line


def test_an_original_length_past_the_trained_one_is_refused(base, tmp_path):
    line = refused(base, tmp_path, f"init_from={base[1] / 'rope.pt'}", "model.designs=[rope]",
                   "model.block_size=128", YARN.replace("embeddings: 32", "embeddings: 64"))
    assert "original_max_position_embeddings=64 is longer than the 32 tokens" in line


def test_an_original_length_past_the_new_block_size_is_refused(base, tmp_path):
    line = refused(base, tmp_path, f"init_from={base[1] / 'rope.pt'}", "model.designs=[rope]",
                   "model.block_size=24", YARN)
    assert "original_max_position_embeddings must be a positive integer at most model.block_size (24)" in line


@pytest.mark.parametrize("factor", ["1", "0.5", "5000"])
def test_a_factor_at_or_below_one_or_absurd_is_refused(base, tmp_path, factor):
    line = refused(base, tmp_path, f"init_from={base[1] / 'rope.pt'}", "model.designs=[rope]",
                   "model.block_size=128", YARN.replace("factor: 4", f"factor: {factor}"))
    assert "factor must be a number above 1 and at most 1024" in line


def test_a_block_size_the_data_cannot_fill_is_refused(base, tmp_path):
    line = refused(base, tmp_path, f"init_from={base[1] / 'rope.pt'}", "model.designs=[rope]",
                   "model.block_size=100000", YARN)
    assert "fewer than block_size + 1 = 100001" in line


@pytest.mark.slow
def test_the_recipe_trains_at_32_then_extends_to_128_with_yarn(base, tmp_path):
    """Train a RoPE model at 32, extend to 128 with YaRN for a few steps: it runs on 128-token windows, its loss
    is finite, its checkpoint holds the new context and scaling, and its loss by position reaches past 32. (Both
    runs in forks of the test: what they train is the point, not their processes.)"""
    data, _ = base
    short = ["model=tiny", "model.designs=[rope]", "train.eval_iters=1", "train.sample_tokens=0",
             "train.batch_size=4", *data]
    first = run_forked("train", *short, "train.max_iters=4", "train.eval_interval=4", f"out_dir={tmp_path / 'base'}")
    assert first.returncode == 0, first.stderr
    second = run_forked("train", *short, "train.max_iters=3", "train.eval_interval=3", "model.block_size=128", YARN,
                        f"init_from={tmp_path / 'base'}", f"out_dir={tmp_path / 'long'}")
    assert second.returncode == 0, second.stderr
    said = second.stdout + second.stderr
    assert "extending the context of init_from" in said and "from 32 to 128 tokens, yarn scaling x4" in said
    assert "x 128 tokens" in (tmp_path / "long" / "train.log").read_text()  # the fine-tune's windows are 128 long
    summary = json.loads((tmp_path / "long" / "summary.json").read_text())
    assert math.isfinite(summary["final_train_loss"]) and math.isfinite(summary["final_val_loss"])
    model, _ = load_model(tmp_path / "long")
    assert model.config.block_size == 128 and model.config.design_options["rope"]["scaling"]["rope_type"] == "yarn"
    tuned, untuned = model.state_dict(), load_model(tmp_path / "base")[0].state_dict()
    assert tuned.keys() == untuned.keys() and any(not torch.equal(tuned[k], untuned[k]) for k in tuned)
    val = TokenData(Path(base[1] / "data" / "text")).splits["val"]
    result = loss_by_position(model, val, 128, windows=2, buckets=4, batch_size=2, device=torch.device("cpu"))
    assert [b["start"] for b in result["buckets"]] == [0, 32, 64, 96]
    assert all(math.isfinite(b["loss"]) for b in result["buckets"])
