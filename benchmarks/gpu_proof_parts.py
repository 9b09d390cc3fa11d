"""The parts of the GPU proof (benchmarks.gpu_proof): each checks one thing issue 30 asks of a GPU and returns its
figures as plain data, with a status: ok, fail or skipped (and why).

Each runs at the sizes of a ``Sizes`` preset: GPT-2 124M on a GPU, or the dry run's tiny models on a CPU. They call
the library the scripts call (the Trainer, the training benchmark, the arena, decoding), without Hydra.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gpt import GPT
from gpt import kernels as attention
from gpt.arena.arena import presets
from gpt.bench.decode_hf import hf_greedy, hf_twin, ours_greedy
from gpt.data.config import DataConfig
from gpt.device import DeviceConfig
from gpt.errors import ConfigError
from gpt.model.config import ModelConfig
from gpt.train import metrics
from gpt.train.config import RunConfig, TrainConfig


@dataclass
class Sizes:
    """What every part runs at."""

    device: str
    kernel_model: dict  # the float64 checks' model (each design's options are added)
    kernel_batch: int
    train_model: dict  # the benchmark-against-loop shape
    batches: list[int]
    precision: str
    compile: bool
    bench_steps: int
    loop_steps: int
    log_interval: int
    decode_model: dict
    decode_tokens: int
    flex_model: dict
    flex_steps: int
    kernel_designs: list[str] | None = None  # the designs the kernels part checks (None: every arena preset)
    arena_variants: list[str] = field(default_factory=lambda: list(presets()))
    arena_tokens: int = 16_384
    data: str = "stdlib"  # stdlib: this Python's standard library as characters; tiny: a small corpus written here


GPT2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, dropout=0.0, bias=True)
GPU = Sizes(device="cuda", kernel_model=dict(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=96),
            kernel_batch=2,
            train_model=GPT2, batches=[16, 32], precision="bf16", compile=True, bench_steps=20, loop_steps=50,
            log_interval=10, decode_model=GPT2, decode_tokens=100,
            flex_model=dict(n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=512), flex_steps=30)
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=96, dropout=0.0, bias=True)
DRY = Sizes(device="cpu", kernel_model=dict(n_layer=1, n_head=4, n_embd=32, block_size=20, vocab_size=64),
            kernel_batch=1,
            train_model=TINY, batches=[4], precision="fp32", compile=False, bench_steps=3, loop_steps=6,
            log_interval=2, decode_model=TINY, decode_tokens=8, flex_model=dict(TINY, vocab_size=64), flex_steps=0,
            kernel_designs=["gpt2", "window", "mqa"],  # the pipeline; tests/designs/test_designs.py checks every design
            arena_variants=["gpt2", "rope"], arena_tokens=256, data="tiny")
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # worst |logits - float64| / max |float64 logits|
GRAD_TOLERANCE = 1e-3  # the same for fp32 gradients, over the largest gradient of any parameter


def status(ok: bool) -> str:
    return "ok" if ok else "fail"


def designs(names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The designs to check (``names``, or every arena preset), without the kernel a preset picks (every kernel is
    tried)."""
    return {name: {k: v for k, v in options.items() if k != "attention"} for name, options in presets().items()
            if names is None or name in names}


# --- every kernel and design against float64 -------------------------------------------------------------------

