"""The arena's plan: every training run (a Cell) of a grid of variants x recipes x overrides x sizes x seeds, each a
RunConfig on the same budget of tokens, seconds or FLOPs.

A variant is presets (presets()) or ``model.<field>=<value>`` overrides joined by ``+``; an override set of the
``arena.overrides`` axis may also set ``train.<field>=<value>``; a size of ``arena.sizes`` sets model fields only.
The plan is built twice: when the config is read (every cell validated before anything trains, the vocabulary not
yet known) and after the data is prepared (the FLOPs budget counts the output head, which needs the vocabulary).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from gpt.errors import ConfigError, UserError
from gpt.model import design as designs
from gpt.model import flops
from gpt.model.config import GPTConfig, ModelConfig
from gpt.model.renamed import command_line_error as old_design_field
from gpt.train import recipe
from gpt.train.config import RunConfig, TrainConfig
from gpt.validate import dataclass_values, parse_yaml_value

CORE_PRESETS: dict[str, dict[str, Any]] = {  # the core's own settings; each attention design brings its preset
    "gpt2": {},  # learned positions, full multi-head attention: the baseline
    "window": {"window": 16},  # a sliding window of 16 tokens: a KV cache that stops growing
    "mqa": {"n_kv_head": 1},
    "gqa": {"n_kv_head": 2},
}
CONTEXT_WINDOW = "block_size/4"  # a layout preset's local window: a quarter of the cell's context, set per cell
LOCAL, GLOBAL = ({"designs": ["rope"]},  # the local kind takes model.window (a preset's: CONTEXT_WINDOW)
                 {"window": None, "designs": ["rope"], "options": {"rope": {"base": 1_000_000}}})  # Gemma 3's
LAYOUT_PRESETS: dict[str, dict[str, Any]] = {  # layouts (docs/layouts.md): each pattern tiles over model.n_layer
    "local_global_1to1": {"layers": "SL", "layer_kinds": {"S": LOCAL, "L": GLOBAL}, "window": CONTEXT_WINDOW},
    "local_global_3to1": {"layers": "SSSL", "layer_kinds": {"S": LOCAL, "L": GLOBAL}, "window": CONTEXT_WINDOW},
    "local_global_5to1": {"layers": "SSSSSL", "layer_kinds": {"S": LOCAL, "L": GLOBAL}, "window": CONTEXT_WINDOW},
    "nope_every_4th": {"layers": "RRRN", "layer_kinds": {"R": {"designs": ["rope"]}, "N": {}}},  # Llama 4's NoPE
    "deltanet_3to1": {"layers": "DDDG", "norm": "rmsnorm",  # Qwen3-Next's: Gated DeltaNet x 3, gated attention
                      "layer_kinds": {"D": {"designs": ["deltanet"]}, "G": {"designs": ["gated", "rope"]}}},
}
NESTED_FIELDS = ("layer_kinds", "design_options")  # model fields whose value is a mapping of mappings
QUICK_MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)  # arena.quick: seconds per variant
QUICK_TOKENS = 16_384  # arena.quick's cap on the token budget
PLACEHOLDER_VOCAB = 256  # the vocabulary a plan assumes before the data says (validation only: no run uses it)


@dataclass
class Cell:
    """One training run of the arena: a variant in a slice (recipe, overrides, size) with one seed."""

    group: str  # its leaderboard row: variant[@recipe][@overrides][@size]; its runs differ only by seed
    variant: str
    spec: str  # the variant as the user wrote it
    slice: str  # recipe, overrides and size ("" when none): rows are tested against the baseline of their slice
    size: str  # the size's name ("" when no arena.sizes)
    seed: int
    run: RunConfig
    flops_per_token: int | None  # training FLOPs per token (gpt.model.flops); None when a design declares none


def presets() -> dict[str, dict[str, Any]]:
    """Every preset: the core's, one per registered design (its Design.preset), a user's design included, then the
    layouts."""
    return {**CORE_PRESETS, **{name: designs.get(name).on_preset() for name in designs.available()},
            **copy.deepcopy(LAYOUT_PRESETS)}  # a copy: no variant edits another's kinds


def sized(fields_: dict[str, Any]) -> dict[str, Any]:
    """Model fields with a layout preset's window (CONTEXT_WINDOW) made a number: a quarter of block_size."""
    if fields_.get("window") != CONTEXT_WINDOW:
        return fields_
    return {**fields_, "window": max(1, int(fields_.get("block_size") or GPTConfig.block_size) // 4)}


def model_fields() -> list[str]:
    return [f.name for f in fields(GPTConfig) if f.name != "vocab_size"]


def parse_value(key: str, value: str, spec: str, setting: str) -> Any:
    """A value as the command line would type it (YAML; 1e-3 is a number, as Hydra reads it, not YAML 1.1's string).
    ``model.layer_kinds={S: {window: 8}}`` may nest: ModelConfig checks every kind's keys and values."""
    if key.strip().removeprefix("model.") in NESTED_FIELDS:
        return nested_value(key, value, spec, setting)
    try:
        parsed = parse_yaml_value(value.strip(), f"{setting}: {key.strip()}")
    except UserError as err:
        raise ConfigError(f"{err} in {spec!r}", hint=err.hint) from None
    if isinstance(parsed, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", parsed):
        return float(parsed)
    return parsed


def nested_value(key: str, value: str, spec: str, setting: str) -> Any:
    """A mapping of mappings typed in a variant (YAML, safe_load: plain data, nothing that runs)."""
    try:
        return yaml.safe_load(value.strip())
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise ConfigError(f"{setting}: {key.strip()}={value.strip()!r} in {spec!r} is not valid YAML ({problem})",
                          hint="e.g. model.layer_kinds={S: {window: 8, designs: [rope]}, L: {designs: [rope]}}") \
            from None


def typed_value(cls: type, name: str, value: Any, spec: str, setting: str, prefix: str) -> Any:
    """``value`` if it has the type ``cls`` declares for the field ``name`` (a number for model.dropout, not
    'high'), else a ConfigError naming the setting, the field and the value."""
    try:
        dataclass_values(cls, {name: value}, f"{setting} {spec!r}", prefix=prefix)
    except UserError as err:
        raise ConfigError(str(err), hint=f"e.g. {setting}=['{prefix}{name}=<value>']") from None
    return value


def parse_variant(spec: str, setting: str = "arena.variants") -> dict[str, Any]:
    """The GPTConfig overrides a variant names: presets and ``model.<field>=<value>`` joined by ``+`` (the designs
    named by several parts add up: ``rope+model.designs=[my_design]``)."""
    known, table = model_fields(), presets()
    overrides: dict[str, Any] = {}
    for part in str(spec).split("+"):
        part = part.strip()
        if "=" in part:
            add_override(overrides, part, spec, setting, known)
        elif part in table and setting == "arena.variants":
            named = overrides.get("designs", []) + table[part].get("designs", [])
            options = {**overrides.get("design_options", {}), **table[part].get("design_options", {})}
            overrides.update(table[part])
            if named:
                overrides["designs"] = named
            if options:
                overrides["design_options"] = options
        elif setting == "arena.variants":
            raise ConfigError(f"arena.variants: unknown preset {part!r} in {spec!r}",
                              hint=f"presets: {', '.join(table)}; or model.<field>=<value>, joined by +")
        else:
            raise ConfigError(f"{setting}: {part!r} in {spec!r} is not <field>=<value>",
                              hint=f"e.g. {setting}=['model.n_layer=2+model.n_embd=64']")
    return overrides


def add_override(overrides: dict[str, Any], part: str, spec: str, setting: str, known: list[str]) -> None:
    """One ``model.<field>=<value>`` of a variant into ``overrides``: model.designs adds to the designs named before,
    ``model.design_options.<design>.<key>=<value>`` sets one setting of a design; an old design field is refused
    with its new spelling (gpt.model.renamed)."""
    key, value = part.split("=", 1)
    name = key.strip().removeprefix("model.")
    problem = old_design_field("model." + part.strip().removeprefix("model."))
    if problem is not None:
        raise ConfigError(f"{setting}: {problem} (in {spec!r})", hint=problem.hint)
    design, _, option = name.removeprefix("design_options.").partition(".")
    if name.startswith("design_options.") and design and option and "." not in option:
        settings = overrides.setdefault("design_options", {}).setdefault(design, {})
        settings[option] = parse_value(key, value, spec, setting)
        return
    if name not in known:
        raise ConfigError(f"{setting}: {key!r} in {spec!r} is not a model field",
                          hint=f"model fields: {', '.join(known)}; a design's setting: "
                               "model.design_options.<design>.<key>=<value>")
    parsed = typed_value(GPTConfig, name, parse_value(key, value, spec, setting), spec, setting, "model.")
    if name == "designs" and isinstance(parsed, list):
        parsed = overrides.get("designs", []) + parsed
    overrides[name] = parsed


def parse_overrides(spec: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model fields, train fields) an ``arena.overrides`` entry sets: ``model.<f>=<v>`` and ``train.<f>=<v>``
    joined by ``+``."""
    model, train, known = {}, {}, {f.name for f in fields(TrainConfig)}
    for part in str(spec).split("+"):
        key, equals, value = part.strip().partition("=")
        if not equals or not key.startswith(("model.", "train.")):
            raise ConfigError(f"arena.overrides: {part.strip()!r} in {spec!r} is not model.<field>=<value> or "
                              "train.<field>=<value>", hint="e.g. arena.overrides=['train.learning_rate=1e-3']")
        if key.startswith("model."):
            model = merged(model, parse_variant(part.strip(), "arena.overrides"))
        elif key.removeprefix("train.") not in known:
            raise ConfigError(f"arena.overrides: {key!r} in {spec!r} is not a training option",
                              hint=f"train fields: {', '.join(sorted(known))}")
        else:
            name = key.removeprefix("train.")
            train[name] = typed_value(TrainConfig, name, parse_value(key, value, spec, "arena.overrides"), spec,
                                      "arena.overrides", "train.")
    return model, train


def variant_name(spec: str) -> str:
    """A folder name for a variant: its spec with anything but letters, digits, '-', '_', '.', '=' as '_'."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", str(spec).replace("model.", "").replace("train.", "")).strip("_") \
        or "variant"


def seeds(cfg: Any) -> list[int]:
    """arena.seeds consecutive seeds from ``seed``."""
    return [cfg.seed + i for i in range(cfg.arena.seeds)]


def plan(cfg: Any, vocab_size: int | None = None) -> list[Cell]:
    """Every cell, in run order: size, variant, recipe, overrides, then seed (a group's seeds run one after
    another). ``vocab_size`` None: the model's, or a placeholder that only validation sees."""
    arena = cfg.arena
    vocab = vocab_size or cfg.model.vocab_size or PLACEHOLDER_VOCAB
    base = {f.name: getattr(cfg.model, f.name) for f in fields(ModelConfig)} | (QUICK_MODEL if arena.quick else {})
    sizes = [(variant_name(s), parse_variant(s, "arena.sizes")) for s in arena.sizes] or [("", {})]
    scale = flops_scale(cfg, base, sizes, vocab)
    cells = []
    for (size, size_fields), spec, recipe_name, extra in [
            (z, v, r, o) for z in sizes for v in arena.variants for r in arena.recipes or [None]
            for o in arena.overrides or [None]]:
        model, train = cell_model(cfg, merged(base, size_fields), spec, recipe_name, extra)
        fpt = per_token(model, vocab, required=arena.flops is not None, spec=spec)
        train = cell_train(cfg, model, train, None if arena.flops is None else arena.flops * scale[size] / fpt)
        slice_ = "@".join(p for p in (recipe_name, extra and variant_name(extra), size) if p)
        group = variant_name(spec) + (f"@{slice_}" if slice_ else "")
        for seed in seeds(cfg):
            run = RunConfig(model=model, data=cfg.data, device=cfg.device, train=train, precision=cfg.precision,
                            seed=seed, out_dir=str(Path(cfg.out_dir) / group / f"seed{seed}"))
            cells.append(Cell(group, variant_name(spec), spec, slice_, size, seed, run, fpt))
    return cells


def cell_model(cfg: Any, base: dict[str, Any], spec: str, recipe_name: str | None,
               extra: str | None) -> tuple[ModelConfig, TrainConfig]:
    """The validated model and the training options of one (size, variant, recipe, overrides)."""
    overrides = parse_variant(spec)
    if "attention" in overrides:
        overrides.setdefault("attention_backend", None)  # a backend belongs to the base kernel
    model_fields_, train = merged(base, overrides), cfg.train
    if recipe_name is not None:  # the recipe's training and model options; the variant's design stays
        model_fields_, train = recipe.apply(recipe_name, model_fields_, train)
    if extra is not None:
        model_extra, train_extra = parse_overrides(extra)
        model_fields_ = merged(model_fields_, model_extra)
        try:
            train = replace(train, **train_extra)
        except ConfigError as err:
            raise ConfigError(f"arena.overrides {extra!r}: {err}", hint=err.hint) from None
    try:  # ModelConfig validates: a kernel that cannot compute the variant is refused, naming the option
        return ModelConfig(**sized(model_fields_)), train
    except ConfigError as err:
        raise ConfigError(f"arena variant {spec!r}: {err}", hint=err.hint) from None


def merged(fields_: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Model fields with ``more`` over them, the designs of both (a size's, a variant's, an override's add up) and
    each design's settings merged."""
    out = {**fields_, **more}
    if "designs" in more:
        out["designs"] = list(dict.fromkeys([*(fields_.get("designs") or []), *more["designs"]]))
    if "design_options" in more:
        before = fields_.get("design_options") or {}
        out["design_options"] = {**before, **{d: {**before.get(d, {}), **o} for d, o in more["design_options"].items()}}
    return out


def per_token(model: ModelConfig, vocab: int, required: bool, spec: str) -> int | None:
    """Training FLOPs per token of a cell's model (None when a design declares no count and arena.flops is off)."""
    try:
        return flops.per_token(model.build(vocab))
    except ConfigError as err:
        if required:
            raise ConfigError(f"arena variant {spec!r}: {err}", hint=err.hint) from None
        return None


def flops_scale(cfg: Any, base: dict[str, Any], sizes: list[tuple[str, dict]], vocab: int) -> dict[str, float]:
    """arena.flops at each size, relative to the first: the baseline's FLOPs per token there over its FLOPs per
    token at the first size, so the baseline trains the same tokens at every size (1 without arena.flops)."""
    if cfg.arena.flops is None:
        return {name: 1.0 for name, _ in sizes}
    baseline = parse_variant(baseline_spec(cfg.arena))
    counts = {name: flops.per_token(ModelConfig(**sized(merged(merged(base, fields_), baseline))).build(vocab))
              for name, fields_ in sizes}
    first = counts[sizes[0][0]]
    return {name: count / first for name, count in counts.items()}


def baseline_spec(arena: Any) -> str:
    """The variant every other is tested against: arena.baseline, or the first of arena.variants."""
    return next((s for s in arena.variants if variant_name(s) == arena.baseline), arena.variants[0]) \
        if arena.baseline else arena.variants[0]


def cell_train(cfg: Any, model: ModelConfig, train: TrainConfig, flops_tokens: float | None) -> TrainConfig:
    """The budget as optimizer steps: tokens / tokens per step, or the FLOPs budget's tokens (arena.flops over the
    cell's FLOPs per token) / tokens per step, rounded up; the evaluations along the way."""
    arena = cfg.arena
    tokens = flops_tokens if flops_tokens is not None else budget(cfg)
    steps = max(1, math.ceil(tokens / (train.batch_size * train.grad_accum * model.block_size)))
    points = min(arena.curve_points, 4) if arena.quick else arena.curve_points
    return replace(train, max_iters=steps, eval_interval=max(1, steps // points),
                   warmup_iters=min(train.warmup_iters, steps // 10), lr_decay_iters=None, max_seconds=arena.seconds,
                   eval_iters=min(train.eval_iters, 2) if arena.quick else train.eval_iters)


def budget(cfg: Any) -> int:
    """Training tokens per variant (arena.quick caps them)."""
    return min(cfg.arena.tokens, QUICK_TOKENS) if cfg.arena.quick else cfg.arena.tokens
