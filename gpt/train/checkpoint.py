"""Checkpoints: plain tensors and Python values only (loadable with weights_only=True), written atomically."""

from __future__ import annotations

import io
import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
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