def kernels(s: Sizes, out: Path) -> dict[str, Any]:
    """Each design x each kernel: logits (fp32, and bf16 on a GPU) and fp32 gradients on the device against the same
    weights in float64 on the CPU with the manual kernel (the formula written out); a kernel lacking a design's
    option: n/a."""
    rows = []
    for design, options in designs(s.kernel_designs).items():
        reference = None
        for kernel in attention.available():
            try:
                config = ModelConfig(**{**s.kernel_model, **options, "attention": kernel}).build(
                    s.kernel_model["vocab_size"])
            except ConfigError as err:
                rows.append({"design": design, "kernel": kernel, "status": "n/a", "why": str(err).split(":")[0]})
                continue
            reference = reference or float64_reference(config, s.kernel_batch)
            try:
                cell = kernel_cell(config, reference, s)
            except Exception as err:  # one cell that cannot run (a compiler's refusal) must not hide the others
                cell = {"status": "fail", "why": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"}
            rows.append({"design": design, "kernel": kernel, **cell})
    checked = [r for r in rows if r["status"] != "n/a"]
    worst = {key: max((r[key] for r in checked if r.get(key) is not None), default=None)
             for key in ("fp32", "bf16", "grad")}
    return {"status": status(all(r["status"] == "ok" for r in checked)), "cells": len(checked),
            "not_applicable": len(rows) - len(checked), "worst": worst, "rows": rows}


def float64_reference(config, batch: int) -> dict[str, Any]:
    """A seeded model of ``config`` in float64 on the CPU with the manual kernel: its weights, an input, the logits
    and every parameter's gradient of the loss."""
    torch.manual_seed(0)
    model = GPT(replace(config, attention="manual", attention_backend=None)).double()
    x = torch.randint(0, config.vocab_size, (batch, config.block_size), generator=torch.Generator().manual_seed(1))
    logits, loss = model(x, x)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    return {"state": {k: v.float() for k, v in model.state_dict().items()}, "x": x, "logits": logits.detach(),
            "grads": grads, "scale": logits.abs().max().item(),
            "grad_scale": max(g.abs().max().item() for g in grads if g is not None)}


def kernel_cell(config, reference: dict[str, Any], s: Sizes) -> dict[str, Any]:
    """One kernel's errors against the float64 reference, relative to the reference's largest logit (gradient)."""
    device = torch.device(s.device)
    trains = attention.spec(config.attention).trains(device.type)
    x, row = reference["x"].to(device), {}
    for precision in ("fp32", "bf16") if device.type == "cuda" else ("fp32",):
        model = GPT(config).to(device)
        model.load_state_dict(reference["state"])
        with torch.set_grad_enabled(trains), torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16"):
            logits, loss = model(x, x)
        row[precision] = (logits.double().cpu() - reference["logits"]).abs().max().item() / reference["scale"]
        if trains:
            loss.backward()
            grads = [p.grad for p in model.parameters()]
        if trains and precision == "fp32":
            row["grad"] = max((g.double().cpu() - r).abs().max().item() / reference["grad_scale"]
                              for g, r in zip(grads, reference["grads"]) if r is not None)
        elif trains:
            row["bf16_grads_finite"] = all(torch.isfinite(g).all().item() for g in grads if g is not None)
    ok = all(row[p] <= TOLERANCE[p] for p in TOLERANCE if p in row)
    ok = ok and row.get("grad", 0.0) <= GRAD_TOLERANCE and row.get("bf16_grads_finite", True)
    return {**row, "status": status(ok), "backward": "checked" if trains else f"none on {device.type}"}


# --- the training benchmark and the real loop, side by side ------------------------------------------------------

def data_config(s: Sizes, out: Path) -> DataConfig:
    """stdlib: this Python's standard library, one token per character (no download); tiny: a corpus written here."""
    root = out / "data"
    if s.data == "stdlib":
        return DataConfig(name="stdlib_char", source="stdlib", root=str(root))
    corpus = out / "corpus"
    if not corpus.exists():  # written once: preparation reuses the data while the corpus is unchanged
        corpus.mkdir(parents=True)
        for i in range(8):
            text = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(60))
            (corpus / f"m{i}.py").write_text(text)
    return DataConfig(name="tiny", source="path", path=str(corpus), root=str(root))


def loop_run(s: Sizes, out: Path, name: str, model: dict, batch: int, steps: int, backend: str | None = None,
             kernel: str = "sdpa", eval_interval: int | None = None, sample_tokens: int = 0) -> dict[str, Any]:
    """The real training loop (gpt.train.trainer.train, what scripts/train.py runs) for ``steps`` steps; its
    steady tokens/s is the median of its logged windows (log_interval steps each) after the first (compilation)."""
    from gpt.train.trainer import train

    run_dir = out / "runs" / name
    run = RunConfig(model=ModelConfig(**model, attention=kernel, attention_backend=backend), data=data_config(s, out),
                    device=DeviceConfig(s.device), precision=s.precision, out_dir=str(run_dir),
                    train=TrainConfig(max_iters=steps, batch_size=batch, eval_interval=eval_interval or steps,
                                      eval_iters=2, log_interval=s.log_interval, sample_tokens=sample_tokens,
                                      compile=s.compile, warmup_iters=min(10, steps)))
    summary = train(run, run_dir, log=lambda line: None, script="scripts/gpu_proof.sh")
    windows = logged(run_dir, "tokens_per_sec")[1:]
    rate = statistics.median(windows) if windows else summary.tokens_per_sec
    return {"tokens_per_s": rate, "windows": windows, "final_val_loss": summary.final_val_loss, "steps": summary.step}


