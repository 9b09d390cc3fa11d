"""Resuming a run: whether out_dir's checkpoint may be continued, and the command line that continues it."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Callable

from gpt import checkpoint
from gpt.config import GPTConfig
from gpt.errors import UserError

TRAINING_ENTRIES = ("optimizer", "rng", "data", "step")  # without them a checkpoint can be sampled, not resumed


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {"a.b.c": value}."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def resume_state(run_dir: Path, resume: bool, model_config: GPTConfig, config: dict[str, Any],
                 log: Callable[[str], None]) -> dict[str, Any] | None:
    """The training state in run_dir to continue from, or None to start afresh; UserError when refused.

    Without ``resume``, an existing checkpoint is refused (it would be overwritten). With it, a missing
    checkpoint means starting from step 0 (a run killed before its first save), and a checkpoint whose
    model has another shape is refused, naming the fields. Other changed settings are logged.
    """
    path = run_dir / checkpoint.LATEST
    if not path.exists():
        if resume:
            log(f"resume=true but {run_dir} holds no {checkpoint.LATEST} yet: starting from step 0")
        return None
    if not resume:
        raise UserError(f"{run_dir} already holds a checkpoint ({checkpoint.LATEST}) from an earlier run",
                        hint="pass resume=true to continue it, or choose another out_dir")
    state = checkpoint.load(path)
    missing = [k for k in TRAINING_ENTRIES if k not in state]
    if missing:
        raise UserError(f"{path} holds no training state ({', '.join(missing)} missing), so it cannot be resumed",
                        hint="it can still be sampled from with scripts/generate.py")
    diffs = model_config.shape_differences(state["model_config"])
    if diffs:
        raise UserError(f"cannot resume {path} with a model of another shape: {'; '.join(diffs)}",
                        hint="resume with the run's model settings, or start a new run in another out_dir")
    before, now = flatten(state.get("config", {})), flatten(config)
    changed = [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(before) | set(now))
               if k not in ("out_dir", "resume") and before.get(k) != now.get(k)]
    if changed:
        log("note: resuming with changed settings: " + "; ".join(changed))
    return state


def open_run_dir(run_dir: Path, resume: bool, model_config: GPTConfig, config: dict[str, Any],
                 log: Callable[[str], None]) -> dict[str, Any] | None:
    """Rank 0: the state to resume from (None: afresh), once run_dir is known to be creatable and writable."""
    state = resume_state(run_dir, resume, model_config, config, log)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(run_dir, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise UserError(f"out_dir {str(run_dir)!r} cannot be written: {err.strerror or err}",
                        hint="choose another out_dir=, a folder you can write to") from None
    return state


def resume_command(overrides: list[str], run_dir: Path, script: str) -> str:
    """The command line that continues this run: same overrides, out_dir pinned, resume=true."""
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("out_dir", "resume")]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nodes = world // max(local, 1)
        launch = f"torchrun --nproc_per_node={local}" + (f" --nnodes={nodes} <same rendezvous options>" if nodes > 1 else "")
    else:
        launch = "python"
    return " ".join([launch, script, *map(shlex.quote, keep), shlex.quote(f"out_dir={run_dir}"), "resume=true"])
