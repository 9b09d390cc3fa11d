"""Attention kernels head to head: median time and peak memory per kernel, mode and sequence length.

Each case is one causal self-attention call on random (batch, heads, T, head_dim) tensors, forward
only (under no_grad) or forward + backward (gradients of q, k and v). On CPU each case runs in a
fresh process (see gpt.bench.isolate), so a timeout or an out-of-memory failure is that case's result.
"""

from __future__ import annotations

import csv
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from gpt import kernels as attention
from gpt.bench.isolate import MIB, PeakMemory, compile_here, run_here, run_isolated, tensor_bytes
from gpt.bench.report import describe_device, markdown_table, median_seconds, warm_up
from gpt.device import DeviceConfig, resolve_device
from gpt.errors import ConfigError, check_positive
from gpt.kernels.registry import no_backward

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = {"fwd": "forward (no_grad)", "fwd+bwd": "forward + backward (grads of q, k, v)"}
# seq_lens=null: up to 4096 on a CPU (the quadratic kernels need seconds per call there), 16384 on a GPU.
DEFAULT_SEQ_LENS = {"cpu": [64, 128, 256, 512, 1024, 2048, 4096], "cuda": [512, 1024, 2048, 4096, 8192, 16384]}
MEMORY_MEANING = {
    "cuda": "peak MiB: torch.cuda.max_memory_allocated() during the timed calls (inputs included)",
    "cpu": (
        "peak MiB: bytes of the inputs (q, k, v; with fwd+bwd also the output gradient) + growth of the peak resident "
        "set (VmHWM - VmRSS) during the timed calls, in a fresh process per case"
    ),
}


@dataclass
class Result:
    """One case: a time and a memory figure, or the reason there are none."""

    kernel: str
    mode: str
    seq_len: int
    median_ms: float | None = None
    first_call_ms: float | None = None  # the first (untimed) call: includes compilation with compile=true
    peak_mib: float | None = None
    note: str = ""


def measure(
    kernel: str,
    mode: str,
    seq_len: int,
    batch_size: int,
    n_head: int,
    head_dim: int,
    dtype: str,
    device: str,
    compile: bool,
    warmup: int,
    repeats: int,
    threads: int | None = None,
) -> dict:
    """Time one case and gauge its peak memory (runs in the case's own process on CPU)."""
    dev = torch.device(device)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    name, _, backend = kernel.partition(":")
    fn = attention.get(name, backend or None)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return fn(q, k, v, causal=True)

    if compile:
        compile_here(dev)  # a fresh compile per case: no shapes left over from the previous one
        attend = torch.compile(attend, dynamic=False)
    shape = (batch_size, n_head, seq_len, head_dim)
    backward = mode == "fwd+bwd"
    q, k, v = (torch.randn(shape, device=dev, dtype=DTYPES[dtype], requires_grad=backward) for _ in range(3))
    live = [q, k, v]
    if backward:
        grad_out = torch.randn(shape, device=dev, dtype=DTYPES[dtype])
        live.append(grad_out)

        def call() -> None:
            torch.autograd.grad(attend(q, k, v), (q, k, v), grad_out)
    else:

        def call() -> None:
            with torch.no_grad():
                attend(q, k, v)

    first, warm = warm_up(call, dev, warmup)
    gauge = PeakMemory(dev)
    gauge.start()
    start = time.perf_counter()
    seconds = median_seconds(call, dev, repeats, warmup=0)
    peak = gauge.peak_bytes(tensor_bytes(*live))
    return {
        "median_ms": seconds * 1e3,
        "first_call_ms": first * 1e3,
        "peak_mib": None if peak is None else peak / MIB,
        "calls_s": warm - first + time.perf_counter() - start,  # every call but the first (which may compile)
    }


