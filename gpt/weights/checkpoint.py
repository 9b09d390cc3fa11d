"""Checkpoint files: the layout of a run's checkpoints, finding and loading them safely, one writer per run.

A checkpoint is a torch archive of tensors and plain Python values (``torch.load(weights_only=True)``
reads it), or with train.fsdp=true a sharded folder (gpt.weights.sharded) read back as the same payload.
Its model entries are ``model`` (state dict), ``model_config`` (GPTConfig as a dict) and ``tokenizer``
(the tokenizer's description); a training checkpoint adds the training state (see gpt.train.state).
Writes go through gpt.files.atomic_write, so no file is ever torn.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from gpt.errors import UserError
from gpt.files import atomic_write, load_archive
from gpt.model.config import GPTConfig
from gpt.model.state import (  # noqa: F401  (re-exported: checkpoints' readers call them so)
    DAMAGED,
    MAX_BLOCK_SIZE,
    check_model_state,
    check_sizes,
    model_config_from,
)
from gpt.weights import sharded

LATEST = "ckpt.pt"  # the latest training state, rewritten at every evaluation and at the end
BEST = "best.pt"  # the model with the best validation loss so far
KEPT = "checkpoints"  # train.keep_checkpoints=true: every evaluation's checkpoint, step-NNNNNNNN.pt (or a folder)
MODEL_ENTRIES = ("model", "model_config", "tokenizer")


class FolderLock:
    """One writer per folder: an exclusive lock (flock on ``folder/.lock``, which names the holder's process)
    held from :meth:`acquire` to :meth:`release` or the process's end, whatever way it ends."""

    def __init__(self, folder: str | Path, holder: str = "a run") -> None:
        self.folder, self.holder = Path(folder), holder
        self._file: Any = None

    def acquire(self) -> FolderLock:
        """Take the lock, or refuse at once (UserError naming the process that holds it)."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            return self
        self._file = open(self.folder / ".lock", "a+", encoding="utf-8")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            pid = self._file.read().strip() or "unknown"
            self._file.close()
            self._file = None
            raise UserError(f"{self.folder} is in use by {self.holder} (process {pid})",
                            hint="wait for it to finish or stop it, or choose another folder") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file releases the flock
            self._file = None

    def remove_stale_temporaries(self) -> None:
        """Delete temporary files that writers killed mid-write left in the folder (only the holder may)."""
        for tmp in self.folder.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)


def save(payload: dict[str, Any], path: str | Path) -> None:
    """torch.save a checkpoint atomically, streamed to disk (no in-memory copy of the archive)."""
    atomic_write(path, lambda f: torch.save(payload, f), what="checkpoint",
                 hint="the previous checkpoint is unchanged; free disk space or pick another out_dir")


def model_entries(state: dict[str, torch.Tensor], config: GPTConfig, tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The entries every checkpoint holds: enough to rebuild the model and its tokenizer."""
    return {"model": state, "model_config": config.to_dict(), "tokenizer": tokenizer}


def read_entries(payload: dict[str, Any], source: str | Path = "the checkpoint") -> tuple[
        GPTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """GPTConfig, state dict and tokenizer description of a loaded checkpoint, their types checked (not the
    weights' shapes: :func:`check_model_state`)."""
    missing = [key for key in MODEL_ENTRIES if key not in payload]
    if missing:
        raise UserError(f"{source} has no {', '.join(missing)} entry", hint="it was not written by this framework")
    if not isinstance(payload["tokenizer"], dict):
        raise UserError(f"{source}: the tokenizer entry must be a dict", hint=DAMAGED)
    return model_config_from(payload["model_config"], source), payload["model"], payload["tokenizer"]


def read_model(payload: dict[str, Any], source: str | Path = "the checkpoint") -> tuple[
        GPTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """GPTConfig, state dict and tokenizer description from a loaded checkpoint, each checked (UserError)."""
    config, state, tokenizer = read_entries(payload, source)
    check_model_state(config, state, source)
    return config, state, tokenizer


def resolve(ckpt: str | Path) -> Path:
    """A checkpoint from a run directory (best.pt, else the latest training checkpoint), a ckpt.dcp folder,
    a sharded step folder or a .pt file."""
    path = Path(ckpt).expanduser()
    if path.is_dir():
        if (path / ".metadata").is_file():  # a sharded step folder itself
            return path
        if path.name == sharded.ROOT:  # a run's ckpt.dcp: its committed step
            found = sharded.committed(path.parent)
        else:
            found = path / BEST if (path / BEST).is_file() else latest(path)
        if found is None:
            raise UserError(f"no checkpoint in {path} (looked for {BEST}, {LATEST} and {sharded.ROOT})",
                            hint="point ckpt= at a run directory that finished at least one evaluation")
        return found
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist", hint="ckpt= takes a run directory or a .pt file")
    return path


def latest(run_dir: Path) -> Path | None:
    """run_dir's latest training checkpoint: ckpt.pt or the committed sharded step folder (train.fsdp=true),
    whichever was written last; None when there is neither."""
    single, folder = run_dir / LATEST, sharded.committed(run_dir)
    if folder is None:
        return single if single.is_file() else None
    if single.is_file() and single.stat().st_mtime > (run_dir / sharded.ROOT / sharded.POINTER).stat().st_mtime:
        return single
    return folder


def keep(run_dir: Path, step: int) -> Path:
    """Keep run_dir's latest checkpoint as run_dir/checkpoints/step-NNNNNNNN.pt (a sharded one as a step folder of
    that name): hard links where the file system has them (no copy; every write replaces files, never edits them),
    else copies, committed by one rename."""
    source = latest(run_dir)
    if source is None:
        raise UserError(f"{run_dir} holds no checkpoint to keep")
    target = run_dir / KEPT / (f"step-{step:08d}" if source.is_dir() else f"step-{step:08d}.pt")
    temporary = target.with_name(f".{target.name}.tmp")
    try:
        target.parent.mkdir(exist_ok=True)
        for old in (temporary, target):
            shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
        if source.is_dir():
            temporary.mkdir()
            for file in source.iterdir():
                _link_or_copy(file, temporary / file.name)
        else:
            _link_or_copy(source, temporary)
        os.replace(temporary, target)
    except OSError as err:
        raise UserError(f"could not keep the checkpoint of step {step} in {target.parent}: {err.strerror or err}",
                        hint="free disk space, or set train.keep_checkpoints=false") from None
    return target


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def run_dir_of(path: Path) -> Path:
    """The run directory a resolved checkpoint belongs to (a sharded step folder sits two levels down)."""
    return path.parent.parent if (path / ".metadata").is_file() else path.parent


def load(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint safely (no pickled code ever runs): a .pt archive, or a sharded step folder whole."""
    path = Path(path)
    if path.is_dir():
            payload = sharded.load_full(path)
    else:
        payload = load_archive(path)
    if isinstance(payload, dict) and "adapter" in payload and "model" not in payload:  # adapter.pt
        raise UserError(f"{path} holds a LoRA run's adapters alone, not a model",
                        hint=f"point at the run folder {path.parent} (its ckpt.pt and best.pt hold the merged weights)")
    if not isinstance(payload, dict) or "model" not in payload or "model_config" not in payload:
        raise UserError(f"{path} is not a checkpoint written by this framework (no model or model_config)")
    return payload
