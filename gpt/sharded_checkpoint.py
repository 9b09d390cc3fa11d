"""Sharded checkpoints (train.fsdp=true): torch.distributed.checkpoint folders, committed atomically, read anywhere.

Layout in a run directory::

    ckpt.dcp/latest               the committed step folder's name, replaced atomically (the commit)
    ckpt.dcp/step-00000006/       one step: every rank's shards (__<rank>_0.distcp) and DCP's .metadata,
                                  written by all ranks; meta.pt (everything but tensors) by rank 0

The tensors (``model.<name>`` and ``optim.state.<name>.<exp_avg|exp_avg_sq|step>``) go through DCP, so each
rank writes only its part and a later run may load them with any number of processes. Everything else (step,
config, tokenizer, RNG and data states, the optimizer's hyperparameters) is a plain torch archive, read with
weights_only=True. A crash at any moment leaves ``latest`` naming the previous complete folder.

``python -m gpt.consolidate RUN_DIR`` turns the committed step into RUN_DIR/ckpt.pt, one file that resumes
with or without FSDP; generate, export and evaluation read the folder directly (gpt.checkpoint.load).
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from gpt.errors import UserError
from gpt.files import atomic_write, load_archive

ROOT = "ckpt.dcp"  # under a run directory
POINTER = "latest"
META = "meta.pt"
MODEL_PREFIX, OPTIM_PREFIX = "model.", "optim.state."


def step_folder(run_dir: Path, step: int) -> Path:
    return run_dir / ROOT / f"step-{step:08d}"


def committed(run_dir: Path) -> Path | None:
    """The step folder that run_dir's pointer names, or None when no sharded checkpoint was ever committed."""
    pointer = run_dir / ROOT / POINTER
    if not pointer.is_file():
        return None
    folder = run_dir / ROOT / pointer.read_text(encoding="utf-8").strip()
    if not (folder / META).is_file() or not (folder / ".metadata").is_file():
        raise UserError(f"{pointer} names {folder.name}, which is incomplete or missing",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run")
    return folder


def commit(run_dir: Path, folder: Path) -> None:
    """Point ``latest`` at ``folder`` (atomically), then delete every other step folder (older or abandoned)."""
    atomic_write(run_dir / ROOT / POINTER, lambda f: f.write(folder.name.encode()),
                            what="the sharded checkpoint's pointer")
    remove_uncommitted(run_dir)


def remove_uncommitted(run_dir: Path) -> None:
    """Delete the step folders that ``latest`` does not name: those of earlier steps, or of a save cut short."""
    root = run_dir / ROOT
    pointer = root / POINTER
    keep = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else None
    for folder in root.glob("step-*"):
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


class _ForeignGlobal(pickle.UnpicklingError):
    """A pickle naming a class or function outside the allowed set."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's .metadata with nothing but its own classes, torch sizes, dtypes and paths."""

    MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
    NAMES = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
             ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath")}

    def find_class(self, module: str, name: str) -> Any:
        allowed = (module in self.MODULES or (module, name) in self.NAMES
                   or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)))
        if not allowed:
            raise _ForeignGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def read_metadata(folder: Path) -> Any:
    """DCP's Metadata of a step folder, after checking that its pickle names nothing but DCP's own types.

    DCP itself reads .metadata with plain pickle; checked here first, that read can run no foreign code."""
    path = folder / ".metadata"
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except _ForeignGlobal as err:
        raise UserError(f"{path} holds objects other than DCP's metadata ({err}); refusing to load it",
                        hint="this loader never runs code from a file; use a checkpoint this framework wrote") from None
    except (OSError, EOFError, AttributeError, ValueError, pickle.UnpicklingError) as err:
        raise UserError(f"{path} is not readable DCP metadata ({err})",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run") from None


def tensor_shapes(folder: Path, prefix: str) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Full shape and dtype of every tensor under ``prefix`` in a step folder (prefix removed from the names)."""
    entries = read_metadata(folder).state_dict_metadata.items()
    return {name[len(prefix):]: (meta.size, meta.properties.dtype) for name, meta in entries
            if name.startswith(prefix) and hasattr(meta, "size")}


def load_full(folder: Path, optimizer: bool = False) -> dict[str, Any]:
    """A step folder as one checkpoint payload of whole tensors, in this process (no process group needed).

    ``model`` always; ``optimizer`` (keyed by parameter name) too when asked, which makes the payload resumable."""
    import torch.distributed.checkpoint as dcp

    payload = load_archive(folder / META)
    prefixes = (MODEL_PREFIX, OPTIM_PREFIX) if optimizer else (MODEL_PREFIX,)
    tensors = {prefix + name: torch.empty(size, dtype=dtype)
               for prefix in prefixes for name, (size, dtype) in tensor_shapes(folder, prefix).items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, checkpoint_id=str(folder), no_dist=True)
    model_state, optimizer_state = unflatten(tensors)
    payload["model"] = model_state
    if optimizer:
        payload["optimizer"] = {"state": optimizer_state, "param_groups": payload["optimizer"]["param_groups"]}
    return payload


def unflatten(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Flat DCP keys back to a model state dict and an optimizer state keyed by parameter name."""
    model: dict[str, torch.Tensor] = {}
    optimizer: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        if name.startswith(MODEL_PREFIX):
            model[name[len(MODEL_PREFIX):]] = t
        elif name.startswith(OPTIM_PREFIX):
            param, key = name[len(OPTIM_PREFIX):].rsplit(".", 1)
            optimizer.setdefault(param, {})[key] = t
    return model, optimizer
