"""Warmup-stable-decay from a saved checkpoint: ``decay_from=<checkpoint of the stable phase>`` finishes a model there.

The stable phase of a WSD run does not depend on where the run ends, so its checkpoint at step s is the checkpoint
any longer or shorter WSD run with the same settings would have at s. Decaying from it is the straight WSD run whose
decay starts at s: train.max_iters becomes the T with T - round(decay_frac * T) = s, and the run continues from the
checkpoint's full state (weights, optimizer, data position, random generators) into a new out_dir. One stable run
with train.keep_checkpoints=true thus gives a finished model at every evaluation, for the price of the decays.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from gpt.errors import UserError
from gpt.files import load_archive
from gpt.train.config import RunConfig
from gpt.train.optim import decay_iters, final_lr
from gpt.weights import checkpoint, sharded


def source(spec: str) -> Path:
    """The training checkpoint decay_from names: a .pt file, a sharded step folder, or a run directory's latest."""
    path = Path(spec).expanduser()
    if path.is_dir() and not (path / ".metadata").is_file():
        found = checkpoint.latest(path)
        if found is None:
            raise UserError(f"decay_from={spec}: no training checkpoint in {path} (looked for {checkpoint.LATEST} "
                            f"and {sharded.ROOT})", hint=f"name a run directory or one of its {checkpoint.KEPT}/ files")
        return found
    if not path.exists():
        raise UserError(f"decay_from={spec} does not exist",
                        hint=f"name a run directory, a checkpoint file or one of a run's {checkpoint.KEPT}/ entries")
    return path


def saved_step(path: Path) -> int:
    """The step a training checkpoint was saved at, without reading its tensors (memory-mapped)."""
    meta = path / sharded.META if path.is_dir() else path
    try:
        if not zipfile.is_zipfile(meta):
            raise OSError("not a torch archive")
        step = torch.load(meta, map_location="cpu", weights_only=True, mmap=True).get("step")
    except (OSError, RuntimeError, EOFError, AttributeError, zipfile.BadZipFile, pickle.UnpicklingError):
        step = load_archive(meta).get("step")  # its UserError says what is wrong with the file
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UserError(f"{path} holds no training step, so it cannot be decayed from",
                        hint="name a training checkpoint (ckpt.pt, a sharded step folder or a kept checkpoint)")
    return step


def decayed_length(step: int, decay_frac: float) -> int:
    """The max_iters T of the WSD run whose decay starts at ``step``: the smallest T above ``step`` with
    T - round(decay_frac * T) = step (T - round(decay_frac * T) grows by 0 or 1 with T, so it meets every step that
    leaves at least one step to decay)."""
    stable = lambda length: length - decay_iters(length, decay_frac)  # noqa: E731
    length = max(step + 1, round(step / (1 - decay_frac)))
    while stable(length) < step:
        length += 1
    while length - 1 > step and stable(length - 1) >= step:
        length -= 1
    return length


def plan(run: RunConfig, log: Callable[[str], None]) -> tuple[RunConfig, Path]:
    """The run that decays from run.decay_from (train.max_iters set), and the checkpoint it starts from."""
    train = run.train
    if train.schedule != "wsd":
        raise UserError(f"decay_from needs train.schedule=wsd (this run's is {train.schedule})",
                        hint="add train.schedule=wsd (recipe=modern has it), with the stable run's other settings")
    if train.decay_frac >= 1:
        raise UserError("decay_from needs train.decay_frac below 1 (with 1 the whole run decays: no stable phase)")
    path = source(run.decay_from)
    step = saved_step(path)
    if step < train.warmup_iters:
        raise UserError(f"{path} was saved at step {step}, inside the warmup (train.warmup_iters="
                        f"{train.warmup_iters}): there is no stable phase to decay from yet",
                        hint="pick a later checkpoint")
    length = decayed_length(step, train.decay_frac)
    log(f"decaying from {path} (step {step}): the learning rate falls linearly to {final_lr(train):.1e} over steps "
        f"{step}-{length} (train.max_iters={length}, train.decay_frac={train.decay_frac:g})")
    return replace(run, train=replace(train, max_iters=length)), path
