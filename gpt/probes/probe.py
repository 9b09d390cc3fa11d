"""scripts/probe.py: every design trained from scratch on every probe task over seeds (gpt.probes.train), each
(task, design, seed) a cell with its folder under out_dir, its configuration and result kept by the arena's
machinery (gpt.arena.runs): the same command run again reads finished cells back, refuses a folder of another
configuration or a damaged result, and runs what is left. Designs are the arena's variants (gpt.arena.plan: a
preset, a user's design by name, ``model.<field>=<value>`` joined by ``+``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

from gpt.arena.plan import parse_variant, sized, variant_name
from gpt.data.config import DataConfig
from gpt.device import DeviceConfig
from gpt.errors import ConfigError, check_positive
from gpt.files import output_path
from gpt.model.config import GPTConfig, ModelConfig, ScriptConfig
from gpt.probes.registry import build, task_names
from gpt.probes.tasks import Task, TaskSettings

QUICK = dict(seq_len=16, vocab=64, mqar_pairs=[2], small_vocab=8, memory_keys=8, copy_tokens=3, passkey_digits=2,
             passkey_lengths=[1, 2], corpus_lengths=[1, 2], steps=6, batch_size=8, examples=16,
             motif=2)  # probes.quick: seconds per cell
QUICK_MODEL = dict(n_layer=1, n_head=2, n_embd=16)
MAX_CELLS = 2000  # (task, design, seed) cells a card may plan


@dataclass
class ProbeSettings(TaskSettings):
    """The ``probes`` node: which designs on which tasks, over how many seeds, trained how long."""

    designs: list[str] = field(default_factory=lambda: ["gpt2", "rope", "alibi", "linear", "window"])
    tasks: list[str] = field(default_factory=task_names)
    baseline: Optional[str] = None  # the design the others are tested against (None: the first of designs)
    seeds: int = 3  # each cell trains with seed, seed + 1, ...: initialisation and every sequence follow it
    alpha: float = 0.05  # better or worse than the baseline when the one-sided Welch p is below alpha
    steps: int = 300  # optimizer steps per learning rate
    batch_size: int = 32
    learning_rates: list[float] = field(default_factory=lambda: [1e-3, 3e-3])  # MAD's sweep: the best is kept
    examples: int = 256  # validation and test sequences (each metric's own)
    quick: bool = False  # tiny sizes (QUICK, QUICK_MODEL): seconds a cell, for tests
    workers: int = 1  # cells at once, one thread each (torch's threads shared among them)
    arena: Optional[str] = None  # an arena's out_dir (or arena_summary.csv): the card's rank correlation with it

    def __post_init__(self) -> None:
        check_positive(self, "seeds", "steps", "batch_size", "examples", "workers", "seq_len", "vocab",
                       "small_vocab", "copy_tokens", "memory_keys", "passkey_digits", "motif", prefix="probes.")
        if not 0 < self.alpha < 0.5:
            raise ConfigError(f"probes.alpha must be in (0, 0.5), got {self.alpha!r}")
        if not self.learning_rates or any(not 0 < lr < 1 for lr in self.learning_rates):
            raise ConfigError(f"probes.learning_rates must be rates in (0, 1), got {self.learning_rates}",
                              hint="e.g. probes.learning_rates=[1e-3,3e-3]")
        for axis in ("designs", "tasks"):
            names = [variant_name(s) for s in getattr(self, axis)]
            if not names:
                raise ConfigError(f"probes.{axis} is empty")
            if len(set(names)) != len(names):
                raise ConfigError(f"probes.{axis} names one twice: {list(getattr(self, axis))}")
        for spec in self.designs:
            parse_design(spec)
        if self.baseline is not None and self.baseline not in [variant_name(s) for s in self.designs]:
            raise ConfigError(f"probes.baseline={self.baseline} is not one of probes.designs",
                              hint=f"one of: {', '.join(variant_name(s) for s in self.designs)}")
        build(self.tasks, effective(self))  # unknown names and impossible settings, before anything runs
        if self.arena is not None:
            from gpt.probes.validity import read_arena

            read_arena(self.arena)  # a missing or malformed summary, before anything runs


def parse_design(spec: str) -> dict[str, Any]:
    """A design's model fields, read as the arena reads a variant (presets, a user's design, field=value, joined
    by +), its errors naming probes.designs."""
    try:
        return parse_variant(spec)
    except ConfigError as err:
        raise ConfigError(str(err).replace("arena.variants", "probes.designs", 1), hint=err.hint) from None


def effective(s: ProbeSettings) -> ProbeSettings:
    """The settings a run uses: probes.quick's tiny sizes over the given ones."""
    if not s.quick:
        return s
    return replace(s, **QUICK, learning_rates=s.learning_rates[:1], quick=False)


