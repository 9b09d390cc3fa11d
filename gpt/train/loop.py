"""The training loop: data, model, AdamW, evaluation, checkpoints, signals, numerical faults, TensorBoard.

One optimizer step = ``grad_accum`` micro-steps of ``batch_size`` sequences on each of ``world_size``
processes. The micro-batches of a step come, in order, from one stream of random windows shared by all
ranks (rank r takes every world_size-th), and the loss is scaled by 1 / grad_accum while DDP averages
over ranks: N processes with grad_accum=1 compute the gradient of one process with grad_accum=N.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm import tqdm

from gpt import attention, pretrained
from gpt.config import GPTConfig
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.data.sampler import make_sampler
from gpt.device import autocast, resolve_device, resolve_precision
from gpt.errors import UserError
from gpt.model import GPT
from gpt.schema import model_config
from gpt.train import checkpoint, distributed, metrics, visuals
from gpt.train.config import TrainConfig
from gpt.train.distributed import Dist
from gpt.train.optim import learning_rate, make_optimizer
from gpt.train.signals import StopRequest

SUMMARY_FILE = "summary.json"


@dataclass
class Summary:
    params: int
    step: int  # optimizer steps done
    tokens: int
    best_val_loss: float
    final_train_loss: float  # of the last evaluation
    final_val_loss: float
    tokens_per_sec: float  # over the training steps of this invocation, but its first
    peak_memory_bytes: int
    wall_s: float
    ckpt: Path
    interrupted: bool = False
    resume_command: str = ""


class Stop(Exception):
    """An agreed stop of all ranks: rank 0 reports it as a UserError, the others exit quietly."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@torch.no_grad()
def evaluate(model: nn.Module, data: TokenData, cfg: TrainConfig, block_size: int, seed: int, device, ctx,
             d: Dist) -> dict[str, float]:
    """Mean loss over the same eval_iters batches of each split at every evaluation, shared among ranks."""
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    out = {}
    for split in ("train", "val"):
        total = torch.zeros(2, device=device)  # loss sum, batch count
        for i in range(cfg.eval_iters):
            starts = data.random_starts(split, cfg.batch_size, block_size, gen)
            if i % d.world_size != d.rank:
                continue
            x, y = data.windows(split, starts, block_size, device)
            with ctx:
                _, loss = model(x, y)
            total[0] += loss.float()
            total[1] += 1
        distributed.all_reduce_sum(total, d)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot run here, or None when it can."""
    if not hasattr(torch, "compile"):
        return "this PyTorch has no torch.compile"
    import torch._dynamo as dynamo

    if not dynamo.is_dynamo_supported():
        return f"TorchDynamo does not support Python {sys.version_info.major}.{sys.version_info.minor}"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed"
    elif device.type == "cpu" and not any(shutil.which(cc) for cc in ("cc", "gcc", "clang", "c++", "g++")):
        return "no C/C++ compiler found"
    return None


def maybe_compile(model: nn.Module, enabled: bool, device: torch.device, log: Callable[[str], None]) -> nn.Module:
    """torch.compile(model) when asked and possible; otherwise the model itself, saying why once."""
    if not enabled:
        return model
    reason = compile_unavailable(device)
    if reason:
        log(f"train.compile=true but torch.compile is unavailable ({reason}): running eager")
        return model
    log("compiling the model with torch.compile (the first steps are slow)")
    return torch.compile(model)


def resume_command(overrides: list[str], run_dir: Path, script: str) -> str:
    """The command line that continues this run: same overrides, out_dir pinned, resume=true."""
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("out_dir", "resume")]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nodes = world // max(local, 1)
        launch = f"torchrun --nproc_per_node={local}" + (f" --nnodes={nodes} <same rendezvous options>" if nodes > 1 else "")
    else:
        launch = "python"
    return " ".join([launch, script, *map(shlex.quote, keep), shlex.quote(f"out_dir={run_dir}"), "resume=true"])


def file_logged(log: Callable[[str], None], path: Path) -> Callable[[str], None]:
    """``log`` that also appends each message to ``path`` (the run's train.log)."""

    def both(message: str) -> None:
        log(message)
        with open(path, "a", encoding="utf-8") as f:
            f.write(message + "\n")

    return both


def record_config(run_dir: Path, cfg: DictConfig, overrides: list[str], resumed: bool) -> None:
    """Save the composed config and the command-line overrides in run_dir/.hydra/ (a resume in a subfolder).

    Written here, once the config has passed every check, rather than by Hydra at start-up: a
    mistyped command aimed at an existing run must not overwrite that run's record.
    """
    folder = run_dir / ".hydra"
    if resumed:
        folder = folder / time.strftime("resume-%Y-%m-%d_%H-%M-%S")
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), folder / "overrides.yaml")


