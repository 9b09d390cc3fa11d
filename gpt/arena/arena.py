"""The attention arena: train several attention designs on equal terms (data, seed, batch, token budget), then
rank them by held-out bits per byte, with their cost (parameters, tokens/s, peak memory, KV-cache bytes, decoding).

Each variant is a preset name (presets()) or ``model.<field>=<value>`` overrides, joined by ``+`` (``rope+qk_norm``,
``model.n_kv_head=1``). Each trains with gpt.train.trainer.train(), the very code of scripts/train.py, in a process
of its own forked from this one (gpt.bench.isolate): the peak memory the Trainer reports on a CPU is its process's
peak resident set, which a shared process would carry from one variant to the next; a variant that crashes or runs
out of memory fails alone. The same process then scores the final weights with the full held-out pass
(gpt.evaluation.heldout) and times greedy decoding with the KV cache.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import torch

from gpt.arena.plan import (  # noqa: F401  (presets, parse_variant, variant_name: the arena's public names)
    QUICK_MODEL,
    Cell,
    budget,
    parse_overrides,
    parse_variant,
    plan,
    presets,
    variant_name,
)
from gpt.arena.runs import MAP_SIDE
from gpt.data.config import DataConfig
from gpt.device import DeviceConfig
from gpt.errors import ConfigError, check_positive
from gpt.files import output_path
from gpt.model.config import ModelConfig, ScriptConfig
from gpt.train import recipe
from gpt.train.config import RunConfig, TrainConfig

MAX_RUNS = 1000  # training runs an arena may plan (a day of quick runs; each full run takes minutes to hours)
MAX_TOKENS = 10**15  # training tokens a plan may add up to (GPT-3 trained on 3e11; a fast GPU does ~1e6 a second)
MAP_TOKENS = MAP_SIDE  # tokens of the validation text whose attention maps are drawn side by side
MAX_TIMEOUT_S = 10**7  # about 4 months: a wait beyond what a clock can count (1e300 s) raised OverflowError


@dataclass
class ArenaSettings:
    """The ``arena`` node: which variants on which axes, how many seeds, on what budget, how much evaluation."""

    variants: list[str] = field(default_factory=lambda: ["gpt2", "rope", "alibi", "qk_norm", "softcap", "sink",
                                                                   "diff"])
    seeds: int = 1  # each variant trains with seeds seed, seed + 1, ...: initialisation and data order follow it
    baseline: Optional[str] = None  # the variant the others are tested against (None: the first of variants)
    alpha: float = 0.05  # a difference is marked significant when its one-sided Welch p is below alpha
    tokens: int = 1_000_000  # training tokens per variant (max_iters = tokens / tokens per step, rounded up)
    flops: Optional[float] = None  # or equal compute: each variant trains flops / (its FLOPs per token) tokens
    seconds: Optional[float] = None  # or equal time: each variant trains this long (tokens stays the cap)
    recipes: list[str] = field(default_factory=list)  # every variant under each recipe (configs/recipe/); [] the
    # composed recipe= alone. A recipe sets training and model options, never the attention design.
    overrides: list[str] = field(default_factory=list)  # every variant under each set of model.*/train.* values
    sizes: list[str] = field(default_factory=list)  # every variant at each model size (model.<field>=<value>+...)
    quick: bool = False  # a tiny model (QUICK_MODEL), at most 16k tokens, 4 short evaluations: a smoke test
    eval_tokens: Optional[int] = None  # score the first eval_tokens of the val split (None: all of it)
    curve_points: int = 8  # evaluations during training: the points of the loss-against-tokens plot
    decode_tokens: int = 128  # greedy tokens timed with the KV cache (batch 1)
    timeout_s: float = 3600.0  # a variant (training and evaluation) still running after this fails

    def __post_init__(self) -> None:
        check_positive(self, "seeds", "tokens", "curve_points", "decode_tokens", "timeout_s", prefix="arena.")
        check_positive(self, "eval_tokens", "seconds", "flops", optional=True, prefix="arena.")
        if not 0 < self.alpha < 0.5:
            raise ConfigError(f"arena.alpha must be in (0, 0.5), got {self.alpha!r}", hint="e.g. arena.alpha=0.05")
        if self.timeout_s > MAX_TIMEOUT_S:
            raise ConfigError(f"arena.timeout_s must be at most {MAX_TIMEOUT_S:,} s (about 4 months), got "
                              f"{self.timeout_s:g}", hint="the default is 3600 (an hour a variant)")
        if self.flops is not None and self.seconds is not None:
            raise ConfigError("arena.flops and arena.seconds are two budgets: choose one",
                              hint="equal compute: arena.flops=<F>; equal time: arena.seconds=<S>")
        if not self.variants:
            raise ConfigError("arena.variants is empty", hint="e.g. arena.variants=[gpt2,rope,alibi]")
        for spec in self.variants:
            parse_variant(spec)
        for spec in self.sizes:
            parse_variant(spec, "arena.sizes")
        for spec in self.overrides:
            parse_overrides(spec)
        for name in self.recipes:
            recipe.settings(name)
        for axis, what in (("variants", "a variant"), ("recipes", "a recipe"), ("overrides", "an override set"),
                           ("sizes", "a size")):
            names = [variant_name(s) for s in getattr(self, axis)]
            if len(set(names)) != len(names):
                raise ConfigError(f"arena.{axis} names {what} twice: {list(getattr(self, axis))}")
        if self.baseline is not None and self.baseline not in [variant_name(s) for s in self.variants]:
            raise ConfigError(f"arena.baseline={self.baseline} is not one of arena.variants",
                              hint=f"one of: {', '.join(variant_name(s) for s in self.variants)}")


@dataclass
class ArenaConfig(ScriptConfig):
    """scripts/arena.py (configs/arena.yaml): the base model and training shared by every variant."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    train: TrainConfig = field(default_factory=TrainConfig)  # max_iters and eval_interval come from the arena
    arena: ArenaSettings = field(default_factory=ArenaSettings)
    precision: str = "auto"
    seed: int = 1337
    out_dir: str = "runs/arena"

    def __post_init__(self) -> None:
        output_path(self.out_dir, "out_dir", folder=True)
        check_size(self)  # before the plan is built: a hundred million seeds would take minutes to list
        if not 0 <= self.seed <= 2**31 - self.arena.seeds:
            raise ConfigError(f"seed must be in [0, 2**31 - arena.seeds], got {self.seed}")
        check_tokens(self, plan(self))  # every run's model and training config, validated before anything runs