@dataclass
class ProbeConfig(ScriptConfig):
    """scripts/probe.py (configs/probe.yaml): the base model every design changes, the corpus of the corpus task,
    and the probes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)  # the corpus task's text (prepared when the card runs)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    seed: int = 1
    out_dir: str = "runs/probes"

    def __post_init__(self) -> None:
        output_path(self.out_dir, "out_dir", folder=True)
        if not 1 <= self.seed <= 2**31 - self.probes.seeds:
            raise ConfigError(f"seed must be in [1, 2**31 - probes.seeds], got {self.seed}")
        cells = len(self.probes.designs) * len(build(self.probes.tasks, effective(self.probes))) * self.probes.seeds
        if cells > MAX_CELLS:
            raise ConfigError(f"the card plans {cells:,} runs, more than {MAX_CELLS:,}",
                              hint="fewer probes.seeds, designs or tasks")
        plan(self)  # every cell's model validated before anything runs


@dataclass
class Cell:
    """One run: a design on a task with one seed (its fields are what its folder's configuration file holds)."""

    task: str
    design: str  # the design's name (variant_name of its spec)
    spec: str
    seed: int
    model: GPTConfig
    settings: dict[str, Any]  # the effective ProbeSettings but the axes (the corpus task's: its lengths and data too)
    folder: str


AXES = ("designs", "tasks", "baseline", "seeds", "alpha", "workers", "quick", "arena")


def design_model(cfg: ProbeConfig, spec: str, task: Task) -> GPTConfig:
    """The design's model for the task: the base model (probes.quick: a tiny one) with the design's fields, its
    context the task's longest length, its vocabulary the task's; a design that cannot run the task refused."""
    base = {f.name: getattr(cfg.model, f.name) for f in fields(ModelConfig)} | \
        (QUICK_MODEL if cfg.probes.quick else {})
    overrides = parse_design(spec)
    if "attention" in overrides:
        overrides.setdefault("attention_backend", None)
    need = max(task.metrics().values())
    if overrides.get("block_size", need) < need:
        raise ConfigError(f"design {spec!r} cannot run {task.name}: its context (block_size={overrides['block_size']}"
                          f") is shorter than the task's {need} tokens", hint="leave block_size to the task")
    values = {**base, **overrides, "block_size": max(need, overrides.get("block_size", need))}
    values["vocab_size"] = max(task.vocab_size, values.get("vocab_size") or 0)
    try:
        return ModelConfig(**sized(values)).build(task.vocab_size)  # a layout preset: its window per context
    except ConfigError as err:
        raise ConfigError(f"design {spec!r} cannot run {task.name}: {err}", hint=err.hint) from None


def plan(cfg: ProbeConfig, data=None) -> list[Cell]:
    """Every cell, task by task, design by design, seed by seed. ``data``: the corpus task's prepared data
    (gpt.probes.corpus.open_corpus); without it the plan is only validated (the corpus's vocabulary a placeholder)."""
    s = effective(cfg.probes)
    shared = {k: v for k, v in asdict(s).items() if k not in AXES and k != "corpus_lengths"}
    cells = []
    for task in build(s.tasks, s, data):
        settings = shared if task.name != "corpus" else \
            {**shared, "corpus_lengths": s.corpus_lengths, "corpus": str(data.dir) if data is not None else None}
        for spec in s.designs:
            model = design_model(cfg, spec, task)
            for seed in range(cfg.seed, cfg.seed + s.seeds):
                folder = Path(cfg.out_dir) / task.name / variant_name(spec) / f"seed{seed}"
                cells.append(Cell(task.name, variant_name(spec), spec, seed, model, settings, str(folder)))
    return cells


def baseline(cfg: ProbeConfig) -> str:
    return cfg.probes.baseline or variant_name(cfg.probes.designs[0])
