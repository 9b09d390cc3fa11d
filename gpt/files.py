"""Files that must never be torn or trusted blindly: the one atomic writer and the safe archive reader.

Every file the project writes that must never be torn (checkpoints, prepared data, records) goes through
:func:`atomic_write`; every torch archive it reads goes through :func:`load_archive` (no pickled code runs).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from gpt.errors import UserError


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


def load_archive(path: str | Path, mmap: bool = False) -> Any:
    """torch.load with weights_only=True: tensors and plain values only; a damaged or foreign file is a UserError.
    ``mmap``: tensors stay on disk until used (for reading a checkpoint's small entries)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is damaged or foreign
        raise UserError(f"{path} is not a readable checkpoint (not a torch archive)",
                        hint="it may be truncated, empty or not a checkpoint at all")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
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
