"""Small helpers shared by the benchmarks: wall-clock timers that sync the device, and markdown tables."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


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
