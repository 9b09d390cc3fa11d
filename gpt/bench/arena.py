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
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

import torch

from gpt.config import GPTConfig, ModelConfig, ScriptConfig
from gpt.data.config import DataConfig
from gpt.designs import registry as designs
from gpt.device import DeviceConfig
from gpt.errors import ConfigError, UserError, check_positive
from gpt.files import output_path
from gpt.train import recipe
from gpt.train.config import RunConfig, TrainConfig
from gpt.validate import parse_yaml_value

CORE_PRESETS: dict[str, dict[str, Any]] = {  # the core's own settings; each attention design brings its preset
    "gpt2": {},  # learned positions, full multi-head attention: the baseline
    "window": {"window": 16},  # a sliding window of 16 tokens: a KV cache that stops growing
    "mqa": {"n_kv_head": 1},
    "gqa": {"n_kv_head": 2},
}
MAP_TOKENS = 32  # tokens of the validation text whose attention maps are drawn side by side
QUICK_MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)  # arena.quick: seconds per variant


@dataclass
class ArenaSettings:
    """The ``arena`` node: which variants, on what budget, and how much of the evaluation to run."""

    variants: list[str] = field(default_factory=lambda: ["gpt2", "rope", "alibi", "qk_norm", "softcap", "sink",
                                                                   "diff"])
    tokens: int = 1_000_000  # training tokens per variant (max_iters = tokens / tokens per step, rounded up)
    seconds: Optional[float] = None  # or equal time: each variant trains this long (tokens stays the cap)
    quick: bool = False  # a tiny model (QUICK_MODEL), at most 16k tokens, 4 short evaluations: a smoke test
    eval_tokens: Optional[int] = None  # score the first eval_tokens of the val split (None: all of it)
    curve_points: int = 8  # evaluations during training: the points of the loss-against-tokens plot
    decode_tokens: int = 128  # greedy tokens timed with the KV cache (batch 1)
    timeout_s: float = 3600.0  # a variant (training and evaluation) still running after this fails
    recipes: list[str] = field(default_factory=list)  # every variant under each recipe (configs/recipe/); [] the
    # composed recipe= alone. A recipe sets training and model options, never the attention design.

    def __post_init__(self) -> None:
        check_positive(self, "tokens", "curve_points", "decode_tokens", "timeout_s", prefix="arena.")
        check_positive(self, "eval_tokens", "seconds", optional=True, prefix="arena.")
        if not self.variants:
            raise ConfigError("arena.variants is empty", hint="e.g. arena.variants=[gpt2,rope,alibi]")
        for spec in self.variants:
            parse_variant(spec)
        names = [variant_name(s) for s in self.variants]
        if len(set(names)) != len(names):
            raise ConfigError(f"arena.variants names a variant twice: {list(self.variants)}")
        for name in self.recipes:
            recipe.settings(name)
        if len(set(self.recipes)) != len(self.recipes):
            raise ConfigError(f"arena.recipes names a recipe twice: {list(self.recipes)}")


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
        variant_runs(self)  # every variant's model and training config, validated before anything runs


def presets() -> dict[str, dict[str, Any]]:
    """Every preset: the core's, then one per registered design (its Design.preset), a user's design included."""
    return {**CORE_PRESETS, **{name: designs.get(name).on_preset() for name in designs.available()}}


def parse_variant(spec: str) -> dict[str, Any]:
    """The GPTConfig overrides a variant names: presets and ``model.<field>=<value>`` joined by ``+`` (the designs a
    user brought, named by several parts, add up)."""
    known, table = [f.name for f in fields(GPTConfig) if f.name != "vocab_size"], presets()
    overrides: dict[str, Any] = {}
    for part in str(spec).split("+"):
        part = part.strip()
        if "=" in part:
            key, value = part.split("=", 1)
            name = key.strip().removeprefix("model.")
            if name not in known:
                raise ConfigError(f"arena.variants: {key!r} in {spec!r} is not a model field",
                                  hint=f"model fields: {', '.join(known)}")
            try:
                overrides[name] = parse_yaml_value(value.strip(), f"arena.variants: {key.strip()}")
            except UserError as err:
                raise ConfigError(f"{err} in {spec!r}", hint=err.hint) from None
        elif part in table:
            named = overrides.get("designs", []) + table[part].get("designs", [])
            overrides.update(table[part])
            if named:
                overrides["designs"] = named
        else:
            raise ConfigError(f"arena.variants: unknown preset {part!r} in {spec!r}",
                              hint=f"presets: {', '.join(table)}; or model.<field>=<value>, joined by +")
    return overrides


