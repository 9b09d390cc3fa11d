"""Training throughput: ms per step, tokens/s, peak memory and MFU of GPT + AdamW on random tokens.

One variant per (compile, precision) pair; on CPU each runs in a fresh process (gpt.bench.isolate).
No data is read: the step's cost does not depend on which tokens it sees.

FLOPs per token and the GPUs' peak FLOP/s come from gpt.train.metrics, as in the training loop.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch

from gpt import kernels
from gpt.bench.isolate import MIB, PeakMemory, compile_here, run_here, run_isolated, tensor_bytes
from gpt.bench.report import describe_device, markdown_table, median_seconds, warm_up
from gpt.device import PRECISIONS, DeviceConfig, configure_for_training, resolve_device, resolve_precision
from gpt.errors import ConfigError, check_positive
from gpt.model import GPT
from gpt.model.config import GPTConfig, ModelConfig, ScriptConfig
from gpt.train import metrics
from gpt.train.build import forward_context
from gpt.train.config import TrainConfig
from gpt.train.optim import make_optimizer
from gpt.train.parallelize import apply_activation_checkpointing


@dataclass
class BenchTrainConfig(ScriptConfig):
    """scripts/bench_train.py (configs/bench_train.yaml)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    threads: Optional[int] = None  # CPU: torch's intra-op threads (default: one per core)
    vocab_size: int = 256  # unless model.vocab_size is set (e.g. 50304 for GPT-2's padded vocabulary)
    batch_size: int = 16
    seq_len: Optional[int] = None  # default: model.block_size
    compile: list[bool] = field(default_factory=lambda: [False, True])
    precisions: list[str] = field(default_factory=lambda: ["fp32", "bf16"])
    activation_checkpointing: list[bool] = field(default_factory=lambda: [False])  # [false,true]: both, compared
    warmup: int = 2  # untimed steps first (the first one also compiles)
    steps: int = 10
    learning_rate: float = 3e-4
    peak_tflops: Optional[float] = None  # the device's peak, for MFU where gpt.train.metrics.PEAK_FLOPS lacks it
    timeout_s: float = 300.0  # CPU: kill a variant (compilation included) that runs longer
    out_dir: str = "runs/bench_train"

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "batch_size", "warmup", "steps", "learning_rate", "timeout_s")
        check_positive(self, "threads", "seq_len", "peak_tflops", optional=True)
        if self.seq_len is not None and self.seq_len > self.model.block_size:
            raise ConfigError(f"seq_len must be in 1..block_size ({self.model.block_size}), got {self.seq_len}")
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad or not self.precisions:
            raise ConfigError(f"precisions must be a non-empty list of {', '.join(PRECISIONS)}; "
                              f"got {list(self.precisions)}")


@dataclass
class Variant:
    """One (compile, precision) pair and its figures, or the reason it has none."""

    compile: bool
    precision: str
    activation_checkpointing: bool = False
    ms_per_step: float | None = None
    tokens_per_s: float | None = None
    peak_mib: float | None = None
    tflops: float | None = None  # model FLOPs per second achieved (flops_per_token x tokens/s), in TFLOP/s
    mfu: float | None = None
    first_step_s: float | None = None  # includes compilation with compile=true
    loss: float | None = None
    note: str = ""


