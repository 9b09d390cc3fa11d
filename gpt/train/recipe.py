"""Training recipes (configs/recipe/*.yaml) read as data, for code that runs several of them from one config: the
arena's recipe axis, the time-to-loss benchmark. ``recipe=<name>`` on a script's command line composes the same file
through Hydra; here it is applied to an already typed run.

A recipe sets ``train.*`` options and model options that are not the attention design (RECIPE_MODEL_FIELDS): a
recipe never changes what is being compared.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from gpt.errors import ConfigError
from gpt.train.config import TrainConfig

FOLDER = Path(__file__).resolve().parent.parent.parent / "configs" / "recipe"
RECIPE_MODEL_FIELDS = ("activation", "tie_head", "zero_init_proj")  # what a recipe may set of the model (no design)


def names() -> list[str]:
    """The recipes configs/recipe/ holds, sorted."""
    return sorted(p.stem for p in FOLDER.glob("*.yaml"))


def settings(name: str) -> dict[str, dict[str, Any]]:
    """The recipe's ``train`` and ``model`` options, checked: known train fields, model fields a recipe may set."""
    if name not in names():
        raise ConfigError(f"unknown recipe {name!r}", hint=f"recipes: {', '.join(names())} (configs/recipe/)")
    path = FOLDER / f"{name}.yaml"
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict) or set(loaded) - {"train", "model"}:
        raise ConfigError(f"{path} must hold only train: and model: mappings")
    train, model = loaded.get("train") or {}, loaded.get("model") or {}
    known = {f.name for f in fields(TrainConfig)}
    for key in train:
        if key not in known:
            raise ConfigError(f"{path}: train.{key} is not a training option")
    for key in model:
        if key not in RECIPE_MODEL_FIELDS:
            raise ConfigError(f"{path}: a recipe may not set model.{key}",
                              hint=f"recipes set {', '.join(RECIPE_MODEL_FIELDS) or 'no model options'}; "
                                   "never the attention design")
    return {"train": dict(train), "model": dict(model)}


def apply(name: str, model: dict[str, Any], train: TrainConfig) -> tuple[dict[str, Any], TrainConfig]:
    """The model fields and training options of a run under recipe ``name`` (the recipe's own settings win)."""
    chosen = settings(name)
    return {**model, **chosen["model"]}, replace(train, **chosen["train"])
