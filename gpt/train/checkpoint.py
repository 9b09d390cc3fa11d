"""The training side of checkpoints: RNG states, the resume decision, and what may change on resume.

File I/O (atomic writes, safe loading) lives in gpt.checkpoint."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from gpt.checkpoint import BEST, LATEST, load, resolve, save  # noqa: F401  (re-exported for the loop)
from gpt.errors import UserError

# Model-config fields that may change when resuming: they change neither parameter names nor shapes.
RESUMABLE_MODEL_FIELDS = ("dropout", "attention", "attention_backend", "window")


def shape_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The model-config fields that differ (but those of RESUMABLE_MODEL_FIELDS), as readable phrases."""
    missing = "(not set)"
    keys = sorted((set(saved) | set(current)) - set(RESUMABLE_MODEL_FIELDS))
    return [
        f"model.{k} is {saved.get(k, missing)!r} in the checkpoint but {current.get(k, missing)!r} now"
        for k in keys
        if saved.get(k, missing) != current.get(k, missing)
    ]


def rng_state() -> dict[str, Any]:
    """Every random generator this process uses, as tensors and plain values (weights_only-loadable)."""
    version, internal, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        # this process's GPU only (get_rng_state_all would start a CUDA context on every GPU)
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {"a.b.c": value}."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def resume_state(run_dir: Path, resume: bool, model_config: dict[str, Any], config: dict[str, Any],
                 log: Callable[[str], None]) -> dict[str, Any] | None:
    """The training state in run_dir to continue from, or None to start afresh; UserError when refused.

    Without ``resume``, an existing checkpoint is refused (it would be overwritten). With it, a missing
    checkpoint means starting from step 0 (a run killed before its first save), and a checkpoint whose
    model has another shape is refused, naming the fields. Other changed settings are logged.
    """
    path = run_dir / LATEST
    if not path.exists():
        if resume:
            log(f"resume=true but {run_dir} holds no {LATEST} yet: starting from step 0")
        return None
    if not resume:
        raise UserError(f"{run_dir} already holds a checkpoint ({LATEST}) from an earlier run",
                        hint="pass resume=true to continue it, or choose another out_dir")
    state = load(path)
    missing = [k for k in ("optimizer", "rng", "data", "step") if k not in state]
    if missing:
        raise UserError(f"{path} holds no training state ({', '.join(missing)} missing), so it cannot be resumed",
                        hint="it can still be sampled from with scripts/generate.py")
    diffs = shape_differences(state["model_config"], model_config)
    if diffs:
        raise UserError(f"cannot resume {path} with a model of another shape: {'; '.join(diffs)}",
                        hint="resume with the run's model settings, or start a new run in another out_dir")
    before, now = flatten(state.get("config", {})), flatten(config)
    changed = [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(before) | set(now))
               if k not in ("out_dir", "resume") and before.get(k) != now.get(k)]
    if changed:
        log("note: resuming with changed settings: " + "; ".join(changed))
    return state
