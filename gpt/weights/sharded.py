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
with or without FSDP; generate, export and evaluation read the folder directly (gpt.weights.checkpoint.load).
"""

from __future__ import annotations

import math
import pickle
import re
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
    folder = run_dir / ROOT / pointed_name(pointer)
    if not (folder / META).is_file() or not (folder / ".metadata").is_file():
        raise UserError(f"{pointer} names {folder.name}, which is incomplete or missing",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run")
    return folder


def pointed_name(pointer: Path) -> str:
    """The step folder name a ``latest`` pointer holds; anything but ``step-NNNNNNNN`` is refused, so a pointer
    can never lead outside ckpt.dcp."""
    try:
        name = pointer.read_bytes()[:64].decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as err:
        name = f"<unreadable: {type(err).__name__}>"
    if not re.fullmatch(r"step-\d{8}", name):
        raise UserError(f"{pointer} does not name a step folder (it holds {name[:40]!r})",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run")
    return name


def commit(run_dir: Path, folder: Path) -> None:
    """Point ``latest`` at ``folder`` (atomically), then delete every other step folder (older or abandoned)."""
    atomic_write(run_dir / ROOT / POINTER, lambda f: f.write(folder.name.encode()),
                            what="the sharded checkpoint's pointer")
    remove_uncommitted(run_dir)


def remove_uncommitted(run_dir: Path) -> None:
    """Delete the step folders that ``latest`` does not name: those of earlier steps, or of a save cut short."""
    root = run_dir / ROOT
    pointer = root / POINTER
    keep = pointed_name(pointer) if pointer.is_file() else None
    for folder in root.glob("step-*"):
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


class _ForeignGlobal(pickle.UnpicklingError):
    """A pickle naming a class or function outside the allowed set."""


_DCP_META = "torch.distributed.checkpoint.metadata"
# Exactly the globals DCP's .metadata pickles: named classes (and one lookup function), never a whole module.
# A pickle may name a dotted attribute ("os.system" inside an allowed module reaches what that module imported),
# so names are matched whole against this set: nothing else is ever looked up.
_ALLOWED_GLOBALS = frozenset({
    (_DCP_META, "Metadata"), (_DCP_META, "MetadataIndex"), (_DCP_META, "StorageMeta"),
    (_DCP_META, "TensorStorageMetadata"), (_DCP_META, "TensorProperties"), (_DCP_META, "ChunkStorageMetadata"),
    (_DCP_META, "_MEM_FORMAT_ENCODING"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
})


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's .metadata with nothing but its own named classes, torch sizes, dtypes and paths."""

    def find_class(self, module: str, name: str) -> Any:
        is_dtype = (module == "torch" and name.isidentifier()
                    and isinstance(getattr(torch, name, None), torch.dtype))
        if (module, name) not in _ALLOWED_GLOBALS and not is_dtype:
            raise _ForeignGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def read_metadata(folder: Path) -> Any:
    """DCP's Metadata of a step folder, unpickled with the allow-list above and checked for shape.

    Every DCP load in the project reads .metadata through here (:class:`SafeReader`), so DCP's own plain
    pickle.load of that file never runs."""
    path = folder / ".metadata"
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except _ForeignGlobal as err:
        raise UserError(f"{path} holds objects other than DCP's metadata ({err}); refusing to load it",
                        hint="this loader never runs code from a file; use a checkpoint this framework wrote") from None
    except (OSError, EOFError, AttributeError, ValueError, TypeError, KeyError, IndexError, RecursionError,
            MemoryError, pickle.UnpicklingError) as err:
        raise UserError(f"{path} is not readable DCP metadata ({type(err).__name__}: {str(err)[:200]})",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run") from None
    problem = _metadata_problem(metadata)
    if not problem and (damage := _shards_problem(metadata, folder)):
        raise UserError(f"{folder}: {damage}",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run")
    if problem:
        raise UserError(f"{path} is not DCP metadata this framework wrote ({problem}); refusing to load it",
                        hint="the sharded checkpoint is damaged or foreign; use a checkpoint this framework wrote")
    return metadata


def _metadata_problem(metadata: Any) -> str | None:
    """What is wrong with unpickled metadata, or None: tensors only (a non-tensor entry would make DCP unpickle
    its bytes with weights_only=False), and every shard a plain file name inside the step folder."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

    if not isinstance(metadata, Metadata):
        return f"a {type(metadata).__name__}, not Metadata"
    entries, storage = getattr(metadata, "state_dict_metadata", None), getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        return "its entries or storage are not dicts"
    for name, entry in entries.items():
        if not isinstance(name, str) or not isinstance(entry, TensorStorageMetadata):
            return f"entry {str(name)[:80]!r} is a {type(entry).__name__}, not a tensor"
        if not isinstance(entry.size, torch.Size) or not isinstance(getattr(entry.properties, "dtype", None),
                                                                     torch.dtype):
            return f"entry {name!r} has no tensor size or dtype"
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            return "its storage map holds foreign objects"
        where = str(info.relative_path)
        if Path(where).name != where or where in ("", ".", "..") or not where.endswith(".distcp"):
            return f"shard path {where[:80]!r} is not a .distcp file inside the step folder"
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (info.offset, info.length)):
            return f"shard {where!r} has an offset or length that is not a non-negative integer"
    return None


def _shards_problem(metadata: Any, folder: Path) -> str | None:
    """What is wrong with the shard files that checked metadata names, or None: each must be present and hold the
    bytes its entries point at, and together they must hold at least every tensor's bytes (so a size no file
    could back, which would make a reader allocate terabytes, is refused before anything is allocated)."""
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    stored = 0
    for name, end in sorted(ends.items()):
        path = folder / name
        if not path.is_file():
            return f"its shard {name} is missing"
        stored += path.stat().st_size
        if path.stat().st_size < end:
            return f"its shard {name} holds {path.stat().st_size} bytes, fewer than the {end} it should (truncated)"
    needed = sum(math.prod(entry.size) * entry.properties.dtype.itemsize
                 for entry in metadata.state_dict_metadata.values())
    if needed > stored:
        return f"its tensors need {needed:,} bytes but its shards hold {stored:,}"
    return None


def _safe_reader_and_planner(folder: Path) -> tuple[Any, Any]:
    """DCP's file reader with :func:`read_metadata` in place of its plain pickle.load, and a load planner that
    refuses non-tensor entries (DCP's own would torch.load them with weights_only=False)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_metadata(folder)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class TensorsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            raise UserError(f"{folder} holds a non-tensor entry ({read_item.dest_index.fqn}); refusing to load it",
                            hint="this loader never runs code from a file; use a checkpoint this framework wrote")

    return SafeReader(str(folder)), TensorsOnlyPlanner()


def dcp_load(tensors: dict[str, torch.Tensor], folder: Path, no_dist: bool = False) -> None:
    """DCP's load of ``tensors`` (filled in place) from a step folder, reading nothing but checked tensors."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader, planner = _safe_reader_and_planner(folder)
    try:
        dcp.load(tensors, storage_reader=reader, planner=planner, no_dist=no_dist)
    except CheckpointException as err:  # a BaseException in DCP: each rank's failure, wrapped
        failures = list(getattr(err, "failures", {}).values())  # rank -> (exception, its stack)
        first = failures[0] if failures else err
        first = first[0] if isinstance(first, tuple) else first
        if isinstance(first, UserError):
            raise first from None
        detail = (str(first).strip().splitlines() or [type(first).__name__])[0][:200]
        if isinstance(first, pickle.UnpicklingError):  # torch's message suggests weights_only=False: never here
            detail = "its bytes are not tensors this framework wrote"
        raise UserError(f"{folder}: a shard could not be read ({type(first).__name__}: {detail})",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run") from None


def tensor_shapes(folder: Path, prefix: str) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Full shape and dtype of every tensor under ``prefix`` in a step folder (prefix removed from the names)."""
    entries = read_metadata(folder).state_dict_metadata.items()
    return {name[len(prefix):]: (meta.size, meta.properties.dtype) for name, meta in entries
            if name.startswith(prefix) and hasattr(meta, "size")}


def load_full(folder: Path, optimizer: bool = False) -> dict[str, Any]:
    """A step folder as one checkpoint payload of whole tensors, in this process (no process group needed).

    ``model`` always; ``optimizer`` (keyed by parameter name) too when asked, which makes the payload resumable."""
    payload = load_archive(folder / META)
    groups = payload.get("optimizer", {}).get("param_groups") if isinstance(payload, dict) and isinstance(
        payload.get("optimizer", {}), dict) else None
    if not isinstance(payload, dict) or (optimizer and not isinstance(groups, list)):
        raise UserError(f"{folder / META} is not the training state this framework writes",
                        hint="the sharded checkpoint is damaged; resume from a copy or start a new run")
    prefixes = (MODEL_PREFIX, OPTIM_PREFIX) if optimizer else (MODEL_PREFIX,)
    tensors = {prefix + name: torch.empty(size, dtype=dtype)
               for prefix in prefixes for name, (size, dtype) in tensor_shapes(folder, prefix).items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(tensors, folder, no_dist=True)
    model_state, optimizer_state = unflatten(tensors)
    payload["model"] = model_state
    if optimizer:
        payload["optimizer"] = {"state": optimizer_state, "param_groups": groups}
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