def n_runs(cfg: ArenaConfig) -> int:
    """How many training runs the plan holds: sizes x variants x recipes x override sets x seeds."""
    arena = cfg.arena
    return (max(1, len(arena.sizes)) * len(arena.variants) * max(1, len(arena.recipes))
            * max(1, len(arena.overrides)) * arena.seeds)


def plan_cost(cfg: ArenaConfig) -> str:
    """What the plan costs, in words: its runs and the training tokens (or seconds) they add up to."""
    runs = n_runs(cfg)
    each = (f"{cfg.arena.seconds:g} s" if cfg.arena.seconds is not None else
            f"{cfg.arena.flops:.3g} FLOPs" if cfg.arena.flops is not None else f"{budget(cfg):,} tokens")
    total = (f" = {runs * cfg.arena.seconds / 3600:,.1f} hours of training" if cfg.arena.seconds is not None else
             f" = {runs * budget(cfg):,} training tokens" if cfg.arena.flops is None else "")
    return f"{runs:,} runs ({n_runs(cfg) // cfg.arena.seeds:,} variants x {cfg.arena.seeds:,} seeds) of {each}{total}"


def check_size(cfg: ArenaConfig) -> None:
    """Refuse a plan of more than MAX_RUNS runs (it cannot finish: each trains and is scored alone), saying its cost."""
    if n_runs(cfg) > MAX_RUNS:
        raise ConfigError(f"the arena's plan is {plan_cost(cfg)}: more than the {MAX_RUNS:,} runs an arena may hold",
                          hint="fewer arena.seeds (3 to 10 separate most differences), variants, recipes, overrides "
                               "or sizes")
    if cfg.arena.flops is None and n_runs(cfg) * budget(cfg) > MAX_TOKENS:
        raise ConfigError(f"the arena's plan is {plan_cost(cfg)}: more than the {MAX_TOKENS:.0e} training tokens "
                          "any machine trains in a year", hint="a smaller arena.tokens (the default is 1,000,000)")


