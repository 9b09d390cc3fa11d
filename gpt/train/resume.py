"""Resuming a run: whether out_dir's checkpoint may be continued, and the command line that continues it."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpt.errors import UserError
from gpt.files import load_archive
from gpt.model.config import GPTConfig
from gpt.tokenizers.tokenizer import describe
from gpt.train.distributed import env_local_world_size, env_world_size
from gpt.weights import checkpoint, sharded

RUN_FILES = (checkpoint.LATEST, checkpoint.BEST, "summary.json", "train.log")  # the files a run writes
TRAINING_ENTRIES = ("optimizer", "rng", "data", "step")  # without them a checkpoint can be sampled, not resumed


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {"a.b.c": value}."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def resume_state(run_dir: Path, resume: bool, model_config: GPTConfig, tokenizer: dict[str, Any],
                 config: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any] | None:
    """The training state in run_dir to continue from, or None to start afresh; UserError when refused.

    Without ``resume``, an existing checkpoint is refused (it would be overwritten). With it, a missing
    checkpoint means starting from step 0 (a run killed before its first save), and a checkpoint whose
    model has another shape, or whose tokenizer is not the data's, is refused, naming what differs. Other
    changed settings are logged.
    """
    path = checkpoint.latest(run_dir)
    if path is None:
        if resume:
            log(f"resume=true but {run_dir} holds no {checkpoint.LATEST} yet: starting from step 0")
        return None
    if not resume:
        raise UserError(f"{run_dir} already holds a checkpoint ({path.relative_to(run_dir)}) from an earlier run",
                        hint="pass resume=true to continue it, or choose another out_dir")
    return checked_state(path, model_config, tokenizer, config, log)


def checked_state(path: Path, model_config: GPTConfig, tokenizer: dict[str, Any], config: dict[str, Any],
                  log: Callable[[str], None], verb: str = "resume") -> dict[str, Any]:
    """The training state of a checkpoint file or sharded step folder, refused (UserError) when this run cannot
    continue it: no training entries, another model shape, another tokenizer, another optimizer, damaged entries.
    Other changed settings are logged. ``verb`` names what the run does with it in the messages."""
    state = checkpoint.load(path) if path.is_file() else sharded_state(path)
    missing = [k for k in TRAINING_ENTRIES if k not in state]
    if missing:
        raise UserError(f"{path} holds no training state ({', '.join(missing)} missing), so it cannot be resumed",
                        hint="it can still be sampled from with scripts/generate.py")
    checkpoint.read_model(state, path)  # its entries' types and the weights' shapes, before comparing them
    diffs = model_config.shape_differences(state["model_config"])
    if diffs:
        raise UserError(f"cannot {verb} {path} with a model of another shape: {'; '.join(diffs)}",
                        hint="use the run's model settings, or start a new run in another out_dir")
    if state.get("tokenizer") != tokenizer:
        raise UserError(f"cannot {verb} {path}: its tokenizer ({_describe(state.get('tokenizer'))}) is not the "
                        f"data's ({_describe(tokenizer)})", hint="use the data.* settings the run was trained with")
    check_training_entries(state, path)
    before = flatten(state.get("config") if isinstance(state.get("config"), dict) else {})
    now = flatten(config)
    optimizer = before.get("train.optimizer", "adamw")  # checkpoints from before train.optimizer: AdamW
    if optimizer != now.get("train.optimizer"):
        raise UserError(f"cannot {verb} {path} with train.optimizer={now.get('train.optimizer')}: it was trained "
                        f"with train.optimizer={optimizer} (the optimizer's state would not fit)",
                        hint=f"add train.optimizer={optimizer} (or the run's recipe=), or start a new run")
    alpha = before.get("chat.lora_alpha")
    if "adapter" in state and alpha is not None and alpha != now.get("chat.lora_alpha"):
        raise UserError(f"cannot {verb} {path} with chat.lora_alpha={now.get('chat.lora_alpha')}: its adapters were "
                        f"trained with chat.lora_alpha={alpha} (they would compute another model)",
                        hint=f"add chat.lora_alpha={alpha}, or start a new run")
    if "sharded" in state:
        del state["model"]  # its shapes are checked; every rank reads its own part of the tensors
    changed = [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(before) | set(now))
               if k not in ("out_dir", "resume", "decay_from") and before.get(k) != now.get(k)]
    if changed:
        log(f"note: {'resuming' if verb == 'resume' else 'decaying'} with changed settings: " + "; ".join(changed))
    return state


def sharded_state(folder: Path) -> dict[str, Any]:
    """A sharded step folder's training entries (meta.pt) with its model tensors' names and shapes (on the meta
    device: checked like a whole checkpoint's, read later by every rank) and the folder to read them from."""
    state = load_archive(folder / sharded.META)
    if not isinstance(state, dict):
        raise UserError(f"{folder / sharded.META} is not a checkpoint written by this framework")
    state["model"] = {name: torch.empty(size, dtype=dtype, device="meta")
                      for name, (size, dtype) in sharded.tensor_shapes(folder, sharded.MODEL_PREFIX).items()}
    state["sharded"] = str(folder)
    return state


def _describe(tokenizer: Any) -> str:
    same_size = "; a vocabulary of the same size can still differ" if isinstance(tokenizer, dict) and \
        tokenizer.get("kind") == "char" else ""
    return f"{describe(tokenizer)}{same_size}"


# The type of each training entry, and of each RNG state's parts: a checkpoint that disagrees is refused.
ENTRY_TYPES = {"step": int, "best_val_loss": float, "evaluated": bool, "eval": dict, "skipped": int,
               "optimizer": dict, "scaler": dict, "rng": list, "data": dict}
RNG_TYPES = {"python": list, "numpy": dict, "torch": torch.Tensor, "cuda": list}


def check_training_entries(state: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose training entries have the wrong types, naming the entry."""
    problems = [name for name, kind in ENTRY_TYPES.items()
                if not isinstance(state.get(name), kind) or (kind is int and isinstance(state.get(name), bool))]
    if not problems:
        generator = state["data"].get("train_generator")
        random_sampler = state["data"].get("kind", "random") == "random"
        if random_sampler and (not isinstance(generator, torch.Tensor) or generator.dtype != torch.uint8):
            problems.append("data.train_generator")
        for i, rng in enumerate(state["rng"]):
            if not isinstance(rng, dict) or any(not isinstance(rng.get(k), t) for k, t in RNG_TYPES.items()):
                problems.append(f"rng[{i}]")
            elif rng["torch"].dtype != torch.uint8 or not isinstance(rng["numpy"].get("keys"), torch.Tensor):
                problems.append(f"rng[{i}]")
    if problems:
        raise UserError(f"{path} cannot be resumed: its {problems[0]} entry has the wrong type or is missing",
                        hint="the checkpoint is damaged; resume from a good copy or start a new run")


def open_run_dir(run_dir: Path, resume: bool, model_config: GPTConfig, tokenizer: dict[str, Any],
                 config: dict[str, Any], lock: checkpoint.FolderLock, log: Callable[[str], None],
                 decay_from: Path | None = None) -> tuple[dict[str, Any] | None, Path | None]:
    """Rank 0: the state to continue (None: afresh) and where it comes from, with run_dir created, writable and
    locked for this run. The state is run_dir's own (resume=true), else that of ``decay_from`` (gpt.train.decay)."""
    for name in RUN_FILES:  # refused now, not when the first save fails after training
        if (run_dir / name).exists() and not (run_dir / name).is_file():
            raise UserError(f"{run_dir / name} is a folder, where the run writes its {name} file",
                            hint="move it away, or choose another out_dir")
    state = resume_state(run_dir, resume, model_config, tokenizer, config, log)
    source = checkpoint.latest(run_dir) if state is not None else None
    if state is None and decay_from is not None:
        state, source = checked_state(decay_from, model_config, tokenizer, config, log, verb="decay from"), decay_from
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(run_dir, os.W_OK):
            raise PermissionError(13, "Permission denied")
        lock.acquire()
    except OSError as err:
        raise UserError(f"out_dir {str(run_dir)!r} cannot be written: {err.strerror or err}",
                        hint="choose another out_dir=, a folder you can write to") from None
    lock.remove_stale_temporaries()
    sharded.remove_uncommitted(run_dir)  # step folders of a save cut short
    return state, source


def resume_command(overrides: list[str], run_dir: Path, script: str) -> str:
    """The command line that continues this run: same overrides, out_dir pinned, resume=true."""
    return _command(overrides, script, [f"out_dir={run_dir}", "resume=true"])


def decay_command(overrides: list[str], kept: Path, out_dir: Path, script: str) -> str:
    """The command line that finishes a model from a kept checkpoint of this WSD run (gpt.train.decay)."""
    return _command(overrides, script, [f"decay_from={kept}", f"out_dir={out_dir}"],
                    drop=("train.max_iters", "train.keep_checkpoints"))


def _command(overrides: list[str], script: str, pinned: list[str], drop: tuple[str, ...] = ()) -> str:
    """This launch's command (python, or torchrun with its process counts) with the overrides, those of ``pinned``'s
    keys (and resume, decay_from, ``drop``) replaced by ``pinned``."""
    replaced = {"out_dir", "resume", "decay_from", *drop} | {p.split("=", 1)[0] for p in pinned}
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in replaced]
    world = env_world_size()
    if world > 1:
        local = env_local_world_size()
        nodes = world // max(local, 1)
        launch = f"torchrun --nproc_per_node={local}"
        if nodes > 1:
            launch += f" --nnodes={nodes} <same rendezvous options>"
    else:
        launch = "python"
    return " ".join([launch, script, *map(shlex.quote, keep), *map(shlex.quote, pinned)])
