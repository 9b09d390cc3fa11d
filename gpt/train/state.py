"""The training state that a resumed run continues from, saving and loading itself.

Model, optimizer, gradient scaler, counters, the data position (the sampler that draws the training
windows) and every random generator of each process: restoring all of it makes a resumed run bitwise
identical to an uninterrupted one on CPU. The Checkpointer writes it (ckpt.pt from rank 0, or with FSDP a
sharded folder every rank writes its part of: gpt.weights.sharded) and the best model (best.pt) from rank 0.
"""

from __future__ import annotations

import math
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gpt.data.sampler import Sampler
from gpt.errors import UserError
from gpt.model.config import GPTConfig
from gpt.train import distributed, parallelize
from gpt.train.distributed import AbortRun, Ranks
from gpt.weights import checkpoint, lora, sharded
from gpt.weights.checkpoint import BEST

ADAPTER = "adapter.pt"  # a LoRA run's adapters alone (a few MB), beside ckpt.pt's merged weights


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
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])


def check_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                          source: Any) -> None:
    """Refuse an optimizer state this run's optimizer cannot take (other groups, a moment of another shape than its
    parameter: a tampered file, or adapters of another rank), naming the parameter; torch would fail at the first
    step with a RuntimeError. A state keyed by name (written under FSDP) is checked where its names are this model's."""
    hint = "the checkpoint is damaged or is not this run's; resume from a good copy or start a new run"
    groups, entries = state.get("param_groups"), state.get("state")
    if not isinstance(groups, list) or not isinstance(entries, dict) or \
            not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise UserError(f"{source}: its optimizer entry is damaged (no param_groups or state of the right types)",
                        hint=hint)
    names = {id(p): n for n, p in model.named_parameters()}
    if any(isinstance(key, str) for key in entries):
        params = dict(model.named_parameters())
    else:
        sizes, ours = [len(g["params"]) for g in groups], [len(g["params"]) for g in optimizer.param_groups]
        if sizes != ours:
            raise UserError(f"{source}: its optimizer holds parameter groups of {sizes} parameters, this run's "
                            f"optimizer {ours}", hint=hint)
        params = {saved: p for g, now in zip(groups, optimizer.param_groups) for saved, p in zip(g["params"],
                                                                                                 now["params"])}
    for key, moments in entries.items():
        param = params.get(key)
        if param is None or not isinstance(moments, dict):
            if isinstance(key, str):
                continue  # not this model's name (a wrapper's prefix): torch's own loading decides
            raise UserError(f"{source}: its optimizer state entry {key!r} is no parameter of this run", hint=hint)
        for field, value in moments.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise UserError(f"{source}: its optimizer's {field} of {names.get(id(param), key)} has shape "
                                f"{list(value.shape)}, the parameter {list(param.shape)}", hint=hint)


class TrainState:
    """Model, optimizer, scaler, counters and data position of a run, as one thing to save and restore."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 sampler: Sampler) -> None:
        self.model = model  # the plain model (not compiled, not wrapped): its names are the checkpoint's
        self.optimizer = optimizer
        self.scaler = scaler
        self.sampler = sampler  # draws the training windows: its state is the data position
        self.step = 0  # optimizer steps done
        self.evaluated = False  # whether the evaluation at `step` is done (a resumed run does not repeat it)
        self.best_val_loss = math.inf
        self.skipped = 0  # non-finite steps skipped so far
        self.last_eval: dict[str, float] = {}  # the latest evaluation's losses by split

    def state_dict(self, rngs: list[dict[str, Any]], sharded: bool = False) -> dict[str, Any]:
        """The training entries of a checkpoint; ``rngs`` holds every rank's RNG states, in rank order.

        ``sharded``: the optimizer's tensors are saved apart (gpt.weights.sharded); only its groups are here."""
        optimizer = ({"state": {}, "param_groups": parallelize.named_param_groups(self.model, self.optimizer)}
                     if sharded else parallelize.optimizer_state(self.model, self.optimizer))
        return {
            "step": self.step,
            "best_val_loss": self.best_val_loss,
            "evaluated": self.evaluated,
            "eval": self.last_eval,
            "skipped": self.skipped,
            "optimizer": optimizer,
            "scaler": self.scaler.state_dict(),
            "rng": rngs,
            "data": self.sampler.state_dict(),
            "world_size": len(rngs),
        }

    def load_state_dict(self, payload: dict[str, Any], ranks: Ranks, log: Callable[[str], None],
                        source: Any = "the checkpoint") -> None:
        """Continue from a checkpoint written by :class:`Checkpointer` (possibly by another number of ranks);
        ``source`` names it in errors."""
        if ("adapter" in payload) != lora.has_adapters(self.model):
            trained, this_run = ("with", "has none") if "adapter" in payload else ("without", "adds them")
            raise UserError(f"{source}: the checkpoint was trained {trained} LoRA adapters, this run {this_run}",
                            hint="resume with the run's chat.lora_rank, or start a new run from it with init_from")
        if "sharded" in payload:  # a sharded checkpoint's step folder: every rank reads its part
            parallelize.load_sharded(self.model, self.optimizer, payload["sharded"],
                                     payload["optimizer"]["param_groups"])
        elif lora.has_adapters(self.model):  # the base weights are init_from's, loaded already
            lora.load_adapter_state(self.model, payload.get("adapter"), str(source))
            check_optimizer_state(self.model, self.optimizer, payload["optimizer"], source)
            parallelize.load_optimizer_state(self.model, self.optimizer, payload["optimizer"])
        else:
            check_optimizer_state(self.model, self.optimizer, payload["optimizer"], source)
            parallelize.load_model_state(self.model, payload["model"])
            parallelize.load_optimizer_state(self.model, self.optimizer, payload["optimizer"])
        if payload["scaler"]:
            self.scaler.load_state_dict(payload["scaler"])
        self.sampler.load_state_dict(payload["data"])
        rngs = payload["rng"]
        if len(rngs) == ranks.world_size:
            set_rng_state(rngs[ranks.rank])
        else:
            log(f"note: the checkpoint was written by {len(rngs)} process(es), this run has {ranks.world_size}: "
                "dropout randomness is reseeded (the data order continues exactly)")
        self.step, self.evaluated, self.best_val_loss = payload["step"], payload["evaluated"], payload["best_val_loss"]
        self.skipped, self.last_eval = payload["skipped"], payload["eval"]


