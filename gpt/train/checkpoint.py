"""Checkpoints: plain tensors and Python values only (loadable with weights_only=True), written atomically."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from gpt.errors import UserError

LATEST = "ckpt.pt"
BEST = "best.pt"


def save(payload: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, rename over ``path``, fsync the folder.

    A crash at any moment leaves either the old or the new file, never a torn one; if the write
    fails (disk full), the old file stays and the temporary one is removed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    try:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not write checkpoint {path}: {err.strerror or err}", hint="the previous checkpoint is unchanged; free disk space or pick another out_dir") from None
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def resolve(ckpt: str | Path) -> Path:
    """A checkpoint file from a run directory (best.pt, else ckpt.pt) or a direct file path."""
    path = Path(ckpt).expanduser()
    if path.is_dir():
        for name in (BEST, LATEST):
            if (path / name).is_file():
                return path / name
        raise UserError(f"no checkpoint in {path} (looked for {BEST} and {LATEST})", hint="point ckpt= at a run directory that finished at least one evaluation")
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist", hint="ckpt= takes a run directory or a .pt file")
    return path


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint safely: weights_only=True, so no pickled code ever runs."""
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is damaged or foreign
        raise UserError(f"{path} is not a readable checkpoint (not a torch archive)", hint="it may be truncated, empty or not a checkpoint at all")
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
        raise UserError(f"{path} is not a readable checkpoint ({str(err).splitlines()[0]})", hint="it may be truncated or not a checkpoint at all") from None
    if not isinstance(payload, dict) or "model" not in payload or "model_config" not in payload:
        raise UserError(f"{path} is not a checkpoint written by this framework (no model or model_config)")
    return payload