def measure(model: dict, batch_size: int, seq_len: int, precision: str, compile: bool, device: str,
            warmup: int, steps: int, learning_rate: float, threads: int | None = None,
            activation_checkpointing: bool = False) -> dict:
    """Time optimizer steps of one variant and gauge its peak memory (in the variant's own process on CPU)."""
    dev = torch.device(device)
    if threads:
        torch.set_num_threads(threads)
    config = GPTConfig(**model)
    kernels.check_trainable(config.attention, dev, config.dropout)
    precision = resolve_precision(precision, dev)
    configure_for_training(dev)  # as training does
    torch.manual_seed(0)
    gpt = GPT(config).to(dev)
    if activation_checkpointing:
        apply_activation_checkpointing(gpt)  # as training applies it
    optimizer = make_optimizer(gpt, TrainConfig(learning_rate=learning_rate), dev)  # the one training builds
    if compile:
        compile_here(dev)
    forward = torch.compile(gpt) if compile else gpt
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), device=dev)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    ctx = forward_context(config, dev, precision)  # as training runs its forward: autocast, SDPA backends
    losses = []

    def step() -> None:
        with ctx:
            _, loss = forward(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    first, _ = warm_up(step, dev, warmup)
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    gauge = PeakMemory(dev)
    gauge.start()
    seconds = median_seconds(step, dev, steps, warmup=0)
    peak = gauge.peak_bytes(tensor_bytes(*gpt.parameters(), *state, tokens))
    return {
        "ms_per_step": seconds * 1e3,
        "tokens_per_s": batch_size * seq_len / seconds,
        "first_step_s": first,
        "peak_mib": None if peak is None else peak / MIB,
        "loss": losses[-1].item(),
        "precision": precision,
    }


def run(cfg: BenchTrainConfig, log=lambda line: print(line, file=sys.stderr, flush=True)) -> str:
    """Measure every (compile, precision) variant; write train.csv and train.md to cfg.out_dir; return the table."""
    device = resolve_device(cfg.device.type)
    config = cfg.model.build(cfg.vocab_size)
    seq_len = cfg.seq_len or config.block_size
    with torch.device("meta"):  # count the parameters without allocating them
        n_params = GPT(config).num_params()
    flops = metrics.flops_per_token(config, n_params, seq_len)
    variants = []
    cases = [(c, p, ac) for c in cfg.compile for p in cfg.precisions for ac in cfg.activation_checkpointing]
    for compile, precision, checkpointing in cases:
        variant = Variant(compile, precision, checkpointing)
        variants.append(variant)
        kwargs = dict(model=config.to_dict(), batch_size=cfg.batch_size, seq_len=seq_len, precision=precision,
                      compile=compile, device=str(device), warmup=cfg.warmup, steps=cfg.steps,
                      learning_rate=cfg.learning_rate, threads=cfg.threads,
                      activation_checkpointing=checkpointing)
        out = run_isolated(measure, kwargs, cfg.timeout_s) if device.type == "cpu" else run_here(measure, kwargs)
        if "error" in out:
            variant.note = out["error"]
            log(f"compile={compile} {precision} AC={checkpointing}: {variant.note}")
            continue
        for key in ("ms_per_step", "tokens_per_s", "first_step_s", "peak_mib", "loss"):
            setattr(variant, key, out[key])
        variant.tflops = flops * variant.tokens_per_s / 1e12
        peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else metrics.peak_flops(device, out["precision"])
        variant.mfu = None if peak is None else variant.tflops * 1e12 / peak
        log(f"compile={compile} {precision} AC={checkpointing}: {variant.ms_per_step:.1f} ms/step, "
            f"{variant.tokens_per_s:,.0f} tokens/s")
    where = describe_device(device, cfg.threads)
    header = (
        f"training benchmark: {n_params / 1e6:.2f}M parameters ({config.n_layer} layers, {config.n_head} heads, "
        f"{config.n_embd} wide, vocab {config.vocab_size}), attention={config.attention}, batch {cfg.batch_size} x "
        f"{seq_len} tokens, AdamW, device {where}, torch {torch.__version__}\n"
        f"median of {cfg.steps} steps after {cfg.warmup} warm-up; {flops / 1e6:.1f} MFLOP per token (6N + 12 L H D T), "
        "model TFLOP/s = that x tokens/s; "
        + ("MFU against " + (f"peak_tflops={cfg.peak_tflops:g}" if cfg.peak_tflops else "the GPU's listed dense peak")
           if device.type == "cuda" or cfg.peak_tflops else "MFU: n/a, no known peak for a CPU (set peak_tflops=)")
        + "\n" + ("peak MiB: torch.cuda.max_memory_allocated() during the timed steps" if device.type == "cuda" else
                  "peak MiB: bytes of parameters, optimizer state and batch + growth of the peak resident set "
                  "during the timed steps, in a fresh process per variant")
    )
    text = header + "\n\n" + table(variants)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "train.csv", "w", newline="") as f:
        settings = ["device", "params", "batch_size", "seq_len"]
        writer = csv.DictWriter(f, fieldnames=[*settings, *(x.name for x in fields(Variant))])
        writer.writeheader()
        for v in variants:
            row = {k: ("" if x is None else x) for k, x in asdict(v).items()}
            writer.writerow({"device": str(device), "params": n_params, "batch_size": cfg.batch_size,
                             "seq_len": seq_len, **row})
    (out_dir / "train.md").write_text(text + "\n")
    return text + f"\n\nwrote {out_dir}/train.csv, train.md"


def table(variants: list[Variant]) -> str:
    """One row per variant; a variant that could not run shows why in the last column."""
    def num(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    rows = [
        [("compile" if v.compile else "eager") + (" + AC" if v.activation_checkpointing else ""), v.precision,
         num(v.ms_per_step, ".1f"), num(v.tokens_per_s, ",.0f"),
         num(v.peak_mib, ".0f"), num(v.tflops, ".3g"), "n/a" if v.mfu is None else f"{v.mfu:.1%}",
         num(v.first_step_s, ".2f"), v.note]
        for v in variants
    ]
    headers = ["mode", "precision", "ms/step", "tokens/s", "peak MiB", "model TFLOP/s", "MFU", "first step s", "note"]
    return markdown_table(headers, rows)