@dataclass
class BenchAttentionConfig:
    """scripts/bench_attention.py (configs/bench_attention.yaml)."""

    kernels: Optional[list[str]] = None  # default: every registered kernel; sdpa:flash pins a backend
    seq_lens: Optional[list[int]] = None  # default: 64..4096 on CPU, 512..16384 on CUDA
    modes: list[str] = field(default_factory=lambda: ["fwd", "fwd+bwd"])
    batch_size: int = 1
    n_head: int = 8
    head_dim: int = 64
    dtype: str = "fp32"  # fp32 | bf16 | fp16
    device: DeviceConfig = field(default_factory=DeviceConfig)
    threads: Optional[int] = None  # CPU: torch's intra-op threads (default: one per core)
    compile: bool = False  # torch.compile each kernel (one fresh compile per case)
    warmup: int = 1  # untimed calls first (the first one also compiles)
    repeats: int = 5
    max_seconds: float = 30.0  # once a length's calls take longer, skip the kernel's longer lengths
    timeout_s: float = 300.0  # CPU: kill a case (compilation included) that runs longer
    out_dir: str = "runs/bench_attention"

    def __post_init__(self) -> None:
        for kernel in self.kernels or []:
            name, _, backend = kernel.partition(":")
            try:
                attention.get(name, backend or None)
            except (KeyError, ValueError) as err:
                raise ConfigError(f"kernels: {err.args[0]}") from None
        if any(not t > 0 for t in self.seq_lens or []):
            raise ConfigError(f"seq_lens must be positive, got {list(self.seq_lens)}")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ConfigError(f"modes must be a non-empty list of {', '.join(MODES)}; got {list(self.modes)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_positive(self, "batch_size", "n_head", "head_dim", "warmup", "repeats", "max_seconds", "timeout_s")
        check_positive(self, "threads", optional=True)


def run(cfg: BenchAttentionConfig, log=lambda line: print(line, file=sys.stderr, flush=True)) -> str:
    """Run every (kernel, mode, length) case; write CSV, PNG plots and the tables to cfg.out_dir; return the tables."""
    device = resolve_device(cfg.device.type)
    kernels = list(cfg.kernels or attention.available())
    seq_lens = sorted(set(cfg.seq_lens or DEFAULT_SEQ_LENS.get(device.type, DEFAULT_SEQ_LENS["cpu"])))
    modes = list(cfg.modes)
    results = [r for kernel in kernels for mode in modes for r in sweep(kernel, mode, seq_lens, cfg, device, log)]
    header = describe(cfg, device)
    text = header + "\n\n" + tables(results, seq_lens, cfg.compile)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(results, cfg, device, out_dir / "attention.csv")
    for metric in ("time", "memory"):
        plot(results, metric, header.splitlines()[0], out_dir / f"attention_{metric}.png")
    (out_dir / "attention.md").write_text(text + "\n")
    return text + f"\n\nwrote {out_dir}/attention.csv, attention.md, attention_time.png, attention_memory.png"


def sweep(kernel: str, mode: str, seq_lens: list[int], cfg: BenchAttentionConfig, device: torch.device,
          log) -> list[Result]:
    """One kernel and mode over the lengths, shortest first. Once a length fails for lack of time or
    memory, or its calls took longer than max_seconds, the longer lengths are skipped (and say so). A backward
    pass the kernel declares it lacks on this device is not tried: its cases say why."""
    results: list[Result] = []
    name = kernel.partition(":")[0]
    trains = mode == "fwd" or attention.spec(name).trains(device.type)
    stopped = "" if trains else no_backward(name, device.type)
    for seq_len in seq_lens:
        result = Result(kernel, mode, seq_len)
        results.append(result)
        if stopped:
            result.note = stopped
            continue
        kwargs = dict(
            kernel=kernel, mode=mode, seq_len=seq_len, batch_size=cfg.batch_size, n_head=cfg.n_head,
            head_dim=cfg.head_dim, dtype=cfg.dtype, device=str(device), compile=cfg.compile,
            warmup=cfg.warmup, repeats=cfg.repeats, threads=cfg.threads,
        )
        out = run_isolated(measure, kwargs, cfg.timeout_s) if device.type == "cpu" else run_here(measure, kwargs)
        if "error" in out:
            result.note = out["error"]
            if out.get("stop"):
                stopped = f"skipped: a shorter length failed ({out['error']})"
            log(f"{kernel} {mode} T={seq_len}: {out['error']}")
            continue
        result.median_ms, result.first_call_ms = out["median_ms"], out["first_call_ms"]
        result.peak_mib = out["peak_mib"]
        if out["calls_s"] > cfg.max_seconds:
            stopped = f"skipped: a shorter length's calls took over max_seconds={cfg.max_seconds:g}"
        log(f"{kernel} {mode} T={seq_len}: {result.median_ms:.2f} ms, {_fmt(result.peak_mib)} MiB")
    return results


def describe(cfg: BenchAttentionConfig, device: torch.device) -> str:
    """What was measured, and what the figures mean."""
    where = describe_device(device, cfg.threads)
    how = "torch.compile" if cfg.compile else "eager"
    return (
        f"attention benchmark: device {where}, torch {torch.__version__}, {cfg.dtype}, {how}, causal, "
        f"batch {cfg.batch_size}, {cfg.n_head} heads x {cfg.head_dim} dims\n"
        f"time: median ms of {cfg.repeats} calls after {cfg.warmup} warm-up; modes: "
        + "; ".join(f"{m} = {MODES[m]}" for m in cfg.modes)
        + f"\n{MEMORY_MEANING['cuda' if device.type == 'cuda' else 'cpu']}"
    )


def _fmt(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def tables(results: list[Result], seq_lens: list[int], compiled: bool) -> str:
    """Markdown tables (time, memory, and first-call time when compiled): kernel x mode rows, one column per length.

    A case without a figure shows a footnote number; the footnotes give the reasons.
    """
    notes: list[str] = []

    def cell(r: Result, value: float | None) -> str:
        if r.note:
            if r.note not in notes:
                notes.append(r.note)
            return f"- [{notes.index(r.note) + 1}]"
        return _fmt(value)

    sections = [("median ms per call", "median_ms"), ("peak MiB", "peak_mib")]
    if compiled:
        sections.append(("first call ms (includes compilation)", "first_call_ms"))
    out = []
    headers = ["kernel", "mode", *[f"T={t}" for t in seq_lens]]
    for title, column in sections:
        rows: dict[tuple[str, str], list[str]] = {}
        for r in results:
            rows.setdefault((r.kernel, r.mode), [r.kernel, r.mode]).append(cell(r, getattr(r, column)))
        out.append(f"**{title}**\n\n" + markdown_table(headers, list(rows.values())))
    if notes:
        out.append("\n".join(f"[{i}] {note}" for i, note in enumerate(notes, 1)))
    return "\n\n".join(out)


def write_csv(results: list[Result], cfg: BenchAttentionConfig, device: torch.device, path: Path) -> None:
    """One row per case, with the settings repeated so files from several runs can be concatenated."""
    settings = {
        "device": str(device), "dtype": cfg.dtype, "compile": cfg.compile, "batch_size": cfg.batch_size,
        "n_head": cfg.n_head, "head_dim": cfg.head_dim, "repeats": cfg.repeats,
    }
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*settings, *asdict(results[0])])
        writer.writeheader()
        for r in results:
            writer.writerow({**settings, **{k: ("" if v is None else v) for k, v in asdict(r).items()}})


