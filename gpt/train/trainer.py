"""The training loop as a Trainer of short named parts: set-up, train_step, evaluate, finish.

One optimizer step = ``grad_accum`` micro-steps of ``batch_size`` sequences on each of ``world_size``
processes. The micro-batches of a step come, in order, from one stream of random windows shared by all
ranks (rank r takes every world_size-th), and the loss is scaled by 1 / grad_accum while DDP averages
over ranks: N processes with grad_accum=1 compute the gradient of one process with grad_accum=N.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gpt import kernels
from gpt.device import autocast, configure_for_training, resolve_device, resolve_precision
from gpt.errors import UserError
from gpt.train import build, decay, distributed, metrics, optim, parallelize, visuals
from gpt.train.config import RunConfig
from gpt.train.distributed import AbortRun, Ranks
from gpt.train.evaluate import estimate_loss, val_metrics
from gpt.train.optim import learning_rate, set_learning_rate
from gpt.train.passkey_mix import PasskeyMix
from gpt.train.records import RunRecords, Summary
from gpt.train.resume import decay_command, open_run_dir, resume_command
from gpt.train.signals import SignalGuard
from gpt.train.state import Checkpointer
from gpt.weights import checkpoint, lora


def train(run: RunConfig, run_dir: Path, log: Callable[[str], None] = print, overrides: list[str] | None = None,
          script: str = "scripts/train.py", resume_hint: str | None = None) -> Summary:
    """Train the model a RunConfig describes, writing everything into run_dir; an interrupted run tells how to
    resume it (``resume_hint``, or ``script`` with this launch's overrides, out_dir and resume=true).

    Under torchrun, every rank calls this; rank 0's run_dir is used by all and only rank 0 writes.
    """
    device = resolve_device(run.device.type)
    kernels.check_trainable(run.model.attention, device, run.model.dropout)
    precision = resolve_precision(run.precision, device)
    ranks, device = distributed.setup(device)
    run_dir = Path(distributed.broadcast(str(run_dir), ranks))
    lock = checkpoint.FolderLock(run_dir, "another training run")  # taken by rank 0 once the checks pass
    try:
        trainer = Trainer(run, run_dir, ranks, device, precision, lock, log if ranks.is_main else (lambda m: None))
        return trainer.train(overrides or [], script, resume_hint)
    except AbortRun:
        if ranks.is_main:
            raise
        raise SystemExit(2) from None
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        raise out_of_memory(err, run, device) from None
    finally:
        lock.release()  # the process group stays: torchrun workers end through distributed.run_worker


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(err)


def out_of_memory(err: BaseException, run: RunConfig, device: torch.device) -> UserError:
    """An allocator failure as a user error naming the sizes involved."""
    text, m, t = str(err), run.model, run.train
    return UserError(
        f"out of memory on {device} ({text.splitlines()[0][:160] if text else type(err).__name__}) with "
        f"{m.n_layer} layers x {m.n_embd} wide, {t.batch_size} sequences x {m.block_size} tokens per micro-step",
        hint="lower train.batch_size and raise train.grad_accum (same tokens per step), or use a smaller model")


@dataclass
class StepResult:
    """What every rank agreed on after one optimizer step."""

    loss: float  # mean over micro-steps and ranks
    grad_norm: float  # before clipping
    lr: float
    signalled: bool  # a stop signal reached some rank
    out_of_time: bool = False  # train.max_seconds has passed on some rank


class Trainer:
    """Owns a run's parts (data, training state, checkpointer, records) and steps them to max_iters.

    Its settings, one name each: ``run`` the whole RunConfig, ``train_config`` its TrainConfig (``run.train``),
    ``model_config`` the model's GPTConfig, ``run_record`` the RunConfig as plain data (config.yaml, checkpoints).
    """

    def __init__(self, run: RunConfig, run_dir: Path, ranks: Ranks, device: torch.device, precision: str,
                 lock: checkpoint.FolderLock, log: Callable[[str], None]) -> None:
        self.run_dir, self.ranks = run_dir, ranks
        self.device, self.precision, self.autocast = device, precision, autocast(device, precision)  # for sampling
        self.started = time.time()
        decay_source = None
        if run.decay_from is not None:  # the run ends where a WSD run decaying from that checkpoint ends
            run, decay_source = self._on_main(lambda: decay.plan(run, log))
        self.run, self.train_config = run, run.train
        self.records = RunRecords(run_dir, log, enabled=ranks.is_main)
        self.run_record = asdict(run)
        self.data = build.load_data(run, ranks, log)
        self.model_config, init_weights = build.model_config(run, self.data, log)
        self.data.check_block_size(self.model_config.block_size)
        self.passkey = (PasskeyMix(self.train_config.passkey, self.train_config.batch_size,
                                   self.model_config.block_size, self.data.tokenizer, run.seed,
                                   self.train_config.passkey_weight)
                        if self.train_config.passkey else None)
        parallelize.check_fsdp(self.train_config, precision, ranks)
        build.check_fits(self.model_config, self.train_config, precision, device, ranks)  # before any allocation
        self.forward_context = build.forward_context(self.model_config, device, precision)  # autocast, SDPA backends
        configure_for_training(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        tokenizer = self.data.tokenizer.to_meta()
        resume_from, source = self._on_main(lambda: open_run_dir(
            run_dir, run.resume, self.model_config, tokenizer, self.run_record, lock, log, decay_source))
        self.resumed = resume_from is not None
        self.out_of_time = False  # train.max_seconds passed (agreed by all ranks at the last step)
        self.state = build.initial_state(self.model_config, run, self.data, precision, device, ranks, init_weights)
        if run.chat.lora_rank:
            init_weights = None  # the base of the adapters, loaded
            log(lora.describe(self.state.model))
        if resume_from is not None:
            self.state.load_state_dict(resume_from, ranks, log, source)
            how = "decaying" if source == decay_source else "resumed"
            log(f"{how} from {source} at step {self.state.step}")
        elif init_weights is not None:
            parallelize.load_model_state(self.state.model, init_weights)
        del resume_from, init_weights
        self.model = build.maybe_compile(self.state.model, self.train_config.compile, device, log)  # evaluation: no DDP
        self.train_model = build.data_parallel(self.model, device, ranks)
        self.compiled_first_step = self.model is not self.state.model
        self.checkpointer = Checkpointer(run_dir, ranks, self.model_config, tokenizer, self.run_record)
        self.tokens_per_step = (self.train_config.batch_size * self.train_config.grad_accum * ranks.world_size
                                * self.model_config.block_size)
        self.throughput = metrics.Throughput(self.tokens_per_step)
        self.n_params = self.state.model.num_params()
        self.params = list(self.state.model.parameters())  # clipped every step: listed once
        self.ahead: tuple[list[int], tuple] | None = None  # next micro-batch, read early
        self.peak_flops = metrics.peak_flops(device, precision)

    def _on_main(self, fn: Callable[[], Any]) -> Any:
        """Rank 0's result of ``fn``, on every rank; a UserError there stops every rank."""
        return distributed.on_main(fn, self.ranks)

    def train(self, overrides: list[str], script: str, resume_hint: str | None = None) -> Summary:
        """Evaluate when due and step until max_iters or a stop signal; then the summary and a sample."""
        self.records.open(self.run_record, overrides, self.resumed, self.state.step, self.train_config.max_iters)
        self.records.log(self.describe())
        interrupted_by = None
        try:
            with SignalGuard(verbose=self.ranks.is_main) as signals:
                while True:
                    if self.evaluation_due() and not self.evaluate(signals):  # a stop signal during it
                        interrupted_by = signals.received or "a signal on another rank"
                        self.checkpointer.save(self.state, best=False)
                        break
                    if self.state.step >= self.train_config.max_iters or self.out_of_time:
                        break
                    result = self.train_step(signals)
                    self.report(result)
                    self.out_of_time = result.out_of_time
                    if result.signalled:
                        interrupted_by = signals.received or "a signal on another rank"
                        self.checkpointer.save(self.state, best=False)
                        break
        except BaseException:
            self.records.close()  # TensorBoard keeps what was logged before the stop
            raise
        if self.train_config.keep_checkpoints and self.train_config.schedule == "wsd":
            self.say_decay_command(overrides, script)
        return self.finish(interrupted_by, overrides, resume_hint or resume_command(overrides, self.run_dir, script))

    def say_decay_command(self, overrides: list[str], script: str) -> None:
        """How to finish a model from a kept checkpoint of this WSD run's stable phase (the latest one)."""
        train = self.train_config
        stable_end = train.max_iters - optim.decay_iters(train.max_iters, train.decay_frac)
        kept = {int(path.name[5:13]): path for path in (self.run_dir / checkpoint.KEPT).glob("step-*")}
        stable = [step for step in kept if train.warmup_iters <= step <= stable_end]
        if stable:
            step = max(stable)
            command = decay_command(overrides, kept[step], self.run_dir.with_name(f"{self.run_dir.name}-decay{step}"),
                                    script)
            self.records.log(f"kept {len(kept)} checkpoints in {kept[step].parent}; decay one of the stable phase "
                             f"into a finished model (its step is where the decay starts), e.g.:\n{command}")

    def describe(self) -> str:
        c, train, world = self.model_config, self.train_config, self.ranks.world_size
        fused = ", fused AdamW" if self.state.optimizer.defaults.get("fused") else ""
        fused += (", FSDP" if train.fsdp else "") + (", activation checkpointing" if train.activation_checkpointing
                                                     else "")
        return (
            f"model: {self.n_params / 1e6:.2f}M parameters ({c.n_layer} layers, {c.n_head} heads, {c.n_embd} wide, "
            f"context {c.block_size}, attention={c.attention}); "
            f"device {self.device} x {world} ({self.precision}{fused})\n"
            f"batch: {train.batch_size} sequences x {train.grad_accum} micro-steps x {world} process(es) "
            f"x {c.block_size} tokens = {self.tokens_per_step:,} tokens per optimizer step\n"
            + optim.describe(self.state.model, train)
        )

    def evaluation_due(self) -> bool:
        step = self.state.step
        due = step % self.train_config.eval_interval == 0 or step == self.train_config.max_iters or self.out_of_time
        return due and not self.state.evaluated

    def evaluate(self, signals: SignalGuard | None = None) -> bool:
        """Both splits' losses; TensorBoard samples; a checkpoint (best.pt too when val improved). False when a stop
        signal came during it: the evaluation is left unfinished (a long one would hold the stop for minutes)."""
        state, step = self.state, self.state.step
        train = self.train_config
        losses = estimate_loss(self.model, self.data, batches=train.eval_iters, batch_size=train.batch_size,
                               block_size=self.model_config.block_size, seed=self.run.seed, device=self.device,
                               autocast=self.forward_context, ranks=self.ranks,
                               stop=lambda: signals is not None and signals.received is not None)
        if losses is None:
            return False
        if not all(math.isfinite(v) for v in losses.values()):
            raise AbortRun(f"non-finite evaluation loss at step {step} (train {losses['train']}, val {losses['val']}); "
                           f"stopped without saving: {self.checkpointer.latest} holds the last good state",
                           hint="lower train.learning_rate or raise train.warmup_iters, then resume=true")
        improved = losses["val"] < state.best_val_loss
        state.last_eval, state.best_val_loss, state.evaluated = losses, min(state.best_val_loss, losses["val"]), True
        val = val_metrics(losses["val"], self.data.meta["splits"]["val"])
        self.records.scalars(step, {"val/loss": losses["val"], "train/eval_loss": losses["train"],
                                    "val/ppl": val["ppl"], "val/bpb": val["bpb"]})
        if not train.fsdp and (train.sample_tokens or train.pictures):  # rank 0 alone; a sharded model needs all
            self.records.pictures(lambda writer: visuals.log_samples(
                writer, state.model, self.data, train.sample_tokens, self.run.seed, self.device, self.autocast, step,
                pictures=train.pictures))
        if train.heads and not train.fsdp:
            self.records.pictures(lambda writer: self.records.say(f"step {step} heads: " + ", ".join(
                f"{name[6:]} {value:.4f}" for name, value in visuals.log_heads(
                    writer, state.model, self.data, step, self.device, self.run.seed).items())))
        self.checkpointer.save(state, best=improved, keep=train.keep_checkpoints)
        bpb = f", val bpb {val['bpb']:.4f}" if val["bpb"] is not None else ""
        self.records.say(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                         f"val ppl {val['ppl']:.2f}{bpb}")
        self.throughput.restart_window()
        return True

    def train_step(self, signals: SignalGuard) -> StepResult:
        """One optimizer step: grad_accum micro-steps, clipping, one agreement of all ranks, the update."""
        started, state = time.time(), self.state
        lr = learning_rate(state.step, self.train_config)
        set_learning_rate(state.optimizer, lr, self.train_config)
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.train_config.grad_accum):
            loss_sum += self.forward_backward(last=micro == self.train_config.grad_accum - 1)
        state.scaler.unscale_(state.optimizer)
        grad_norm = parallelize.clip_grad_norm_(self.params, self.train_config.grad_clip or math.inf)
        result, nonfinite = self.agree(loss_sum, grad_norm, signals.received is not None, self.time_is_up(), lr)
        if nonfinite:
            self.skip_update(result)
        else:
            state.scaler.step(state.optimizer)
            state.scaler.update()
            state.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.evaluated = False
        self.throughput.step_done(time.time() - started)
        return result

    def forward_backward(self, last: bool) -> torch.Tensor:
        """One micro-step on the next batch; gradients are all-reduced only on the ``last`` one. Returns the loss."""
        x, y, *extra = self.next_batch()  # chat data adds positions and the mask that keeps conversations apart
        kwargs = extra[0] if extra else {}
        weighted = self.passkey is not None and self.passkey.weight is not None
        targets = None if weighted else y  # a weighted passkey mix computes the loss itself: not twice
        with parallelize.gradient_sync(self.train_model, last):
            try:
                with self.forward_context:
                    logits, loss = self.train_model(x, targets, **kwargs)
            except Exception as err:  # a compiler failure on first use: say so once, go eager
                if not self.compiled_first_step:
                    raise
                self.records.log(f"torch.compile failed ({type(err).__name__}: {str(err).splitlines()[0][:200]}): "
                                 "running eager")
                self.model = self.state.model
                self.train_model = build.data_parallel(self.model, self.device, self.ranks)
                with self.forward_context:
                    logits, loss = self.train_model(x, targets, **kwargs)
            self.compiled_first_step = False
            if self.passkey is not None:
                loss = self.passkey.loss(logits, y, loss)
            self.state.scaler.scale(loss / self.train_config.grad_accum).backward()
        self.read_ahead()  # the device is still busy with this micro-step: read the next one meanwhile
        return loss.detach().float()

    def next_batch(self) -> tuple:
        """This rank's windows of the next micro-batch, as the sampler hands them out (disjoint across ranks)."""
        starts = self.state.sampler.next()
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] is starts:
            return ahead[1]
        return self.read(starts)

    def read(self, starts: list[int]) -> tuple:
        """The training windows at ``starts``, their first rows passkey sequences with train.passkey."""
        batch = self.data.windows("train", starts, self.model_config.block_size, self.device)
        if self.passkey is not None:
            self.passkey.apply(*batch[:2], self.data.splits["train"], starts)
        return batch

    def read_ahead(self) -> None:
        """Draw and read the next micro-batch now, its copy to a GPU started (pinned memory, non-blocking): the
        host work of a batch overlaps the device's, instead of leaving the GPU idle after the step's one sync. The
        sampler's saved state stays the one before this draw (gpt.data.sampler.Lookahead), so checkpoints do not
        change."""
        if self.ahead is None:
            starts = self.state.sampler.ahead()
            self.ahead = (starts, self.read(starts))

    def time_is_up(self) -> bool:
        """Whether train.max_seconds (counted from this launch's start) has passed."""
        return self.train_config.max_seconds is not None and time.time() - self.started >= self.train_config.max_seconds

    def agree(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor, signal_received: bool, time_up: bool,
              lr: float) -> tuple[StepResult, bool]:
        """One host sync per step (with several ranks, one all-reduce): mean loss, any non-finite value, any stop
        signal, the time budget (any rank's clock). A single process keeps its own flags on the host: no copy to the
        device (a blocking copy waits for the device to finish first)."""
        nonfinite = ~torch.isfinite(loss_sum)
        if self.precision != "fp16":  # with fp16 the GradScaler skips overflowing gradients itself
            nonfinite |= ~torch.isfinite(grad_norm)
        flags = [float(signal_received), float(time_up)]
        stats = torch.cat([(loss_sum / self.train_config.grad_accum).reshape(1), nonfinite.float().reshape(1)])
        if self.ranks.enabled:  # every rank's flags join the sum
            stats = torch.cat([stats, torch.tensor(flags).to(self.device, non_blocking=True)])
            distributed.all_reduce_sum(stats, self.ranks)
        loss, nonfinite_count, *counts, norm = torch.cat([stats, grad_norm.reshape(1).float()]).tolist()
        signal_count, time_count = counts if self.ranks.enabled else flags
        return (StepResult(loss / self.ranks.world_size, norm, lr, signal_count > 0, time_count > 0),
                nonfinite_count > 0)

    def skip_update(self, result: StepResult) -> None:
        """Drop a step whose loss or gradient is not finite, or stop once train.skip_nonfinite are used up."""
        state = self.state
        what = f"loss {result.loss}" if not math.isfinite(result.loss) else f"gradient norm {result.grad_norm}"
        state.optimizer.zero_grad(set_to_none=True)
        state.scaler.update()
        if state.skipped >= self.train_config.skip_nonfinite:
            raise AbortRun(
                f"non-finite {what} at step {state.step + 1}; stopped without saving it: "
                f"{self.checkpointer.latest} holds the last good state"
                + (f" ({state.skipped} such step(s) skipped before)" if state.skipped else ""),
                hint="lower train.learning_rate or raise train.warmup_iters and resume with resume=true, "
                     "or let train.skip_nonfinite=N skip up to N such steps",
            )
        state.skipped += 1
        self.records.say(f"step {state.step + 1}: non-finite {what}, update skipped "
                         f"({state.skipped} of train.skip_nonfinite={self.train_config.skip_nonfinite})")

    def report(self, result: StepResult) -> None:
        """Every log_interval steps (and the last): TensorBoard scalars and a line or the progress bar's figures."""
        step, train = self.state.step, self.train_config
        if step % train.log_interval == 0 or step == train.max_iters:
            tok_s = self.throughput.window_rate()
            mfu = metrics.mfu(tok_s / self.ranks.world_size, self.model_config, self.n_params, self.peak_flops)
            self.records.scalars(step, {"train/loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
                                        "tokens_per_sec": tok_s, "mfu": mfu})
            eta = _duration(self.throughput.eta_seconds(train.max_iters - step))
            self.records.progress(
                f"step {step}/{train.max_iters}: loss {result.loss:.4f}, lr {result.lr:.2e}, grad norm "
                f"{result.grad_norm:.3f}, {tok_s:,.0f} tok/s" + (f", mfu {mfu:.1%}" if mfu is not None else "")
                + f", eta {eta}", loss=f"{result.loss:.3f}", tok_s=f"{tok_s:,.0f}")
        self.records.advance()

    def finish(self, interrupted_by: str | None, overrides: list[str], resume: str) -> Summary:
        """summary.json, then the resume command (interrupted) or a sample and the closing lines."""
        state = self.state
        summary = Summary(
            params=self.n_params, step=state.step, tokens=state.step * self.tokens_per_step,
            best_val_loss=state.best_val_loss, final_train_loss=state.last_eval.get("train", math.nan),
            final_val_loss=state.last_eval.get("val", math.nan), tokens_per_sec=self.throughput.run_rate(),
            peak_memory_bytes=metrics.peak_memory_bytes(self.device), wall_s=time.time() - self.started,
            ckpt=self.checkpointer.latest, interrupted=interrupted_by is not None, resume_command=resume,
            **self.final_val_metrics(),
        )
        self.records.close(summary, {"overrides": overrides, "attention": self.model_config.attention,
                                     "device": str(self.device), "precision": self.precision,
                                     "world_size": self.ranks.world_size})
        if self.out_of_time:
            self.records.log(f"train.max_seconds={self.train_config.max_seconds:g} reached after step {state.step} "
                             f"of {self.train_config.max_iters}")
        if interrupted_by is not None:
            self.records.log(f"stopped by {interrupted_by} after step {state.step}; checkpoint saved: {summary.ckpt}\n"
                             f"resume with: {resume}")
            return summary
        train = self.train_config
        if self.ranks.is_main and train.sample_tokens > 0 and not train.fsdp:  # FSDP: every rank or none
            state.model.eval()
            text = visuals.sample_text(state.model, self.data, "", train.sample_tokens, self.run.seed, self.device,
                                       self.autocast)
            self.records.log("sample:\n" + text + "\n" + "-" * 40)
        self.records.log(
            f"done: {self.n_params / 1e6:.2f}M parameters, {summary.tokens:,} tokens seen, "
            f"best val loss {summary.best_val_loss:.4f}, {summary.tokens_per_sec:,.0f} tokens/s, "
            f"{summary.wall_s:.0f}s wall time\n"
            f"checkpoint: {summary.ckpt} (best: {self.run_dir / checkpoint.BEST})\n"
            + (f"chat with it: python scripts/chat.py ckpt={self.run_dir}" if self.run.chat.data is not None else
               f"sample from it: python scripts/generate.py ckpt={self.run_dir}")
        )
        return summary

    def final_val_metrics(self) -> dict[str, float | None]:
        """final_val_ppl and final_val_bpb of the summary, from the last evaluation's val loss (None before one)."""
        if "val" not in self.state.last_eval:
            return {"final_val_ppl": None, "final_val_bpb": None}
        val = val_metrics(self.state.last_eval["val"], self.data.meta["splits"]["val"])
        return {"final_val_ppl": val["ppl"], "final_val_bpb": val["bpb"]}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