def check_tokens(cfg: ArenaConfig, cells: list[Cell]) -> None:
    """Refuse a FLOPs budget whose runs add up to more than MAX_TOKENS training tokens (known once each cell's FLOPs
    per token is: arena.flops=1e40 planned 8.6e29 steps a run)."""
    total = sum(c.run.train.max_iters * c.run.train.batch_size * c.run.train.grad_accum * c.run.model.block_size
                for c in cells)
    if total > MAX_TOKENS:
        raise ConfigError(f"the arena's plan is {plan_cost(cfg)} = {total:.3g} training tokens: more than the "
                          f"{MAX_TOKENS:.0e} any machine trains in a year", hint="a smaller arena.flops")


def variant_runs(cfg: ArenaConfig) -> list[tuple[str, RunConfig]]:
    """(group/seed<seed>, RunConfig) of every cell of the plan (gpt.arena.plan.plan has the details)."""
    return [(f"{c.group}/seed{c.seed}", c.run) for c in plan(cfg)]


def eval_tokens(cfg: ArenaConfig) -> int | None:
    """Held-out tokens to score (arena.quick caps them at 4k)."""
    return min(cfg.arena.eval_tokens or 4096, 4096) if cfg.arena.quick else cfg.arena.eval_tokens


def loss_curve(run_dir: Path, tokens_per_step: int, started: float) -> list[dict[str, float]]:
    """(tokens, seconds, train, val) at each evaluation, read back from the run's TensorBoard scalars (the Trainer
    writes val/loss and train/eval_loss there at every evaluation; seconds count from ``started``, a time.time()).
    A resumed run's evaluations from before the resume count from its first one, and those after it continue
    from there (the time between its last evaluation and the interruption is not counted)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # not its "No path found after <events file>"
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)  # resumed
    events.Reload()
    train = {e.step: e.value for e in events.Scalars("train/eval_loss")}
    every = events.Scalars("val/loss")
    val = {e.step: e for e in every}  # a step evaluated twice (at a resume): the later one
    earlier = [e.wall_time for e in every if e.wall_time < started]
    offset = (max(earlier) - min(earlier)) if earlier else 0.0
    seconds = {step: e.wall_time - min(earlier) if e.wall_time < started else offset + e.wall_time - started
               for step, e in val.items()}
    return [{"tokens": step * tokens_per_step, "seconds": seconds[step], "train": train.get(step, math.nan),
             "val": val[step].value} for step in sorted(val)]


def kv_bytes_per_token(model: torch.nn.Module, device: torch.device) -> float:
    """Bytes the KV cache holds per cached token: every layer's keys and values (n_kv_head heads), or a design's own
    kind, measured on a cache filled by a one-token prompt, over the tokens its slots stand for (a window's ring, its
    sink tokens; a fixed state such as linear attention's over block_size tokens, what a full context costs)."""
    from gpt.model.kv_cache import KVCache

    cache = KVCache(model.config, batch_size=1, device=device)
    with torch.no_grad():
        model(torch.zeros(1, 1, dtype=torch.long, device=device), cache=cache)
    return cache.held_bytes() / cache.tokens  # linear attention: its fixed state, over block_size; a layout: over
    # the longest context its layers stand for (block_size once a layer keeps every token)


def decode_rate(model: torch.nn.Module, n_tokens: int, device: torch.device) -> float:
    """Greedy tokens per second with the KV cache, batch 1, from a one-token prompt (prefill included)."""
    from gpt.inference.decoding import generate

    n_tokens = min(n_tokens, model.config.block_size - 1)  # one prefill, no context slide
    prompt = torch.zeros(1, 1, dtype=torch.long, device=device)
    generate(model, prompt, 4, temperature=0.0)  # warm-up
    started = time.perf_counter()
    generate(model, prompt, n_tokens, temperature=0.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n_tokens / (time.perf_counter() - started)


def run_variant(run: RunConfig, eval_n: int | None, decode_tokens: int) -> dict[str, Any]:
    """Train one variant (gpt.train.trainer.train), then score its final weights on the held-out split and time
    its decoding: one row of the leaderboard, with its loss curve."""
    from gpt.data.loader import TokenData
    from gpt.data.prepare import prepare
    from gpt.device import autocast, resolve_device, resolve_precision
    from gpt.evaluation.heldout import full_pass
    from gpt.train.trainer import train
    from gpt.weights.load import load

    started = time.time()
    summary = train(run, Path(run.out_dir), log=lambda message: None, script="scripts/arena.py",
                    resume_hint="the same scripts/arena.py command again (it resumes the runs it did not finish)")
    if summary.interrupted:  # a stop signal (Ctrl-C): the arena stops too, with the rows it has
        return {"error": f"interrupted at step {summary.step} (checkpoint saved)", "stop": True}
    device = resolve_device(run.device.type)
    model, tokenizer, _ = load(summary.ckpt, device)
    data = TokenData(prepare(run.data, log=lambda message: None))
    val = data.splits["val"][:eval_n] if eval_n else data.splits["val"][:]
    held = full_pass(model, val, tokenizer, block_size=model.config.block_size, batch_size=run.train.batch_size,
                     device=device, autocast=autocast(device, resolve_precision(run.precision, device)))
    tokens_per_step = run.train.batch_size * run.train.grad_accum * model.config.block_size
    prompt = val[:min(model.config.block_size, MAP_TOKENS)].tolist()
    return {
        "params": model.num_params(non_embedding=False), "steps": summary.step, "tokens": summary.tokens,
        "val_loss": held.loss, "val_bpb": held.bpb, "val_tokens": held.tokens,
        "tokens_per_s": summary.tokens_per_sec, "peak_mib": summary.peak_memory_bytes / 2**20,
        "kv_bytes_per_token": kv_bytes_per_token(model, device),
        "decode_tok_s": decode_rate(model, decode_tokens, device), "train_s": summary.wall_s,
        "curve": loss_curve(Path(run.out_dir), tokens_per_step, started),
        "attention": last_layer_map(model, prompt, device),
    }


def last_layer_map(model: torch.nn.Module, ids: list[int], device: torch.device) -> list[list[float]]:
    """The last layer's attention weights on ``ids``, averaged over its heads (T x T), for the side-by-side picture."""
    from gpt.inference.visualize import attention_maps

    maps = attention_maps(model, torch.tensor([ids], device=device))  # (layers, heads, T, T)
    return maps[-1].float().mean(0).tolist()


def run(cfg: ArenaConfig, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every cell of the plan, each in a process of its own on a CPU (one per GPU, in parallel, on several); the
    per-seed rows in plan order. Finished cells of an earlier, interrupted run of the same command are read back,
    an unfinished one resumes from its checkpoint. The tables and the plots go to out_dir (gpt.arena.report).
    """
    from gpt.arena import runs as arena_runs
    from gpt.arena.report import make_out_dir, write_reports
    from gpt.data.loader import TokenData
    from gpt.data.prepare import prepare
    from gpt.train.signals import SignalGuard

    make_out_dir(Path(cfg.out_dir))  # a read-only or full disk is one error now, not after every variant failed
    vocab = TokenData(prepare(cfg.data, log=log)).tokenizer.vocab_size  # once, before any variant: they all read it
    cells = plan(cfg, vocab)  # the FLOPs budget counts the head over the data's vocabulary
    log(f"plan: {plan_cost(cfg)}")
    for cell in cells:  # before anything trains: a folder of another configuration is refused
        arena_runs.check_folder(Path(cell.run.out_dir), cell.run, Path(cfg.out_dir))
    rows: dict[int, dict[str, Any]] = {}
    todo = []
    for i, cell in enumerate(cells):
        kept = arena_runs.finished(Path(cell.run.out_dir), cell.run.train.max_iters + 1)  # one a step
        if kept is None:
            todo.append(i)
        else:
            rows[i] = cell_row(cell, kept)
    if len(todo) < len(cells):
        log(f"{len(cells) - len(todo)} of {len(cells)} runs finished already in {cfg.out_dir}: read back, not rerun")

    stopped: list[str] = []  # the stop signal a cell's own process received, when this one received none

    def done(i: int, result: dict[str, Any]) -> bool:
        rows[i] = cell_row(cells[i], result)
        log(f"    {cells[i].group} seed {cells[i].seed}: {describe(rows[i])}")
        if "error" not in result:
            arena_runs.save(Path(cells[i].run.out_dir), result)
        if result.get("stop") and str(result.get("error", "")).startswith("interrupted"):
            stopped.append("SIGTERM" if "SIGTERM" in result["error"] else "Ctrl-C")
        return bool(signals.received or stopped)

    with SignalGuard(verbose=False) as signals:  # Ctrl-C: the running cell saves its checkpoint; no new cell starts
        arena_runs.run_all(todo, devices(cfg), lambda i, device: run_cell(cfg, cells[i], device, log), done)
    ordered = [rows[i] for i in sorted(rows)]
    write_reports(Path(cfg.out_dir), header(cfg, ordered), ordered, cfg.arena, log)
    if signals.received or stopped:  # exit 130 with one line, as every script does when stopped
        finished = sum("error" not in row for row in rows.values())
        name = "Ctrl-C" if signals.received == "SIGINT" else signals.received or stopped[0]
        raise KeyboardInterrupt(
            f"interrupted ({name}): {finished} of {len(cells)} runs finished, kept in {cfg.out_dir} with the report "
            "of them; an unfinished run keeps its last checkpoint: run the same command again to resume")
    return ordered


def cell_row(cell: Cell, result: dict[str, Any]) -> dict[str, Any]:
    """A per-seed row: the cell's place in the grid, its FLOPs, and what its run measured (or its error)."""
    row = {**result, "group": cell.group, "variant": cell.variant, "slice": cell.slice, "size": cell.size,
           "seed": cell.seed, "spec": cell.spec, "flops_per_token": cell.flops_per_token}  # the plan names the row
    if cell.flops_per_token is not None and "tokens" in result:
        row["train_flops"] = cell.flops_per_token * result["tokens"]
    return row


def run_cell(cfg: ArenaConfig, cell: Cell, device: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Train and measure one cell on ``device``: in a process of its own on a CPU or beside other GPUs' runs, in
    this one on a single GPU (where the allocator's peak is reset per run)."""
    from gpt.arena import runs as arena_runs
    from gpt.bench.isolate import run_here_stoppable, run_isolated

    run = cell.run
    log(f"[{cell.group} seed {cell.seed}] {run.train.max_iters} steps of "
        f"{run.train.batch_size * run.train.grad_accum * run.model.block_size} tokens on {device}, "
        f"attention={run.model.attention}, optimizer {run.train.optimizer}, schedule {run.train.schedule}")
    arena_runs.start(Path(run.out_dir), run)
    run = replace(run, resume=True, device=DeviceConfig(device))  # resume: continue a checkpoint, if any, else start
    kwargs = dict(run=run, eval_n=eval_tokens(cfg), decode_tokens=cfg.arena.decode_tokens)
    if device == "cpu" or len(devices(cfg)) > 1:
        return run_isolated(run_variant, kwargs, cfg.arena.timeout_s)
    return run_here_stoppable(run_variant, kwargs)  # a Ctrl-C before the trainer's own guard stops the cell too


def devices(cfg: ArenaConfig) -> list[str]:
    """Where the cells run: every GPU when device is cuda (or auto) and there are several, one cell per GPU at a
    time; else the one device."""
    from gpt.device import resolve_device

    device = resolve_device(cfg.device.type)
    if device.type == "cuda" and device.index is None and torch.cuda.device_count() > 1:
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [str(device)]


def describe(row: dict[str, Any]) -> str:
    """One console line for a finished run (or its error)."""
    if "error" in row:
        return f"failed: {row['error']}"
    return (f"val loss {row['val_loss']:.4f}, {row['val_bpb']:.4f} bits/byte, {row['tokens_per_s']:,.0f} tok/s, "
            f"{row['train_s']:.0f} s")


def header(cfg: ArenaConfig, rows: list[dict[str, Any]]) -> str:
    """What every variant shared: model, data, budget, seeds, batch, and the test."""
    model = {**{k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "n_embd", "block_size")},
             **(QUICK_MODEL if cfg.arena.quick else {})}
    scored = next((r["val_tokens"] for r in rows if "val_tokens" in r), None)
    seeds = cfg.arena.seeds
    return (f"Base model: {model['n_layer']} layers, {model['n_head']} heads, {model['n_embd']} wide, context "
            f"{model['block_size']}" + (f" (sizes: {', '.join(cfg.arena.sizes)})" if cfg.arena.sizes else "")
            + f"; data {cfg.data.name}; "
            + (f"{seeds} seeds ({cfg.seed} to {cfg.seed + seeds - 1})" if seeds > 1 else f"seed {cfg.seed}")
            + f"; batch {cfg.train.batch_size} x {cfg.train.grad_accum}; {recipes_text(cfg)}; budget "
            f"{budget_text(cfg)} per variant; held-out: "
            + (f"{scored:,} val tokens scored" if scored else f"first {eval_tokens(cfg) or 'all'} val tokens")
            + " (full pass, every target once)."
            + (f" p: Welch's one-sided t-test of each variant's bits per byte against {baseline_name(cfg)}'s over "
               f"the seeds (lower is better); better or worse at alpha = {cfg.arena.alpha:g}, else n.s."
               if seeds > 1 else ""))


def baseline_name(cfg: ArenaConfig) -> str:
    return cfg.arena.baseline or variant_name(cfg.arena.variants[0])


def recipes_text(cfg: ArenaConfig) -> str:
    """The training the variants shared: each recipe of the axis, or the composed optimizer and schedule."""
    text = (f"each under recipe {' and '.join(cfg.arena.recipes)} (variant@recipe)" if cfg.arena.recipes
            else f"optimizer {cfg.train.optimizer}, schedule {cfg.train.schedule}")
    return text + (f"; each under {' and '.join(cfg.arena.overrides)}" if cfg.arena.overrides else "")


def budget_text(cfg: ArenaConfig) -> str:
    if cfg.arena.flops is not None:
        return (f"{cfg.arena.flops:.3g} training FLOPs" + (" at the first size (scaled as the baseline's FLOPs per "
                                                           "token at the others)" if cfg.arena.sizes else ""))
    if cfg.arena.seconds is None:
        return f"{budget(cfg):,} training tokens"
    return f"{cfg.arena.seconds:g} s of training (at most {budget(cfg):,} tokens)"