def train(cfg: DictConfig, run_dir: Path, log: Callable[[str], None] = print, overrides: list[str] | None = None,
          script: str = "scripts/train.py") -> Summary:
    """Train the model described by a composed train config, writing everything into run_dir.

    Under torchrun, every rank calls this; rank 0's run_dir is used by all and only rank 0 writes.
    """
    tcfg = TrainConfig(**OmegaConf.to_container(cfg.train, resolve=True))
    tcfg.validate()
    model_config(cfg.model, vocab_size=1)  # refuse a bad model config now, not after preparing the data
    device = resolve_device(cfg.device.type)
    attention.check_trainable(cfg.model.attention, device, cfg.model.dropout)
    precision = resolve_precision(cfg.precision, device)
    d, device = distributed.setup(device)
    try:
        return _train(cfg, tcfg, Path(distributed.broadcast(str(run_dir), d)), device, precision, d,
                      log if d.is_main else (lambda msg: None), overrides or [], script)
    except Stop as stop:
        if d.is_main:
            raise UserError(str(stop), hint=stop.hint) from None
        raise SystemExit(2) from None
    finally:
        distributed.cleanup(d)


def _train(cfg: DictConfig, tcfg: TrainConfig, run_dir: Path, device: torch.device, precision: str, d: Dist,
           log: Callable[[str], None], overrides: list[str], script: str) -> Summary:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.tensorboard import SummaryWriter  # imported late: tensorboard is slow to import

    t_start = time.time()
    # data: prepared once per node (the first local rank), then read by all
    data_cfg = DataConfig(**OmegaConf.to_container(cfg.data, resolve=True))
    if d.local_rank == 0:
        data_dir = prepare(data_cfg, log=log)
    distributed.barrier(d)
    if d.local_rank != 0:
        data_dir = prepare(data_cfg, log=lambda msg: None)
    data = TokenData(data_dir)
    mcfg: GPTConfig = model_config(cfg.model, data.tokenizer.vocab_size)
    init_state = None
    if cfg.init_from:  # fine-tuning: the architecture comes with the weights, dropout and kernel from this run
        init_config, init_state, init_tokenizer = pretrained.load_weights(cfg.init_from, cfg.init_path)
        if init_tokenizer != data.tokenizer.to_meta():  # every rank sees the same: a Stop all agree on
            raise Stop(
                f"init_from={cfg.init_from} uses a different tokenizer ({init_tokenizer.get('kind')}, "
                f"{init_tokenizer.get('vocab_size')} tokens) than the data {data_dir} "
                f"({data.tokenizer.kind}, {data.tokenizer.vocab_size} tokens)",
                hint="prepare the data with the model's tokenizer (e.g. data.tokenizer=gpt2 for GPT-2 weights)",
            )
        mcfg = replace(init_config, dropout=mcfg.dropout, attention=mcfg.attention,
                       attention_backend=mcfg.attention_backend)
        log(f"initialised from {cfg.init_from}: model.* sizes come from its weights")
    data.check_block_size(mcfg.block_size)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats(device)

    # what to resume from: rank 0 decides, every rank gets the same answer
    resolved = OmegaConf.to_container(cfg, resolve=True)
    state = distributed.broadcast(_resume_state(cfg, run_dir, mcfg, resolved, log) if d.is_main else None, d)
    if isinstance(state, Stop):
        raise state

    torch.manual_seed(cfg.seed)
    raw_model = GPT(mcfg).to(device)
    if d.rank > 0:  # each rank its own dropout masks; initial weights are rank 0's (as DDP broadcasts them)
        torch.manual_seed(cfg.seed + d.rank)
    random.seed(cfg.seed + d.rank)
    np.random.seed(cfg.seed + d.rank)
    optimizer = make_optimizer(raw_model, tcfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    sampler = make_sampler(data_cfg.sampling, data, tcfg.batch_size, mcfg.block_size, cfg.seed, d.rank, d.world_size)
    step, evaluated, best_val, skipped, last_eval = 0, False, math.inf, 0, {}
    resumed = state is not None
    if resumed:
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:
            scaler.load_state_dict(state["scaler"])
        sampler.load_state_dict(state["data"])
        rngs = state["rng"]
        if len(rngs) == d.world_size:
            checkpoint.set_rng_state(rngs[d.rank])
        else:
            log(f"note: the checkpoint was written by {len(rngs)} process(es), this run has {d.world_size}: "
                "dropout randomness is reseeded (the data order continues exactly)")
        step, evaluated, best_val = state["step"], state["evaluated"], state["best_val_loss"]
        skipped, last_eval = state["skipped"], state["eval"]
        log(f"resumed from {run_dir / checkpoint.LATEST} at step {step}")
    elif init_state is not None:
        raw_model.load_state_dict(init_state)
    del state, init_state

    model = maybe_compile(raw_model, tcfg.compile, device, log)  # for evaluation: no DDP collectives
    train_model = DDP(model, device_ids=[d.local_rank] if device.type == "cuda" else None) if d.enabled else model
    ctx = autocast(device, precision)

    writer = None
    if d.is_main:
        record_config(run_dir, cfg, overrides, resumed)
        log = file_logged(log, run_dir / "train.log")
        # a resumed run rewrites what the interrupted one logged after its checkpoint: TensorBoard drops that
        writer = SummaryWriter(log_dir=str(run_dir), purge_step=step + 1 if resumed else None)
        visuals.log_config(writer, cfg, resolved)
    tokens_per_step = tcfg.batch_size * tcfg.grad_accum * d.world_size * mcfg.block_size
    n_params = raw_model.num_params()
    peak = metrics.peak_flops(device, precision)
    fused = bool(optimizer.defaults.get("fused"))
    log(
        f"model: {n_params / 1e6:.2f}M parameters ({mcfg.n_layer} layers, {mcfg.n_head} heads, "
        f"{mcfg.n_embd} wide, context {mcfg.block_size}, attention={mcfg.attention}); "
        f"device {device} x {d.world_size} ({precision}{', fused AdamW' if fused else ''})\n"
        f"batch: {tcfg.batch_size} sequences x {tcfg.grad_accum} micro-steps x {d.world_size} process(es) "
        f"x {mcfg.block_size} tokens = {tokens_per_step:,} tokens per optimizer step"
    )

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        return data.windows("train", sampler.next(), mcfg.block_size, device)

    def save(evaluated_here: bool, best: bool) -> None:
        """Checkpoint the state after ``step`` optimizer steps; every rank takes part (RNG states)."""
        rngs = distributed.gather(checkpoint.rng_state(), d)
        error = None
        if d.is_main:
            common = {
                "model": raw_model.state_dict(),  # uncompiled, unwrapped names
                "model_config": mcfg.to_dict(),
                "tokenizer": data.tokenizer.to_meta(),
                "step": step,
                "best_val_loss": best_val,
                "config": resolved,
            }
            try:
                checkpoint.save({
                    **common,
                    "evaluated": evaluated_here,
                    "eval": last_eval,
                    "skipped": skipped,
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "rng": rngs,
                    "data": sampler.state_dict(),
                    "world_size": d.world_size,
                }, run_dir / checkpoint.LATEST)
                if best:
                    checkpoint.save(common, run_dir / checkpoint.BEST)
            except UserError as err:
                error = Stop(str(err), err.hint)
        error = distributed.broadcast(error, d)
        if error is not None:
            raise error

    interactive = d.is_main and sys.stderr.isatty()
    bar = tqdm(total=tcfg.max_iters, initial=step, disable=not interactive, unit="step", dynamic_ncols=True)
    say = bar.write if interactive else log
    steps_run, train_time = 0, 0.0
    t_log, steps_since_log = time.time(), 0
    stopped_by: str | None = None
    compiled_first_step = tcfg.compile and model is not raw_model
    with StopRequest(verbose=d.is_main) as stop_request:
        while True:
            if (step % tcfg.eval_interval == 0 or step == tcfg.max_iters) and not evaluated:
                losses = evaluate(model, data, tcfg, mcfg.block_size, cfg.seed, device, ctx, d)
                if not all(math.isfinite(v) for v in losses.values()):
                    raise Stop(f"non-finite evaluation loss at step {step} (train {losses['train']}, val {losses['val']}); "
                               f"stopped without saving: {run_dir / checkpoint.LATEST} holds the last good state",
                               hint="lower train.learning_rate or raise train.warmup_iters, then resume=true")
                last_eval = losses
                improved = losses["val"] < best_val
                best_val = min(best_val, losses["val"])
                if writer is not None:
                    writer.add_scalar("val/loss", losses["val"], step)
                    writer.add_scalar("train/eval_loss", losses["train"], step)
                    visuals.log_samples(writer, raw_model, data, tcfg.sample_tokens, cfg.seed, device, ctx, step)
                save(evaluated_here=True, best=improved)
                say(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                t_log, steps_since_log = time.time(), 0
            evaluated = False
            if step >= tcfg.max_iters:
                break

            t0 = time.time()
            lr = learning_rate(step, tcfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(tcfg.grad_accum):
                x, y = next_batch()
                sync = train_model.no_sync() if d.enabled and micro < tcfg.grad_accum - 1 else contextlib.nullcontext()
                with sync:
                    try:
                        with ctx:
                            _, loss = train_model(x, y)
                    except Exception as err:  # a compiler failure on first use: say so once, go eager
                        if not compiled_first_step:
                            raise
                        log(f"torch.compile failed ({type(err).__name__}: {str(err).splitlines()[0][:200]}): running eager")
                        model = raw_model
                        train_model = DDP(model, device_ids=[d.local_rank] if device.type == "cuda" else None) if d.enabled else model
                        with ctx:
                            _, loss = train_model(x, y)
                    compiled_first_step = False
                    scaler.scale(loss / tcfg.grad_accum).backward()
                loss_sum += loss.detach().float()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip or math.inf)
            # one agreement per step (and one host sync): mean loss, any non-finite value, any stop signal
            nonfinite = ~torch.isfinite(loss_sum)
            if precision != "fp16":  # with fp16 the GradScaler skips overflowing gradients itself
                nonfinite |= ~torch.isfinite(grad_norm)
            stats = torch.stack([
                loss_sum / tcfg.grad_accum,
                nonfinite.float(),
                torch.tensor(float(stop_request.requested is not None), device=device),
            ])
            distributed.all_reduce_sum(stats, d)
            loss_total, nonfinite_count, signal_count, grad_norm_f = torch.cat([stats, grad_norm.reshape(1).float()]).tolist()
            train_loss, nonfinite, signalled = loss_total / d.world_size, nonfinite_count > 0, signal_count > 0
            if nonfinite:
                what = f"loss {train_loss}" if not math.isfinite(train_loss) else f"gradient norm {grad_norm_f}"
                optimizer.zero_grad(set_to_none=True)
                scaler.update()
                if skipped >= tcfg.skip_nonfinite:
                    raise Stop(
                        f"non-finite {what} at step {step + 1}; stopped without saving it: "
                        f"{run_dir / checkpoint.LATEST} holds the last good state"
                        + (f" ({skipped} such step(s) skipped before)" if skipped else ""),
                        hint="lower train.learning_rate or raise train.warmup_iters and resume with resume=true, "
                             "or let train.skip_nonfinite=N skip up to N such steps",
                    )
                skipped += 1
                say(f"step {step + 1}: non-finite {what}, update skipped ({skipped} of train.skip_nonfinite={tcfg.skip_nonfinite})")
            else:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            step += 1
            steps_run += 1
            steps_since_log += 1
            if steps_run > 1:  # the first step (compilation, warm-up) is left out of the run's tokens/s
                train_time += time.time() - t0

            if step % tcfg.log_interval == 0 or step == tcfg.max_iters:
                elapsed = time.time() - t_log
                tok_s = steps_since_log * tokens_per_step / max(elapsed, 1e-9)
                mfu = metrics.mfu(tok_s / d.world_size, mcfg, n_params, peak)
                t_log, steps_since_log = time.time(), 0
                if writer is not None:
                    writer.add_scalar("train/loss", train_loss, step)
                    writer.add_scalar("lr", lr, step)
                    writer.add_scalar("grad_norm", grad_norm_f, step)
                    writer.add_scalar("tokens_per_sec", tok_s, step)
                    if mfu is not None:
                        writer.add_scalar("mfu", mfu, step)
                if interactive:
                    bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
                else:
                    eta = (tcfg.max_iters - step) * train_time / max(steps_run - 1, 1)
                    log(f"step {step}/{tcfg.max_iters}: loss {train_loss:.4f}, lr {lr:.2e}, grad norm {grad_norm_f:.3f}, "
                        f"{tok_s:,.0f} tok/s" + (f", mfu {mfu:.1%}" if mfu is not None else "")
                        + f", eta {_duration(eta)}")
            bar.update(1)
            if signalled:
                stopped_by = stop_request.requested or "a signal on another rank"
                save(evaluated_here=False, best=False)
                break
    bar.close()

    summary = Summary(
        params=n_params,
        step=step,
        tokens=step * tokens_per_step,
        best_val_loss=best_val,
        final_train_loss=last_eval.get("train", math.nan),
        final_val_loss=last_eval.get("val", math.nan),
        tokens_per_sec=(steps_run - 1) * tokens_per_step / train_time if train_time > 0 else 0.0,
        peak_memory_bytes=metrics.peak_memory_bytes(device),
        wall_s=time.time() - t_start,
        ckpt=run_dir / checkpoint.LATEST,
        interrupted=stopped_by is not None,
        resume_command=resume_command(overrides, run_dir, script),
    )
    if not d.is_main:
        return summary
    assert writer is not None
    writer.close()
    record = {**asdict(summary), "ckpt": str(summary.ckpt), "overrides": overrides, "attention": mcfg.attention,
              "device": str(device), "precision": precision, "world_size": d.world_size}
    (run_dir / SUMMARY_FILE).write_text(json.dumps(record, indent=2) + "\n")
    if stopped_by is not None:
        log(f"stopped by {stopped_by} after step {step}; checkpoint saved: {summary.ckpt}\n"
            f"resume with: {summary.resume_command}")
        return summary
    if tcfg.sample_tokens > 0:
        raw_model.eval()
        log("sample:\n" + visuals.sample_text(raw_model, data, "", tcfg.sample_tokens, cfg.seed, device, ctx) + "\n" + "-" * 40)
    log(
        f"done: {n_params / 1e6:.2f}M parameters, {summary.tokens:,} tokens seen, "
        f"best val loss {summary.best_val_loss:.4f}, {summary.tokens_per_sec:,.0f} tokens/s, "
        f"{summary.wall_s:.0f}s wall time\n"
        f"checkpoint: {summary.ckpt} (best: {run_dir / checkpoint.BEST})\n"
        f"sample from it: python scripts/generate.py ckpt={run_dir}"
    )
    return summary


def _resume_state(cfg: DictConfig, run_dir: Path, mcfg: GPTConfig, resolved: dict, log) -> dict | Stop | None:
    """Rank 0: the state to resume from (None: start afresh), or the Stop that refuses (sent to all ranks).

    Also makes sure run_dir can be created and written, before anything is written there.
    """
    try:
        state = checkpoint.resume_state(run_dir, cfg.resume, mcfg.to_dict(), resolved, log)
        run_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(run_dir, os.W_OK):
            raise PermissionError(13, "Permission denied")
        return state
    except UserError as err:
        return Stop(str(err), err.hint)
    except OSError as err:
        return Stop(f"out_dir {str(run_dir)!r} cannot be written: {err.strerror or err}",
                    "choose another out_dir=, a folder you can write to")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