def logged(run_dir: Path, tag: str) -> list[float]:
    """A scalar's values in a run's TensorBoard log, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [e.value for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def train_speed(s: Sizes, out: Path) -> dict[str, Any]:
    """bench_train's step and the real loop at each batch size (same model, precision, compile), and the loop with
    attention.backend=flash pinned (issue 30: pinning halved the compiled loop's speed)."""
    from gpt.bench.train import measure
    from gpt.model.config import GPTConfig

    config = GPTConfig(**s.train_model)
    with torch.device("meta"):
        n_params = GPT(config).num_params()
    peak = metrics.peak_flops(torch.device(s.device), s.precision)
    rows = []
    for batch in s.batches:
        bench = measure(config.to_dict(), batch, config.block_size, s.precision, s.compile, s.device,
                        warmup=3, steps=s.bench_steps, learning_rate=6e-4)
        loop = loop_run(s, out, f"loop_b{batch}", s.train_model, batch, s.loop_steps)
        rows.append(speed_row(f"batch {batch}", bench["tokens_per_s"], loop["tokens_per_s"], config, n_params, peak))
    pinned = loop_run(s, out, f"loop_b{s.batches[0]}_flash", s.train_model, s.batches[0], s.loop_steps, "flash")
    unpinned = rows[0]["loop_tokens_per_s"]
    ok = all(r["loop_vs_bench"] >= 0.97 for r in rows) and pinned["tokens_per_s"] >= 0.9 * unpinned
    return {"status": status(ok) if s.device == "cuda" else "ok", "rows": rows,
            "pinned_flash_tokens_per_s": pinned["tokens_per_s"],
            "pinned_vs_unpinned": pinned["tokens_per_s"] / unpinned,
            "targets": "loop within 3% of the bench; pinning flash not slower than torch's choice (within 10%)"}


def speed_row(name: str, bench: float, loop: float, config, n_params: int, peak: float | None) -> dict[str, Any]:
    def mfu(rate: float) -> float | None:
        return metrics.mfu(rate, config, n_params, peak)

    return {"shape": name, "bench_tokens_per_s": bench, "loop_tokens_per_s": loop, "loop_vs_bench": loop / bench,
            "bench_mfu": mfu(bench), "loop_mfu": mfu(loop)}


# --- decoding against transformers ---------------------------------------------------------------------------------

def decode(s: Sizes, out: Path) -> dict[str, Any]:
    """Greedy decoding of the same random weights, fp32 and bf16: this project (SDPA left to torch, then a fused
    backend pinned: flash, or memory-efficient for fp32 on CUDA, which CUDA's flash does not take) against transformers'
    GPT2LMHeadModel; ms per token and whether the tokens agree."""
    from gpt.model.config import GPTConfig

    device = torch.device(s.device)
    torch.manual_seed(0)
    config = GPTConfig(**s.decode_model)
    model = GPT(config).to(device).eval()
    hf = hf_twin(model)
    prompt = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        row: dict[str, Any] = {"precision": precision}
        # CUDA's flash kernel takes only half precision (the CPU's takes fp32 too, and the CPU has no efficient one)
        backend = "efficient" if device.type == "cuda" and dtype == torch.float32 else "flash"
        pinned = GPT(replace(config, attention_backend=backend)).to(device).eval()  # the same weights, pinned
        pinned.load_state_dict(model.state_dict())
        row["pinned_backend"] = backend
        for label, ours in (("ours", model), ("ours_pinned", pinned)):
            ours.to(dtype)
            row[label + "_ms"], tokens = time_decode(lambda m=ours: ours_greedy(m, prompt, s.decode_tokens), device,
                                                     s.decode_tokens)
            row.setdefault("tokens", tokens)
        if hf is not None:
            hf.to(dtype)
            row["transformers_ms"], hf_tokens = time_decode(lambda: hf_greedy(hf, prompt, s.decode_tokens), device,
                                                            s.decode_tokens)
            row["same_tokens_as_transformers"] = agreement(row["tokens"], hf_tokens)
            row["speedup_vs_transformers"] = row["transformers_ms"] / row["ours_ms"]
        del row["tokens"]
        rows.append(row)
    fp32, bf16 = rows
    ok = bf16["ours_ms"] <= 1.1 * fp32["ours_ms"]
    if hf is not None:
        ok = ok and fp32["same_tokens_as_transformers"] == 1.0 and bf16["speedup_vs_transformers"] >= 1.5
    result = {"status": status(ok) if s.device == "cuda" else "ok", "rows": rows, "new_tokens": s.decode_tokens,
              "targets": "bf16 not slower than fp32; fp32 tokens equal transformers'; bf16 at least 1.5x transformers"}
    if hf is None:
        result["note"] = "transformers is not installed: this project's side only (see scripts/gpu_proof.sh --wheels)"
    return result


def time_decode(fn, device: torch.device, n: int) -> tuple[float, list[int]]:
    """ms per token of fn (after one warm-up call), and its tokens."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    tokens = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / n, tokens


def agreement(a: list[int], b: list[int]) -> float:
    """The fraction of the tokens before the first difference (1.0: identical)."""
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same / max(len(a), 1)


# --- FlexAttention training ------------------------------------------------------------------------------------------

def flex(s: Sizes, out: Path) -> dict[str, Any]:
    """attention=flex: on a GPU the real loop trains it compiled, with evaluations and samples between steps; every
    part of it must stay on the compiled kernels (no fallback warning, each compiled function under torch's recompile
    limit). On a CPU, which has no flex backward, the same evaluation and sampling calls through the compiled path."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from gpt.kernels import flex as flex_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if s.device == "cuda":
            result = loop_run(s, out, "flex", s.flex_model, 16, s.flex_steps, kernel="flex",
                              eval_interval=max(1, s.flex_steps // 3), sample_tokens=32)
        else:
            flex_kernel.COMPILED_ON, flex_kernel.COMPILER = ("cpu",), "eager"
            result = {"training": "none on cpu (no flex backward): evaluation and sampling only"}
            flex_forward_calls(s)
    fallbacks = [str(w.message)[:200] for w in caught if "flex_attention called without torch.compile" in str(w.message)
                 or "recompile_limit" in str(w.message)]
    variants = {name: len(_debug_get_cache_entry_list(fn.__code__))
                for name, fn in (("whole sequences", flex_kernel.flex_full), ("decode steps", flex_kernel.flex_cached))}
    ok = not fallbacks and all(0 < n < 8 for n in variants.values())
    return {"status": status(ok), "compiled_variants": variants, "fallback_warnings": fallbacks, **result}


def flex_forward_calls(s: Sizes, rounds: int = 1) -> None:
    """What training asks of attention besides its own steps: evaluations (no_grad) between forwards with grad
    enabled, then samples (prompts, decode steps, a context slide, a padded batch)."""
    from gpt.inference.decoding import generate, generate_batch
    from gpt.model.config import GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**s.flex_model, attention="flex")).eval().requires_grad_(False)
    x = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    for _ in range(rounds):
        with torch.no_grad():
            model(x, x)
        model(x, x)
        generate(model, x[:1, :4], model.config.block_size, temperature=0.0)
        generate_batch(model, [[1, 2], [3, 4, 5]], 3, temperature=0.0)


# --- the arena and FSDP ----------------------------------------------------------------------------------------------

def arena(s: Sizes, out: Path) -> dict[str, Any]:
    """The arena's quick mode with every design: each trains, is scored and decodes (gpt.arena.arena)."""
    from gpt.arena import arena as arena_bench

    cfg = arena_bench.ArenaConfig(
        model=ModelConfig(**{k: v for k, v in TINY.items() if k != "vocab_size"}), data=data_config(s, out),
        device=DeviceConfig(s.device), precision=s.precision, out_dir=str(out / "arena"),
        train=TrainConfig(batch_size=16, learning_rate=2e-3, warmup_iters=5, eval_iters=2, log_interval=50,
                          sample_tokens=0),
        arena=arena_bench.ArenaSettings(variants=list(s.arena_variants), tokens=s.arena_tokens, quick=True,
                                        decode_tokens=16))
    rows = arena_bench.run(cfg, log=lambda line: None)
    failed = {r["variant"]: r["error"] for r in rows if "error" in r}
    return {"status": status(not failed and len(rows) == len(s.arena_variants)), "failed": failed,
            "rows": [{k: r.get(k) for k in ("variant", "val_bpb", "tokens_per_s", "decode_tok_s")} for r in rows]}


def fsdp_run(s: Sizes, out: Path, world: int) -> dict[str, Any]:
    """FSDP2 over ``world`` processes (torchrun, one GPU each): a few steps of the real loop, sharded."""
    import socket
    import subprocess
    import sys

    run_dir = out / "runs" / "fsdp"
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--master_addr=127.0.0.1",
               f"--master_port={port}", "-m", "benchmarks.gpu_proof", "--fsdp-worker", str(out),
               *(["--dry-run"] if s.device == "cpu" else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    tokens = logged(run_dir, "tokens_per_sec")
    return {"status": status(done.returncode == 0 and bool(tokens)), "processes": world,
            "tokens_per_s": statistics.median(tokens[1:] or tokens) if tokens else None,
            **({"error": done.stderr[-2000:]} if done.returncode else {})}


def fsdp_worker(s: Sizes, out: Path) -> None:
    """One rank of fsdp_run: the real loop with train.fsdp=true."""
    from gpt.train.distributed import run_worker
    from gpt.train.trainer import train

    run_dir = out / "runs" / "fsdp"
    run = RunConfig(model=ModelConfig(**TINY), data=data_config(s, out), device=DeviceConfig(s.device),
                    precision=s.precision, out_dir=str(run_dir),
                    train=TrainConfig(max_iters=12, batch_size=8, eval_interval=12, eval_iters=2, log_interval=3,
                                      sample_tokens=0, fsdp=True))
    run_worker(lambda: train(run, run_dir, log=lambda line: None, script="scripts/gpu_proof.sh"))