def variant_name(spec: str) -> str:
    """A folder name for a variant: its spec with anything but letters, digits, '-', '_', '.', '=' as '_'."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", str(spec).replace("model.", "")).strip("_") or "variant"


def variant_runs(cfg: ArenaConfig) -> list[tuple[str, RunConfig]]:
    """(name, RunConfig) per variant: the base model with the variant's overrides, the budget as optimizer steps."""
    base = {f.name: getattr(cfg.model, f.name) for f in fields(ModelConfig)}
    if cfg.arena.quick:
        base.update(QUICK_MODEL)
    runs = []
    for spec, recipe_name in [(s, r) for s in cfg.arena.variants for r in cfg.arena.recipes or [None]]:
        overrides = parse_variant(spec)
        if "attention" in overrides:
            overrides.setdefault("attention_backend", None)  # a backend belongs to the base kernel
        fields_, train = {**base, **overrides}, cfg.train
        if recipe_name is not None:  # the recipe's training and model options; the variant's design stays
            fields_, train = recipe.apply(recipe_name, fields_, train)
        try:  # ModelConfig validates: a kernel that cannot compute the variant is refused, naming the option
            model = ModelConfig(**fields_)
        except ConfigError as err:
            raise ConfigError(f"arena variant {spec!r}: {err}", hint=err.hint) from None
        steps = math.ceil(budget(cfg) / (train.batch_size * train.grad_accum * model.block_size))
        points = min(cfg.arena.curve_points, 4) if cfg.arena.quick else cfg.arena.curve_points
        train = replace(train, max_iters=steps, eval_interval=max(1, steps // points),
                        warmup_iters=min(train.warmup_iters, steps // 10), lr_decay_iters=None,
                        max_seconds=cfg.arena.seconds,
                        eval_iters=min(train.eval_iters, 2) if cfg.arena.quick else train.eval_iters)
        name = variant_name(spec) + (f"@{recipe_name}" if recipe_name else "")
        runs.append((name, RunConfig(model=model, data=cfg.data, device=cfg.device, train=train,
                                     precision=cfg.precision, seed=cfg.seed, out_dir=str(Path(cfg.out_dir) / name))))
    return runs


def budget(cfg: ArenaConfig) -> int:
    """Training tokens per variant (arena.quick caps them at 16k)."""
    return min(cfg.arena.tokens, 16_384) if cfg.arena.quick else cfg.arena.tokens


def eval_tokens(cfg: ArenaConfig) -> int | None:
    """Held-out tokens to score (arena.quick caps them at 4k)."""
    return min(cfg.arena.eval_tokens or 4096, 4096) if cfg.arena.quick else cfg.arena.eval_tokens


def loss_curve(run_dir: Path, tokens_per_step: int, started: float) -> list[dict[str, float]]:
    """(tokens, seconds, train, val) at each evaluation, read back from the run's TensorBoard scalars (the Trainer
    writes val/loss and train/eval_loss there at every evaluation; seconds count from ``started``, a time.time())."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # not its "No path found after <events file>"
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    train = {e.step: e.value for e in events.Scalars("train/eval_loss")}
    return [{"tokens": e.step * tokens_per_step, "seconds": e.wall_time - started, "train": train.get(e.step, math.nan),
             "val": e.value} for e in events.Scalars("val/loss")]


def kv_bytes_per_token(model: torch.nn.Module, device: torch.device) -> float:
    """Bytes the KV cache holds per cached token: every layer's keys and values (n_kv_head heads), or a design's own
    kind, measured on a cache filled by a one-token prompt, over the tokens its slots stand for (a window's ring, its
    sink tokens; a fixed state such as linear attention's over block_size tokens, what a full context costs)."""
    from gpt.kv_cache import KVCache

    cache = KVCache(model.config, batch_size=1, device=device)
    with torch.no_grad():
        model(torch.zeros(1, 1, dtype=torch.long, device=device), cache=cache)
    held = sum(layer.held_bytes() for layer in cache.layers)  # linear attention: its fixed state, over block_size
    return held / cache.layers[0].tokens


def decode_rate(model: torch.nn.Module, n_tokens: int, device: torch.device) -> float:
    """Greedy tokens per second with the KV cache, batch 1, from a one-token prompt (prefill included)."""
    from gpt.decoding import generate

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
    from gpt.pretrained import load_model
    from gpt.train.trainer import train

    started = time.time()
    summary = train(run, Path(run.out_dir), log=lambda message: None, script="scripts/arena.py")
    if summary.interrupted:  # a stop signal (Ctrl-C): the arena stops too, with the rows it has
        return {"error": f"interrupted at step {summary.step} (checkpoint saved)", "stop": True}
    device = resolve_device(run.device.type)
    model, tokenizer = load_model(summary.ckpt, device)
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
    from gpt.visualize import attention_maps

    maps = attention_maps(model, torch.tensor([ids], device=device))  # (layers, heads, T, T)
    return maps[-1].float().mean(0).tolist()


def run(cfg: ArenaConfig, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every variant in turn, each in a process of its own on a CPU; the leaderboard rows, best bits per byte first.

    The tables and the plot go to out_dir (gpt.bench.arena_report).
    """
    from gpt import checkpoint
    from gpt.bench.arena_report import make_out_dir, write_reports
    from gpt.bench.isolate import run_here, run_isolated
    from gpt.data.prepare import prepare
    from gpt.device import resolve_device

    runs = variant_runs(cfg)
    specs = [spec for spec in cfg.arena.variants for _ in cfg.arena.recipes or [None]]  # in variant_runs' order
    for _, variant in runs:
        if (Path(variant.out_dir) / checkpoint.LATEST).exists():
            raise ConfigError(f"{variant.out_dir} already holds a run: the arena trains every variant from scratch",
                              hint="choose another out_dir (or remove that folder)")
    make_out_dir(Path(cfg.out_dir))  # a read-only or full disk is one error now, not after every variant failed
    prepare(cfg.data, log=log)  # once, before any variant: they all read it
    device = resolve_device(cfg.device.type)
    rows = []
    for i, (name, variant) in enumerate(runs, 1):
        log(f"[{i}/{len(runs)}] {name}: {variant.train.max_iters} steps of "
            f"{variant.train.batch_size * variant.train.grad_accum * variant.model.block_size} tokens, "
            f"attention={variant.model.attention}, optimizer {variant.train.optimizer}, "
            f"schedule {variant.train.schedule}")
        kwargs = dict(run=variant, eval_n=eval_tokens(cfg), decode_tokens=cfg.arena.decode_tokens)
        result = (run_isolated(run_variant, kwargs, cfg.arena.timeout_s) if device.type == "cpu"
                  else run_here(run_variant, kwargs))
        rows.append({"variant": name, "spec": specs[i - 1], **result})
        log(f"    {describe(rows[-1])}")
        if result.get("stop") and "interrupted" in result.get("error", ""):
            break
    rows.sort(key=lambda r: r.get("val_bpb", math.inf))
    write_reports(Path(cfg.out_dir), header(cfg, rows), rows, log)
    return rows


def describe(row: dict[str, Any]) -> str:
    """One console line for a finished variant (or its error)."""
    if "error" in row:
        return f"failed: {row['error']}"
    return (f"val loss {row['val_loss']:.4f}, {row['val_bpb']:.4f} bits/byte, {row['tokens_per_s']:,.0f} tok/s, "
            f"{row['train_s']:.0f} s")


def header(cfg: ArenaConfig, rows: list[dict[str, Any]]) -> str:
    """What every variant shared: model, data, budget, seed, batch."""
    model = {**{k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "n_embd", "block_size")},
             **(QUICK_MODEL if cfg.arena.quick else {})}
    scored = next((r["val_tokens"] for r in rows if "val_tokens" in r), None)
    return (f"Base model: {model['n_layer']} layers, {model['n_head']} heads, {model['n_embd']} wide, context "
            f"{model['block_size']}; data {cfg.data.name}; seed {cfg.seed}; batch {cfg.train.batch_size} x "
            f"{cfg.train.grad_accum}; {recipes_text(cfg)}; budget {budget_text(cfg)} per variant; held-out: "
            + (f"{scored:,} val tokens scored" if scored else f"first {eval_tokens(cfg) or 'all'} val tokens")
            + " (full pass, every target once).")


def recipes_text(cfg: ArenaConfig) -> str:
    """The training the variants shared: each recipe of the axis, or the composed optimizer and schedule."""
    if cfg.arena.recipes:
        return f"each under recipe {' and '.join(cfg.arena.recipes)} (variant@recipe)"
    return f"optimizer {cfg.train.optimizer}, schedule {cfg.train.schedule}"


def budget_text(cfg: ArenaConfig) -> str:
    if cfg.arena.seconds is None:
        return f"{budget(cfg):,} training tokens"
    return f"{cfg.arena.seconds:g} s of training (at most {budget(cfg):,} tokens)"
