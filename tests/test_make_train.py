"""`make train`: the Makefile's QUICK settings are the command README's "The default run" quotes, they compose into a
valid run of the shape README describes, and `QUICK=` (empty) leaves the longer run of TrainConfig's defaults."""

from __future__ import annotations

import shlex

from conftest import ROOT
from gpt.train import optim
from gpt.train.config import TrainConfig


def quick_settings() -> list[str]:
    """The overrides `make train` adds to `python scripts/train.py model=small recipe=modern` (the QUICK line)."""
    lines = [line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("QUICK ?=")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("?=", 1)[1])


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from gpt.schema import register, typed

    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return typed(hydra_compose(config_name="train", overrides=["model=small", "recipe=modern", *overrides]))


def test_readme_quotes_the_command_make_train_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The default run")[1].split("\n## ")[0]
    command = "python scripts/train.py model=small recipe=modern " + " ".join(quick_settings())
    assert command in section, f"README's default run should quote `{command}`"
    recipe = "\t$(PYTHON) scripts/train.py model=small recipe=modern $(QUICK) $(ARGS)\n"
    assert recipe in (ROOT / "Makefile").read_text(), "make train should run that command (plus $(ARGS))"


def test_the_quick_settings_make_a_valid_wsd_run_evaluated_at_its_start_middle_and_end():
    run = compose(*quick_settings())
    train = run.train
    assert (train.optimizer, train.schedule, train.min_lr) == ("muon", "wsd", 0)
    decay_start = train.max_iters - optim.decay_iters(train.max_iters, train.decay_frac)
    assert train.warmup_iters < decay_start < train.max_iters  # warmup, a stable phase, then the decay to zero
    assert optim.learning_rate(train.max_iters - 1, train) < 0.01 * train.learning_rate
    assert train.max_iters == 2 * train.eval_interval  # evaluations at steps 0, max_iters / 2 and max_iters
    assert (run.model.n_layer, run.model.n_head, run.model.n_embd, run.model.block_size) == (4, 4, 96, 128)
    assert run.data.name == "stdlib_char"


def test_without_the_quick_settings_it_is_the_longer_run_of_the_defaults():
    run = compose()
    assert run.train.max_iters == TrainConfig().max_iters == 1600 and run.model.n_embd == 128