class Checkpointer:
    """Writes ckpt.pt (model and training state) and best.pt (the model alone) into run_dir from rank 0."""

    def __init__(self, run_dir: Path, ranks: Ranks, model_config: GPTConfig, tokenizer: dict[str, Any],
                 run_config: dict[str, Any]) -> None:
        self.run_dir, self.ranks = run_dir, ranks
        self.model_config, self.tokenizer, self.run_config = model_config, tokenizer, run_config

    @property
    def latest(self) -> Path:
        """The latest checkpoint written: ckpt.pt, or the committed sharded step folder."""
        return checkpoint.latest(self.run_dir) or self.run_dir / checkpoint.LATEST

    def save(self, state: TrainState, best: bool, keep: bool = False) -> None:
        """Checkpoint ``state``; every rank calls this (RNG states are gathered) and all see a failure.

        A sharded model (FSDP) is saved sharded, each rank writing its part (gpt.weights.sharded); otherwise
        rank 0 writes ckpt.pt. Either one replaces the other kind, so a run directory holds one latest state.
        ``keep``: also keep this one in run_dir/checkpoints/ (train.keep_checkpoints, for decay_from)."""
        rngs = distributed.gather(rng_state(), self.ranks)
        if parallelize.is_sharded(state.model):
            self._save_sharded(state, rngs)
            weights = parallelize.model_state(state.model) if best else None  # every rank takes part in gathering
        elif lora.has_adapters(state.model):  # the merged weights (a model anything loads) and the adapters apart
            weights, adapter = lora.merged_state(state.model), lora.adapter_state(state.model)
            training = {**state.state_dict(rngs), "adapter": adapter}
            self._main_writes(lambda: self._write_single(weights, state, training))
            self._main_writes(lambda: checkpoint.save({"adapter": adapter, "tokenizer": self.tokenizer,
                                                       "config": self.run_config}, self.run_dir / ADAPTER))
        else:
            weights, training = state.model.state_dict(), state.state_dict(rngs)
            self._main_writes(lambda: self._write_single(weights, state, training))
        if keep:
            self._main_writes(lambda: checkpoint.keep(self.run_dir, state.step))
        if best:
            self._main_writes(lambda: checkpoint.save(self._model_entries(weights, state), self.run_dir / BEST))

    def _write_single(self, weights: dict[str, torch.Tensor], state: TrainState, training: dict[str, Any]) -> None:
        """Rank 0: ckpt.pt, then no sharded checkpoint left beside it."""
        checkpoint.save({**self._model_entries(weights, state), **training}, self.run_dir / checkpoint.LATEST)
        shutil.rmtree(self.run_dir / sharded.ROOT, ignore_errors=True)

    def _save_sharded(self, state: TrainState, rngs: list[dict[str, Any]]) -> None:
        """DCP writes every rank's shards into a fresh step folder; rank 0 adds meta.pt, commits the folder and
        removes a ckpt.pt it supersedes."""
        import torch.distributed.checkpoint as dcp  # here: a single-process run never needs it

        folder = sharded.step_folder(self.run_dir, state.step)
        self._main_writes(lambda: _fresh_folder(folder))  # a save of this step cut short may have left one
        try:
            dcp.save(parallelize.sharded_tensors(state.model, state.optimizer), checkpoint_id=str(folder))
        except Exception as err:  # DCP gathers every rank's write result: all ranks see the failure
            raise AbortRun(f"could not write the sharded checkpoint {folder}: {str(err).splitlines()[0][:200]}",
                           hint=f"the previous checkpoint ({sharded.ROOT}/{sharded.POINTER}) is unchanged; "
                                "free disk space or pick another out_dir") from None
        meta = {**self._model_entries(None, state), **state.state_dict(rngs, sharded=True)}
        del meta["model"]  # its tensors are the shards

        def commit() -> None:
            checkpoint.save(meta, folder / sharded.META)
            sharded.commit(self.run_dir, folder)
            (self.run_dir / checkpoint.LATEST).unlink(missing_ok=True)

        self._main_writes(commit)

    def _model_entries(self, weights: dict[str, torch.Tensor] | None, state: TrainState) -> dict[str, Any]:
        return {**checkpoint.model_entries(weights, self.model_config, self.tokenizer),
                "step": state.step, "best_val_loss": state.best_val_loss, "config": self.run_config}

    def _main_writes(self, write: Callable[[], None]) -> None:
        """Run ``write`` on rank 0; a UserError there stops every rank (the broadcast is also a barrier)."""
        distributed.on_main(write, self.ranks)


def _fresh_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
