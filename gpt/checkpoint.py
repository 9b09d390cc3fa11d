"""Checkpoint files: one atomic writer, the model's entries of the layout, safe loading.

A checkpoint is a torch archive of tensors and plain Python values (``torch.load(weights_only=True)``
reads it). Its model entries are ``model`` (state dict), ``model_config`` (GPTConfig as a dict) and
``tokenizer`` (the tokenizer's description); a training checkpoint adds the training state (see
gpt.train.state). Every file the project writes that must never be torn (checkpoints, prepared data)
goes through :func:`atomic_write`.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from gpt.config import GPTConfig
from gpt.errors import UserError

LATEST = "ckpt.pt"  # the latest training state, rewritten at every evaluation and at the end
BEST = "best.pt"  # the model with the best validation loss so far
MODEL_ENTRIES = ("model", "model_config", "tokenizer")


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None], what: str = "file",
                 hint: str | None = None) -> None:
    """Stream ``write(f)`` into a temporary file beside ``path``, fsync it, rename it over ``path``, fsync the folder.

    A crash at any moment leaves the old file or the new one, never a torn one. If writing fails (a full
    disk), the temporary file is removed, the old file stays, and a UserError names ``what`` failed. The
    temporary name is unique to the process, so two writers never write into one file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        hint = hint or f"the previous {path.name} is unchanged; free disk space or write elsewhere"
        raise UserError(f"could not write {what} {path}: {err.strerror or err}", hint=hint) from None
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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


def read_model(payload: dict[str, Any], source: str | Path = "the checkpoint") -> tuple[
        GPTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """GPTConfig, state dict and tokenizer description from a loaded checkpoint, each checked (UserError)."""
    missing = [key for key in MODEL_ENTRIES if key not in payload]
    if missing:
        raise UserError(f"{source} has no {', '.join(missing)} entry", hint="it was not written by this framework")
    if not isinstance(payload["model_config"], dict) or not isinstance(payload["tokenizer"], dict):
        raise UserError(f"{source}: model_config and tokenizer must be dicts")
    config = GPTConfig.from_dict(payload["model_config"])
    check_model_state(config, payload["model"], source)
    return config, payload["model"], payload["tokenizer"]


def check_model_state(config: GPTConfig, state: Any, source: str | Path = "the checkpoint") -> None:
    """Refuse a state dict whose names or shapes are not those of GPT(config), naming the first difference."""
    from gpt.model import GPT  # here, not at the top: the model imports nothing of checkpoints

    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{source}: the model entry is not a dict of tensors")
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in GPT(config).state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise UserError(f"{source}: the weights do not match the model config ({what}; "
                        f"{len(missing)} missing, {len(unexpected)} unexpected)",
                        hint="the file is damaged or its config belongs to another model")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise UserError(f"{source}: {name} has shape {tuple(state[name].shape)}, the model config says {shape}",
                            hint="the file is damaged or its config belongs to another model")


def resolve(ckpt: str | Path) -> Path:
    """A checkpoint file from a run directory (best.pt, else ckpt.pt) or a direct file path."""
    path = Path(ckpt).expanduser()
    if path.is_dir():
        for name in (BEST, LATEST):
            if (path / name).is_file():
                return path / name
        raise UserError(f"no checkpoint in {path} (looked for {BEST} and {LATEST})",
                        hint="point ckpt= at a run directory that finished at least one evaluation")
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist", hint="ckpt= takes a run directory or a .pt file")
    return path


def load(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint safely: weights_only=True, so no pickled code ever runs."""
    path = Path(path)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is damaged or foreign
        raise UserError(f"{path} is not a readable checkpoint (not a torch archive)",
                        hint="it may be truncated, empty or not a checkpoint at all")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = [line.strip() for line in str(err).splitlines() if "Unsupported global" in line]
        raise UserError(
            f"{path} holds objects other than tensors and plain values; refusing to load it"
            + (f" ({found[0]})" if found else ""),
            hint="this loader never runs code from a file; re-save the checkpoint with tensors and plain values only",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise UserError(f"{path} is not a readable checkpoint ({str(err).splitlines()[0]})",
                        hint="it may be truncated or not a checkpoint at all") from None
    if not isinstance(payload, dict) or "model" not in payload or "model_config" not in payload:
        raise UserError(f"{path} is not a checkpoint written by this framework (no model or model_config)")
    return payload
