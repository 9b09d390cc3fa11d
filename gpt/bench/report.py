"""Small helpers shared by the benchmarks: wall-clock timers that sync the device, and markdown tables."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from gpt.inference.decoding import compiled_decode_step, cpu_compile_options


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def warm_up(fn: Callable[[], object], device: torch.device, calls: int) -> tuple[float, float]:
    """Call fn ``calls`` times (at least once) untimed by the benchmark: seconds of the first call (which may
    compile) and of all of them."""
    start = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - start
    for _ in range(calls - 1):
        fn()
    sync(device)
    return first, time.perf_counter() - start


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of fn over ``repeats`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def describe_device(device: torch.device, threads: int | None) -> str:
    """The device for a table's header: the GPU's name on CUDA, the thread count on a CPU."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device}, {threads or torch.get_num_threads()} threads"


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def interleaved(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int) -> dict[str, list[float]]:
    """Seconds of each fn in every repeat, the fns taking turns (after one untimed call each)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return times

def ratio(times: dict[str, list[float]], slow: str, fast: str) -> float:
    """The median over repeats of slow's time / fast's time in the same repeat."""
    return statistics.median(s / f for s, f in zip(times[slow], times[fast]))


def ratio_spread(times: dict[str, list[float]], slow: str, fast: str, digits: int = 2) -> str:
    """ratio's median with the lowest and highest repeat's ratio: "3.9x (3.1-4.4)" (a shared machine's noise)."""
    each = [s / f for s, f in zip(times[slow], times[fast])]
    return f"{statistics.median(each):.{digits}f}x ({min(each):.{digits}f}-{max(each):.{digits}f})"

def first_call_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call (a compiled step's first: its compilation and one decode)."""
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start

def compile_step(device: torch.device) -> Callable:
    """The compiled decode step (with the C++ wrapper on a CPU)."""
    return compiled_decode_step(**(cpu_compile_options() if device.type == "cpu" else {}))