def plot(results: list[Result], metric: str, title: str, path: Path) -> None:
    """Time or memory against sequence length, log-log, one line per kernel, one panel per mode."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    field, label = ("median_ms", "median ms per call") if metric == "time" else ("peak_mib", "peak MiB")
    modes = list(dict.fromkeys(r.mode for r in results))
    kernels = list(dict.fromkeys(r.kernel for r in results))
    seq_lens = sorted({r.seq_len for r in results})
    colors = {k: f"C{i}" for i, k in enumerate(kernels)}  # one colour per kernel in every panel
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes) + 1.2, 3.6), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, mode in zip(axes[0], modes):
        for kernel in kernels:
            points = [(r.seq_len, getattr(r, field)) for r in results if r.kernel == kernel and r.mode == mode]
            points = [(t, y) for t, y in points if y is not None and y > 0]
            if points:  # a kernel with no figure in this mode (e.g. no backward) is left out of the panel
                ax.plot(*zip(*points), marker="o", ms=3, color=colors[kernel], label=kernel)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(seq_lens, [str(t) for t in seq_lens])  # the measured lengths, written out
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_title(mode, fontsize=9)
        ax.set_xlabel("sequence length T")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(label)
    handles = [plt.Line2D([], [], color=colors[k], marker="o", ms=3, label=k) for k in kernels]
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=90)
    plt.close(fig)
