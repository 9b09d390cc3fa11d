"""What resume=true accepts and refuses: damaged training entries, weights that disagree with their config,
another tokenizer of the same size. Each refusal is one UserError naming what is wrong."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from gpt.errors import UserError
from gpt.model.config import GPTConfig
from gpt.schema import register, typed
from gpt.train.resume import resume_state
from gpt.train.trainer import train
from gpt.weights import checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished two-step run of a tiny model (in-process: a second or two)."""
    root = tmp_path_factory.mktemp("resume")
    (root / "corpus").mkdir()
    for i in range(3):
        (root / "corpus" / f"m{i}.py").write_text("def f(x):\n    return x + 1\n\n" * 60)
    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="train", overrides=[
            "model=tiny", "device=cpu", "data=text", f"data.path={root / 'corpus'}", f"data.root={root / 'data'}",
            "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", "train.batch_size=2",
            "train.sample_tokens=0", f"out_dir={root / 'run'}"])
    train(typed(cfg), root / "run", log=lambda message: None)
    return root / "run"


def tampered(run_dir: Path, tmp_path: Path, change) -> tuple[Path, dict]:
    """A copy of the run whose ckpt.pt went through ``change(payload)``."""
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    payload = torch.load(copy / "ckpt.pt", weights_only=True)
    change(payload)
    checkpoint.save(payload, copy / "ckpt.pt")
    return copy, payload


def resume(run_dir: Path, payload: dict, tokenizer: dict | None = None) -> dict | None:
    config = GPTConfig.from_dict(torch.load(run_dir / "ckpt.pt", weights_only=True)["model_config"])
    return resume_state(run_dir, True, config, tokenizer or payload["tokenizer"], payload["config"], print)


def test_an_intact_checkpoint_resumes(run_dir):
    payload = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert resume(run_dir, payload)["step"] == 2


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(rng="not a list"), "its rng entry has the wrong type"),
    (lambda p: p["rng"][0].update(torch=[1, 2, 3]), "its rng[0] entry has the wrong type"),
    (lambda p: p.update(step="2"), "its step entry has the wrong type"),
    (lambda p: p["data"].update(train_generator=None), "its data.train_generator entry has the wrong type"),
    (lambda p: p.update(model=[1, 2]), "the model entry is not a dict of tensors"),
    (lambda p: p["model"].pop("transformer.ln_f.weight"), "missing transformer.ln_f.weight"),
    (lambda p: p["model"].update({"transformer.h.0.mlp.c_fc.weight": torch.zeros(3, 3)}),
     "transformer.h.0.mlp.c_fc.weight has shape (3, 3), the model config says (128, 32)"),
])
def test_damaged_training_entries_and_weights_are_refused_naming_the_entry(run_dir, tmp_path, change, message):
    copy, payload = tampered(run_dir, tmp_path, change)
    with pytest.raises(UserError, match=re.escape(message)):
        resume(copy, payload)


def test_another_character_vocabulary_of_the_same_size_is_refused(run_dir):
    payload = torch.load(run_dir / "ckpt.pt", weights_only=True)
    chars = payload["tokenizer"]["chars"]
    other = {**payload["tokenizer"], "chars": chars[1:] + chars[:1]}
    with pytest.raises(UserError, match="its tokenizer .* is not the data's") as err:
        resume(run_dir, payload, tokenizer=other)
    assert "same size can still differ" in str(err.value)
